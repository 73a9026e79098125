"""Turn msprobe entry keys and nested items into :class:`Entry` records."""
from __future__ import annotations

import math
import re
import sys
from typing import Any

from ..records import BACKWARD, PARAM_GRAD, Entry, Leaf

# Module.<path>.<Class>.forward.<n>; the path may be empty when the dumped root is a wrapper.
_MODULE_RE = re.compile(r"^Module\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)\."
                        r"(?P<dir>forward|backward)\.(?P<call>\d+)$")
_PGRAD_RE = re.compile(r"^Module\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)\.parameters_grad(?:\.(?P<call>\d+))?$")
# L1 APIs put the call index before the direction: Functional.linear.14.forward
_API_RE = re.compile(r"^(?P<cls>[A-Za-z_][A-Za-z0-9_]*)\.(?P<path>.+)\.(?P<call>\d+)\.(?P<dir>forward|backward)$")


def parse_key(key: str) -> tuple[str, str, str, str, int] | None:
    """Split a dump key into (kind, path, class, direction, call index), or None."""
    # Paths and classes are interned: each module is called again and again (micro-batches, decode
    # steps, calls that do not fold), and its entries then share one copy of each.
    m = _MODULE_RE.match(key)
    if m:
        return ("module", sys.intern(m.group("path") or ""), sys.intern(m.group("cls")), sys.intern(m.group("dir")),
                int(m.group("call")))
    m = _PGRAD_RE.match(key)
    if m:
        return ("module", sys.intern(m.group("path") or ""), sys.intern(m.group("cls")), PARAM_GRAD,
                int(m.group("call") or 0))
    m = _API_RE.match(key)
    if m:
        return ("api", sys.intern(m.group("path")), sys.intern(m.group("cls")), sys.intern(m.group("dir")),
                int(m.group("call")))
    return None


def stat_value(v: Any) -> float | None:
    """A msprobe statistic as a float (None when absent or not a number)."""
    t = type(v)
    if t is float:
        return v
    if t is int:
        try:
            return float(v)
        except OverflowError:          # an integer beyond float range
            return math.inf if v > 0 else -math.inf
    if v is None:
        return None
    if t is bool:
        return float(v)
    if isinstance(v, str):
        # Some writers quote non-finite values; anything else is not a statistic.
        low = v.strip().lower()
        if low in ("nan", "inf", "+inf", "infinity", "-inf", "-infinity"):
            return float(low.replace("infinity", "inf"))
    return None


# A shape no tensor can have: torch reduces (and so msprobe summarises) tensors of at most 64
# dimensions, and counts elements in a signed 64-bit integer.
MAX_DIMS = 64
MAX_NUMEL = 2 ** 63 - 1


# Shapes seen so far, each kept once: a dump holds few distinct shapes and tens of thousands of
# leaves. Bounded, since the table outlives the dump.
_SHAPES: dict[tuple, tuple] = {}
_SHAPES_MAX = 4096


class ShapeError(ValueError):
    """A dumped shape that cannot be a tensor's; the loader names the file, entry and leaf."""


def _shape(v: Any) -> tuple[int, ...] | None:
    """A dumped shape as a tuple (None when absent or not a list); raises ShapeError for a list
    that no tensor has, so that no absurd count travels on into sizes and messages."""
    if type(v) is not list:
        return None
    if len(v) > MAX_DIMS:
        raise ShapeError(f"shape of {len(v)} dimensions (a tensor has at most {MAX_DIMS})")
    numel = 1
    for d in v:
        if type(d) is not int or d < 0:
            raise ShapeError(f"shape with dimension {str(d)[:40]!r}, not a non-negative integer")
        numel *= d
        if numel > MAX_NUMEL or d > MAX_NUMEL:
            raise ShapeError("shape of 2^63 elements or more")
    shape = tuple(v)
    # Looked up only once checked: 1.0 and True equal 1 and would find an integer shape.
    kept = _SHAPES.get(shape)
    if kept is not None:
        return kept
    if len(_SHAPES) < _SHAPES_MAX:
        _SHAPES[shape] = shape
    return shape


