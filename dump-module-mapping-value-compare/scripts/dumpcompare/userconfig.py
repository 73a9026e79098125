"""Built-in YAML data files and users' overrides of them (always read with the safe loader)."""
from __future__ import annotations

import copy
import math
import re
from functools import lru_cache
from pathlib import Path

import yaml

from .containment import kind
from .errors import InputError


# libyaml's safe loader where pyyaml was built with it: the bundled naming profiles are parsed on
# every run, and the pure-Python parser spent about 0.3 s on them.
_BUNDLED_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=None)
def _parsed(path: str) -> dict:
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_BUNDLED_LOADER)  # noqa: S506 (a safe loader)


def builtin(path: Path) -> dict:
    """A bundled YAML file, parsed once per process; callers get their own copy."""
    return copy.deepcopy(_parsed(str(path)))


def read_user_yaml(path: str, what: str, like: dict | None = None) -> dict:
    """Read a user's YAML mapping with the safe loader, or raise InputError naming the file.

    With ``like`` (the built-in document it overrides) every value must have the type the
    built-in one has (see :func:`check_like`), so a bad file fails here, naming the key.
    """
    what_is = kind(Path(path))
    if what_is != "file":
        # A device or FIFO would be read until it ends, which /dev/zero never does.
        raise InputError(f"{path}: cannot read {what} (it is {'missing' if what_is == 'missing' else 'a ' + what_is})")
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read {what} ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise InputError(f"{path}: cannot read {what} (nested too deeply)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: {what} must be a YAML mapping, not {_shown(doc)}")
    if like is not None:
        problem = check_like(doc, like)
        if problem:
            key, msg = problem
            raise InputError(f"{path}: {what} key '{key}': {msg}")
    return doc


def _kind(value) -> str:
    """The kind a schema check compares: number, text, boolean, list, mapping or nothing."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(type(value), type(value).__name__)


def _shown(value) -> str:
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"the number {value}"
    return _kind(value)


def _numeric_text(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _record(items: list[dict]) -> tuple[dict, set]:
    """Schema of a list (or table) of mappings: every key any item has, and the keys all items have."""
    union: dict = {}
    for it in items:
        for k, v in it.items():
            union.setdefault(k, v)
    return union, set.intersection(*(set(it) for it in items))


def _missing(key: str, value, required: set) -> tuple[str, str] | None:
    lack = sorted(required - set(value)) if isinstance(value, dict) else []
    return (key, f"missing {', '.join(lack)}") if lack else None


# Keys that every built-in item happens to carry but that the code reads with a default
# (a tensor_parallel override without `leaf` applies to every leaf).
_OPTIONAL_KEYS = frozenset({"leaf"})


def check_like(doc, ref, key: str = "") -> tuple[str, str] | None:
    """First place where a user document does not have the shape of the built-in one, or None.

    The built-in document is the schema. A value must be of the kind of the built-in value
    (number, which must be finite; text; boolean; list; mapping). Items of a list are checked
    against all built-in items together, and keys every built-in item has are required. A new key
    in a mapping is checked only when the built-in values (two or more) are all of one kind, a
    table such as the dtype tolerances; when they are mappings with the same keys, the new one
    needs those keys too. Returns (dotted key, what is wrong).
    """
    if ref is None:
        return None
    number = isinstance(ref, (int, float)) and not isinstance(ref, bool)
    if _kind(doc) != _kind(ref) or (number and not math.isfinite(doc)):
        hint = " (YAML reads 1e-4 as text: write 1.0e-4)" if number and isinstance(doc, str) and _numeric_text(doc) else ""
        want = "a finite number" if number else _kind(ref)
        return key or "(top level)", f"expected {want}, found {_shown(doc)}{hint}"
    if isinstance(ref, dict):
        values = list(ref.values())
        table, required = None, set()
        if len(values) > 1 and len({_kind(v) for v in values}) == 1:
            table = values[0]
            if isinstance(table, dict):
                table, common = _record(values)
                required = common if all(set(v) == common for v in values) else set()
        for k, v in doc.items():
            sub = f"{key}.{k}" if key else str(k)
            problem = check_like(v, ref[k], sub) if k in ref else (
                check_like(v, table, sub) or _missing(sub, v, required))
            if problem:
                return problem
    elif isinstance(ref, list) and ref:
        item, required = _record(ref) if all(isinstance(r, dict) for r in ref) else (ref[0], set())
        required = required - _OPTIONAL_KEYS
        for i, v in enumerate(doc):
            sub = f"{key}[{i}]"
            problem = check_like(v, item, sub) or _missing(sub, v, required)
            if problem:
                return problem
    return None


def check_regex(path: str, what: str, key: str, pattern: str, groups: int = 0) -> re.Pattern:
    """Compile a user's regular expression, or raise InputError naming the file and the key."""
    try:
        rx = re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise InputError(f"{path}: {what} key '{key}': not a valid regular expression ({exc})") from None
    if rx.groups < groups:
        raise InputError(f"{path}: {what} key '{key}': the regular expression needs {groups} capturing group(s)")
    return rx


def merge(base: dict, extra: dict) -> dict:
    """Deep merge of a user override: maps merge key by key, lists are prepended (user rules
    are consulted first), anything else replaces the built-in value."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = v + out[k]
        else:
            out[k] = v
    return out
