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
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "2.0"
_UMASK = os.umask(0)
os.umask(_UMASK)


def clean(obj: Any) -> Any:
    """JSON-safe copy: dataclasses to dicts, non-finite floats to the strings 'NaN'/'Infinity'.

    One pass without ``dataclasses.asdict``, whose deep copies dominated the writing time of
    large dumps.
    """
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None:
        return {name: clean(getattr(obj, name)) for name in fields}
    return obj


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # Names read from damaged files can hold lone surrogates; write them as escapes.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)   # mkstemp makes 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _fields(obj: Any) -> dict:
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is None:
        raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
    return {name: getattr(obj, name) for name in fields}


def write_json(path: Path, doc: dict) -> None:
    """Write a JSON document with ``schema_version`` first."""
    body = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in doc.items() if k != "schema_version"}}
    # Compact: these files are read by programs (the CSV and markdown views are for people).
    opts = {"ensure_ascii": False, "allow_nan": False, "separators": (",", ":")}
    try:
        # Fast path in the C encoder; it refuses NaN/Infinity, which only then need the slow pass.
        text = json.dumps(body, default=_fields, **opts)
    except ValueError:
        text = json.dumps(clean(body), **opts)
    write_atomic(path, text + "\n")


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    """Write a CSV view (non-finite numbers as 'NaN'/'Infinity', lists joined with ';')."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for row in rows:
        w.writerow([_cell(c) for c in row])
    write_atomic(path, buf.getvalue())


def _cell(v: Any) -> Any:
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
