"""Write the four outputs: JSON (machine-readable, with schema_version) and CSV/markdown views.

Files are written to a temporary name inside the output folder and renamed into place, so
an interrupted run never leaves a half-written output and nothing outside the folder is
touched.
"""
from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

from . import atomicfile
from .safetext import CSV_RISKY_FIRST, csv_cell

SCHEMA_VERSION = "2.1"   # 2.1: --logprob-temperature (output_3 logprob.temperature, tokens at T)
# output_4 alone: 2.2 adds ``vocabulary`` (references/output_schemas.md, "Versioning").
OUTPUT_4_SCHEMA_VERSION = "2.2"
# output_3 alone: 2.2 adds ``reference.<side>.unpaired_parameters`` and the routing records'
# ``expert_weights``; 2.3 its value naming the other side (references/output_schemas.md, "Versioning").
OUTPUT_3_SCHEMA_VERSION = "2.3"
# Every output file name of the two skills: the compare skill writes the first eight, the
# root-cause skill output_5's JSON, and the agent output_5's markdown from it.
COMPARE_OUTPUTS = ("output_1_key_mapping.json", "output_1_key_mapping.csv", "output_2_mapping.json",
                   "output_2_mapping.csv", "output_3_value_compare.json", "output_3_value_compare.csv",
                   "output_4_module_analysis.json", "output_4_module_analysis.md")
OUR_OUTPUTS = COMPARE_OUTPUTS + ("output_5_root_cause_report.json", "output_5_root_cause_report.md")
# JSON outputs whose compact form is longer than this stay compact (see write_json).
INDENT_MAX_CHARS = 2 << 20
# Lists and dicts near the top of a large JSON output holding more items than this are written
# one item per line (see _pieces); shorter ones stay on their parent's line.
LINE_ITEMS = 8


# Exact types clean() returns unchanged.
_KEPT = frozenset((str, int, bool, type(None)))


class Records:
    """A list of output records made one at a time as it is read (written as a JSON list): a
    record made only to be written is then never held with all the others."""
    __slots__ = ("_make", "_items")

    def __init__(self, make: Callable[[Any], Any], items: Sequence):
        self._make, self._items = make, items

    def __iter__(self) -> Iterator:
        return map(self._make, self._items)

    def __len__(self) -> int:
        return len(self._items)


class Members(Mapping):
    """A dict of output members, each value made from its key when it is read (written as a JSON
    object): a large table of derived values (output_4 ``vocabulary.points``) is then never held
    whole; only its keys are."""
    __slots__ = ("_make", "_keys")

    def __init__(self, make: Callable[[str], Any], keys: Iterable[str]):
        self._make, self._keys = make, dict.fromkeys(keys)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        return self._make(key)

    def __contains__(self, key: object) -> bool:
        return key in self._keys        # Mapping's would make the value to find out

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


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
    if t is Members:
        return {k: clean(v) for k, v in obj.items()}
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
    if isinstance(obj, (list, tuple, Records)):
        return [clean(v) for v in obj]
    return obj


def write_atomic(path: Path, text: str | Iterable[str]) -> None:
    """Write ``text`` (a string, or its pieces in order) to ``path`` atomically (atomicfile), creating
    its folder; pieces are written as they come."""
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


_GETTERS: dict[type, Callable[[Any], tuple] | None] = {}


def _getter(cls: type) -> Callable[[Any], tuple] | None:
    """A function giving a dataclass's written fields' values as a tuple (operator.attrgetter: one
    C call per record instead of a getattr per field), once per class; None for a class that is
    not a dataclass."""
    try:
        return _GETTERS[cls]
    except KeyError:
        names = _written(cls)
        get = None if names is None else attrgetter(*names) if len(names) > 1 else (
            lambda obj, _names=names: tuple(getattr(obj, n) for n in _names))
        _GETTERS[cls] = get
        return get


def _fields(obj: Any) -> dict | list:
    """What the JSON encoder writes for a value it does not know: a Records' list, a dataclass's
    written fields."""
    t = type(obj)
    if t is Records:
        return list(obj)
    if t is Members:
        return dict(obj.items())
    get = _getter(t)
    if get is None:
        raise TypeError(f"not JSON serialisable: {t.__name__}")
    return dict(zip(_WRITTEN[t], get(obj)))


def _encode(body: dict, **opts) -> str:
    try:
        # Fast path; it refuses NaN/Infinity, which only then need the slow pass through clean().
        return json.dumps(body, default=_fields, ensure_ascii=False, allow_nan=False, **opts)
    except ValueError:
        return json.dumps(clean(body), ensure_ascii=False, allow_nan=False, **opts)


