"""Write the four outputs: JSON (machine-readable, with schema_version) and CSV/markdown views.

Files are written to a temporary name inside the output folder and renamed into place, so
an interrupted run never leaves a half-written output and nothing outside the folder is
touched.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from . import atomicfile
from .safetext import csv_cell

SCHEMA_VERSION = "2.1"   # 2.1: --logprob-temperature (output_3 logprob.temperature, tokens at T)
# output_4 alone: 2.2 adds ``vocabulary`` (references/output_schemas.md, "Versioning").
OUTPUT_4_SCHEMA_VERSION = "2.2"
# output_3 alone: 2.2 adds ``reference.<side>.unpaired_parameters`` and the routing records'
# ``expert_weights`` (references/output_schemas.md, "Versioning").
OUTPUT_3_SCHEMA_VERSION = "2.2"
# Every output file name of the two skills: the compare skill writes the first eight, the
# root-cause skill output_5's JSON, and the agent output_5's markdown from it.
COMPARE_OUTPUTS = ("output_1_key_mapping.json", "output_1_key_mapping.csv", "output_2_mapping.json",
                   "output_2_mapping.csv", "output_3_value_compare.json", "output_3_value_compare.csv",
                   "output_4_module_analysis.json", "output_4_module_analysis.md")
OUR_OUTPUTS = COMPARE_OUTPUTS + ("output_5_root_cause_report.json", "output_5_root_cause_report.md")
# JSON outputs whose compact form is longer than this stay compact (see write_json).
INDENT_MAX_CHARS = 2 << 20


# Exact types clean() returns unchanged.
_KEPT = frozenset((str, int, bool, type(None)))


def clean(obj: Any) -> Any:
    """JSON-safe copy: dataclasses to dicts, non-finite floats to the strings 'NaN'/'Infinity'.

    One pass without ``dataclasses.asdict``, whose deep copies dominated the writing time of
    large dumps. The exact built-in types are dispatched on ``type()`` first: they are nearly every
    value of a large output, and an ``isinstance`` chain per value was a third of its writing time.
    """
    t = type(obj)
    if t is float:
        if obj - obj == 0.0:        # finite (inf - inf and NaN - NaN are NaN)
            return obj
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if t is str or t is int or obj is None or t is bool:
        return obj
    # Members that are kept as they are (text, whole numbers, finite floats) are not recursed into:
    # most members of a large output are such, and a call per member was most of clean()'s time.
    if t is dict:
        return {k if type(k) is str else str(k):
                v if (tv := type(v)) in _KEPT or tv is float and v - v == 0.0 else clean(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [v if (tv := type(v)) in _KEPT or tv is float and v - v == 0.0 else clean(v) for v in obj]
    names = _written(t)
    if names is not None:
        return {name: v if (tv := type(v := getattr(obj, name))) in _KEPT or tv is float and v - v == 0.0
                else clean(v) for name in names}
    return _clean_subclass(obj)


def _clean_subclass(obj: Any) -> Any:
    """clean() of a value whose type is not exactly a built-in one (numpy floats, subclasses)."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (atomicfile.write_text), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomicfile.write_text(path, text)


def remove_stale(out_dir: Path, written: tuple[str, ...]) -> None:
    """Remove the files of OUR_OUTPUTS in ``out_dir`` that this run did not write.

    A run owns its out-dir's output_* files, so that outputs of different runs never sit side by
    side; anything else in the folder (not one of these exact names, or not a plain file or
    link) is left alone.
    """
    for name in OUR_OUTPUTS:
        path = out_dir / name
        if name not in written and (path.is_symlink() or path.is_file()):
            path.unlink()


_WRITTEN: dict[type, tuple[str, ...] | None] = {}


def _written(cls: type) -> tuple[str, ...] | None:
    """The names of a dataclass's written fields (those without ``metadata={"written": False}``),
    once per class; None for a class that is not a dataclass."""
    try:
        return _WRITTEN[cls]
    except KeyError:
        fields = getattr(cls, "__dataclass_fields__", None)
        names = None if fields is None else tuple(n for n, f in fields.items() if f.metadata.get("written", True))
        _WRITTEN[cls] = names
        return names


def _record(obj: Any) -> dict | None:
    """A dataclass's fields as written; None for anything else."""
    names = _written(type(obj))
    return None if names is None else {name: getattr(obj, name) for name in names}


def _fields(obj: Any) -> dict:
    record = _record(obj)
    if record is None:
        raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
    return record


def _encode(body: dict, **opts) -> str:
    try:
        # Fast path; it refuses NaN/Infinity, which only then need the slow pass through clean().
        return json.dumps(body, default=_fields, ensure_ascii=False, allow_nan=False, **opts)
    except ValueError:
        return json.dumps(clean(body), ensure_ascii=False, allow_nan=False, **opts)


def write_json(path: Path, doc: dict, version: str = SCHEMA_VERSION) -> None:
    """Write a JSON document with ``schema_version`` (``version``) first: indented when small,
    compact when large.

    Indentation makes a file an agent reads whole readable; above INDENT_MAX_CHARS nobody reads it
    whole, it grows by about 40% and takes 3-7x longer to encode (indentation leaves the C encoder),
    so it stays one line (measurements in references/output_schemas.md).
    """
    body = {"schema_version": version, **{k: v for k, v in doc.items() if k != "schema_version"}}
    text = _encode(body, separators=(",", ":"))
    if len(text) <= INDENT_MAX_CHARS:
        text = _encode(body, indent=1)
    write_atomic(path, text + "\n")


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    """Write a CSV view (non-finite numbers as 'NaN'/'Infinity', lists joined with ';').

    Cells a spreadsheet would run as formulas get a leading ``'`` (safetext.csv_cell).
    """
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow([csv_cell(_cell(c)) for c in row])
    write_atomic(path, buf.getvalue())


def _cell(v: Any) -> Any:
    t = type(v)
    if t is str or t is int:        # clean() returns these unchanged
        return v
    v = clean(v)
    if v is None:
        return ""
    if isinstance(v, list):
        return ";".join(str(_cell(x)) for x in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def fmt(x: Any) -> str:
    """Short human form of a number for markdown tables."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "inf" if x > 0 else ("nan" if math.isnan(x) else "-inf")
        return f"{x:.3g}"
    return str(x)
