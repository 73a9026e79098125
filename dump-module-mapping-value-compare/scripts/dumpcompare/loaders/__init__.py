"""The one loader: find a side's dump, stream its entries, and return a :class:`Dump`."""
from __future__ import annotations

import json
from pathlib import Path

from ..containment import LeadsOutside, resolve_within
from ..errors import InputError
from ..records import Dump, Entry
from .folding import CallFolder
from .generic import FORMAT_ID, entries_from_generic
from .jsonstream import StreamState, iter_entries
from .msprobe import ShapeError
from .shared import attribute
from .sglang_dumper import DumperPart, load_part

_KNOWN_TOP = {"task", "level", "framework", "dump_data_dir", "data"}
# msprobe's tasks (its config.json "task"): only statistics and tensor dump every module's values;
# the others write a dump.json for another purpose, whose entries are a subset or hold no values.
_COMPARED_TASKS = ("statistics", "tensor")
_OTHER_TASKS = {"overflow_check": "only the calls that overflowed", "nan_check": "only the calls that hit NaN/Inf",
                "structure": "the model structure without values", "acc_check": "an accuracy pre-check",
                "exception_dump": "only the calls that raised"}
_LEVELS = ("L0", "L1", "L2", "mix")
FORMATS = ("auto", "msprobe", "generic", "sglang")


def load_input(item, fold: bool = True) -> Dump:
    """Load one unit of input: a dump file (see :func:`load_path`) or a part of an SGLang dumper folder."""
    return load_part(item) if isinstance(item, DumperPart) else load_path(item, fold)


def load_path(path: Path, fold: bool = True) -> Dump:
    """Load one dump file (msprobe dump.json or the generic format), entry by entry.

    With ``fold`` the repeated calls of a module become one entry when they can (see folding.py).
    """
    if _looks_generic(path):
        return _load_generic(path)
    state = StreamState()
    folder = CallFolder(fold)
    try:
        for key, value in iter_entries(path, state, folder.take if fold else None):
            folder.add(key, value)
    except ShapeError as exc:
        raise InputError(f"{path}: {exc}") from None
    if not state.saw_data:
        raise InputError(_not_a_dump(path, state.header))
    entries, skipped, folded = folder.finish()
    notes: list[str] = []
    if not folded:
        entries = _last_of_each_key(entries, notes)
    for i, e in enumerate(entries):
        e.order = i
    hdr = state.header
    if not entries and skipped:
        raise InputError(f"{path}: no entry key follows the msprobe naming "
                         f"(first key: {skipped[0]!r})")
    dump = Dump(path=path, dump_dir=path.parent, fmt="msprobe",
                task=_str(hdr.get("task")), level=_str(hdr.get("level")),
                framework=_str(hdr.get("framework")), dump_data_dir=_str(hdr.get("dump_data_dir")),
                entries=entries, salvage=state.salvage, notes=notes, skipped_keys=skipped, folded=folded)
    dump.notes.extend(_header_notes(dump.task, dump.level))
    # construct.json serves only here (which block made each call of a shared module): not kept.
    dump.entries, shared = attribute(dump.entries, _read_construct(path.parent / "construct.json", dump))
    if shared:
        for i, e in enumerate(dump.entries):
            e.order = i
        dump.notes.extend(shared)
    return dump


def _header_notes(task: str | None, level: str | None) -> list[str]:
    """What a dump's task and level say about it when they are not those of a module dump."""
    notes = []
    if task in _OTHER_TASKS:
        notes.append(f"task {task!r}: msprobe writes {_OTHER_TASKS[task]} for this task, not every module's "
                     "values; compared as far as they go")
    elif task is not None and task not in _COMPARED_TASKS:
        notes.append(f"task {task!r} is not a msprobe dump task ({', '.join(_COMPARED_TASKS)}); "
                     "read as a statistics dump")
    if level is not None and level not in _LEVELS:
        notes.append(f"level {level!r} is not a msprobe level ({', '.join(_LEVELS)}); entries read by their keys")
    return notes


def _last_of_each_key(entries: list[Entry], notes: list[str]) -> list[Entry]:
    """JSON objects should not repeat keys; as with json.load, the last occurrence wins."""
    last = {e.key: i for i, e in enumerate(entries)}
    if len(last) == len(entries):
        return entries
    for i, e in enumerate(entries):
        if last[e.key] != i:
            notes.append(f"duplicate entry key {e.key!r}: kept the last occurrence")
    return [e for i, e in enumerate(entries) if last[e.key] == i]


def _str(v):
    return v if isinstance(v, str) else None


def _looks_generic(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(4096)
    return FORMAT_ID.encode() in head


def _load_generic(path: Path) -> Dump:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable generic dump ({' '.join(str(exc).split()) or 'nested too deeply'})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_ID:
        raise InputError(f"{path}: generic dump must be an object with format {FORMAT_ID!r}")
    try:
        entries = entries_from_generic(doc, path)
    except ShapeError as exc:
        raise InputError(f"{path}: {exc}") from None
    return Dump(path=path, dump_dir=path.parent, fmt="generic", task=_str(doc.get("task")),
                level="L0", framework=_str(doc.get("framework")), dump_data_dir=None, entries=entries)


# msprobe writes these beside dump.json; passed by mistake, they hold no tensor statistics.
_SIDE_FILES = {"construct.json": "module tree", "stack.json": "call stacks"}


def _not_a_dump(path: Path, header: dict) -> str:
    """The one-line error for a JSON file without msprobe's 'data' object."""
    if path.name in _SIDE_FILES:
        beside = path.with_name("dump.json")
        fix = (f"pass {beside} or its folder" if beside.is_file() else "pass the dump.json msprobe wrote beside it, "
               "or its folder")
        return f"{path}: this is msprobe's {path.name} ({_SIDE_FILES[path.name]}), not the dump; {fix}"
    keys = sorted(header)
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"{path}: not a msprobe dump: no 'data' object (top-level keys: {shown or 'none'})"


def _read_construct(path: Path, dump: Dump):
    if not path.is_file():
        return None
    try:
        resolve_within(path, path.parent.resolve())
    except LeadsOutside:
        # Module names from another run would describe this one.
        raise InputError(f"{path}: link leads outside the dump folder {path.parent.resolve()}; refused") from None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        dump.notes.append(f"{path.name} is unreadable; module tree taken from paths instead")
        return None
    return doc if isinstance(doc, dict) and doc else None