_COMPACT = json.JSONEncoder(default=_fields, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_COMPACT_CLEANED = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _compact(obj: Any) -> str:
    """Compact JSON of one value; only a value holding NaN/Infinity goes through clean()."""
    try:
        return _COMPACT.encode(obj)
    except ValueError:
        return _COMPACT_CLEANED.encode(clean(obj))


def _pieces(obj: Any, depth: int, top: bool = False) -> Iterator[str]:
    """The compact JSON of ``obj`` (the text json.dumps gives with separators (",", ":")) in
    pieces, with a newline before each member of the ``top`` object and before each item of a
    list or dict of more than LINE_ITEMS items (a Records or Members always) ``depth`` levels down
    or less.

    Each item of such a list (a record) is encoded alone, as is each member of a dict, so the text
    is never whole in memory and a NaN in one record sends that record alone, not the whole
    document, through clean(). Newlines stand only between tokens: removing them gives the
    compact text back, and a reader finds one record per line.
    """
    t = type(obj)
    if depth and (t is Members or t is dict and all(type(k) is str for k in obj)):
        if not obj:
            yield "{}"
            return
        nl = "\n" if top or t is Members or len(obj) > LINE_ITEMS else ""
        sep = "{" + nl
        for k, v in obj.items():
            yield sep + _COMPACT.encode(k) + ":"
            yield from _pieces(v, depth - 1)
            sep = "," + nl
        yield nl + "}"
    elif depth and (t is Records or (t is list or t is tuple) and len(obj) > LINE_ITEMS):
        sep = "[\n"
        for v in obj:
            yield sep + _compact(v)
            sep = ",\n"
        yield "[]" if sep == "[\n" else "\n]"
    else:
        yield _compact(obj)


def write_json(path: Path, doc: dict, version: str = SCHEMA_VERSION) -> None:
    """Write a JSON document with ``schema_version`` (``version``) first: indented when small,
    one record per line when large.

    Indentation makes a file an agent reads whole readable; above INDENT_MAX_CHARS nobody reads it
    whole, it grows by about 40% and takes 3-7x longer to encode (indentation leaves the C encoder),
    so it is written compact with a line per member of the document and per record of its long
    lists (_pieces; measurements in references/output_schemas.md). That form is written as it is
    encoded (the text of a large output is never held whole); a document that turns out small is
    then written again, indented.
    """
    body = {"schema_version": version, **{k: v for k, v in doc.items() if k != "schema_version"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomicfile.open_text(path) as fh:
        size = 0
        for piece in _pieces(body, 3, top=True):
            fh.write(piece)
            size += len(piece)
        if size <= INDENT_MAX_CHARS:
            fh.seek(0)
            fh.truncate()
            fh.write(_encode(body, indent=1))
        fh.write("\n")


def write_csv(path: Path, header: list[str], rows: Iterable[list[Any]]) -> None:
    """Write a CSV view row by row (non-finite numbers as 'NaN'/'Infinity', lists joined with ';').

    Cells a spreadsheet would run as formulas get a leading ``'`` (safetext.csv_cell).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomicfile.open_text(path) as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(map(_csv_row, rows))


def _csv_row(row: Iterable[Any]) -> list:
    """The written cells of one row: csv_cell(_cell(v)) of each.

    A large output has a million cells, and a function call per cell was most of the CSV's writing
    time: the commonest cells are decided inline on their exact type. A string goes to csv_cell only
    when its first character is one csv_cell may escape (safetext.CSV_RISKY_FIRST); whole numbers,
    booleans and None are the csv writer's own (it writes None as the empty cell); a finite float
    is formatted here; anything else (lists, non-finite or numpy numbers) takes the full path.
    """
    return [(c if c[:1] not in CSV_RISKY_FIRST else csv_cell(c)) if (t := type(c)) is str
            else c if t is int or t is bool or c is None
            else f"{c:.6g}" if t is float and c - c == 0.0
            else csv_cell(_cell(c)) for c in row]


def _cell(v: Any) -> Any:
    t = type(v)
    if t is str or t is int:        # clean() returns these unchanged
        return v
    if t is list or t is tuple:
        # Items decided on their exact type first (module names, dtypes, shape numbers): what
        # _cell gives for each of them, without a call per item.
        return ";".join([x if (tx := type(x)) is str else str(x) if tx is int or tx is bool
                         else "" if x is None else str(_cell(x)) for x in v])
    v = clean(v)
    if v is None:
        return ""
    if isinstance(v, list):
        return ";".join(str(_cell(x)) for x in v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


class _CleanView(Mapping):
    """A record (a dataclass or a dict) read as the dict clean() makes of it, each field cleaned
    when it is read: the HTML report reads a few fields of every result and module, and a cleaned
    copy of them all was as large as the results themselves."""
    __slots__ = ("_obj", "_names")

    def __init__(self, obj: Any, names: Collection[str]):
        self._obj, self._names = obj, names

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        obj = self._obj
        v = obj[name] if type(obj) is dict or type(obj) is Members else getattr(obj, name)
        # Most fields are text, whole numbers or finite floats, which clean() keeps: no call for
        # them; a nested dict is a view in turn (the report reads a part of a module's points).
        if (tv := type(v)) in _KEPT or tv is float and v - v == 0.0:
            return v
        return _item_view(v) if tv is dict else clean(v)

    def get(self, name: str, default: Any = None) -> Any:
        """Mapping.get without its exception: the report asks for absent fields often."""
        return self[name] if name in self._names else default

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def clean_view(obj: Any) -> Any:
    """clean() whose list items are left as read-only mappings cleaned on access (_CleanView):
    what a reader of a few fields (htmlreport.pieces) gets, without a cleaned copy of every record."""
    t = type(obj)
    if t is dict:
        return {k if type(k) is str else str(k): clean_view(v) for k, v in obj.items()}
    if t is list or t is tuple or t is Records:
        return [_item_view(v) for v in obj]
    if t is Members:
        return _CleanView(obj, obj)
    return clean(obj)


def _item_view(obj: Any) -> Any:
    t = type(obj)
    if t is dict and all(type(k) is str for k in obj):
        return _CleanView(obj, obj)
    names = _written(t)
    return clean(obj) if names is None else _CleanView(obj, _name_set(t))


_NAME_SETS: dict[type, dict[str, None]] = {}


def _name_set(cls: type) -> dict[str, None]:
    """A dataclass's written field names in order, as dict keys: a view looks a name up on every
    read (a tuple was a scan of up to thirty names each time)."""
    names = _NAME_SETS.get(cls)
    if names is None:
        names = _NAME_SETS[cls] = dict.fromkeys(_written(cls))
    return names


def fmt(x: Any) -> str:
    """Short human form of a number for markdown tables."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "inf" if x > 0 else ("nan" if math.isnan(x) else "-inf")
        return f"{x:.3g}"
    return str(x)