def _is_leaf(item: dict) -> bool:
    return "dtype" in item or "Max" in item or "shape" in item and "type" in item


def leaf_from_item(name: str, item: dict) -> Leaf:
    """Build a tensor :class:`Leaf` from a msprobe leaf object (missing fields become None)."""
    # Called once per tensor of a dump (millions in a large one): one constructor call, no loops.
    get = item.get
    dt, rg, ck, dn = get("dtype"), get("requires_grad"), get("md5"), get("data_name")
    try:
        shape = _shape(get("shape"))
    except ShapeError as exc:
        raise ShapeError(f"leaf {name}: {exc}") from None
    # A statistic is nearly always a float already: stat_value only for the rest.
    mx, mn, me, no = get("Max"), get("Min"), get("Mean"), get("Norm")
    if type(mx) is not float:
        mx = stat_value(mx)
    if type(mn) is not float:
        mn = stat_value(mn)
    if type(me) is not float:
        me = stat_value(me)
    if type(no) is not float:
        no = stat_value(no)
    # Names and dtypes repeat in every entry: interned, each is held once however many leaves name it.
    return Leaf(sys.intern(name), sys.intern(dt) if type(dt) is str else None, shape, mx, mn, me, no,
                rg if type(rg) is bool else None, ck if type(ck) is str else None,
                dn if type(dn) is str else None)


def flatten(prefix: str, item: Any, out: list[Leaf]) -> None:
    """Append the leaves of a nested msprobe item (lists, objects, scalars, nulls) to ``out``."""
    if item is None:
        return
    if isinstance(item, list):
        for i, sub in enumerate(item):
            flatten(f"{prefix}.{i}", sub, out)
        return
    if not isinstance(item, dict):
        return
    if _is_leaf(item):
        out.append(leaf_from_item(prefix, item))
        return
    if "type" in item and "value" in item and len(item) <= 3:
        v = item.get("value")
        if isinstance(v, (int, float, str, bool)) or v is None or isinstance(v, list):
            out.append(Leaf(name=prefix, value=v, is_tensor=False, dtype=str(item.get("type"))))
        return
    for k, sub in item.items():
        flatten(f"{prefix}.{k}", sub, out)


def build_entry(key: str, value: Any, order: int, parsed: tuple | None = None) -> Entry | None:
    """Parse one dump entry; None when the key matches no msprobe pattern. ``parsed``: the key's
    parse_key result, when the caller has it already."""
    parsed = parsed or parse_key(key)
    if parsed is None or not isinstance(value, dict):
        return None
    try:
        return _entry(key, value, order, parsed)
    except ShapeError as exc:
        raise ShapeError(f"entry {key}, {exc}") from None


def _entry(key: str, value: dict, order: int, parsed: tuple) -> Entry:
    kind, path, cls, direction, call = parsed
    entry = Entry(key=key, order=order, kind=kind, raw_path=path, cls=cls,
                  direction=direction, call=call)
    leaves: list[Leaf] = []
    if direction == PARAM_GRAD:
        for pname, item in value.items():
            sub = item[0] if isinstance(item, list) and item else item
            flatten(f"parameters_grad.{pname}", sub, leaves)
    elif direction == BACKWARD:
        flatten("input", value.get("input"), leaves)
        flatten("output", value.get("output"), leaves)
    else:
        args = value.get("input_args")
        if isinstance(args, list):
            entry.n_args = sum(1 for a in args if a is not None)
        flatten("input_args", args, leaves)
        kwargs = value.get("input_kwargs")
        if isinstance(kwargs, dict):
            for k, sub in kwargs.items():
                flatten(f"input_kwargs.{k}", sub, leaves)
        flatten("output", value.get("output"), leaves)
        params = value.get("parameters")
        if isinstance(params, dict):
            for k, sub in params.items():
                flatten(f"parameters.{k}", sub, leaves)
    entry.leaves = leaves
    return entry
