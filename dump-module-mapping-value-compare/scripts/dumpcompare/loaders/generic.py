"""Our own small JSON format, for dumpers other than msprobe (SGLang dumper, custom hooks).

Shape (see references/input_formats.md)::

    {"format": "dumpcompare-generic/1", "task": "statistics",
     "modules": [{"name": "model.layers.0.self_attn.q_proj", "class": "Linear",
                  "call": 0, "inputs": [leaf, ...], "kwargs": {"k": leaf},
                  "outputs": [leaf, ...], "parameters": {"weight": leaf}}, ...]}

``modules`` is in execution order of completion; a leaf is an object with ``dtype``,
``shape`` and ``max``/``min``/``mean``/``norm`` (msprobe capitalisation is accepted too),
optionally ``data_name`` for a tensor file beside the JSON.
"""
from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..records import FORWARD, Entry
from .msprobe import flatten

FORMAT_ID = "dumpcompare-generic/1"


def _normalise_leaf(item: Any) -> Any:
    if isinstance(item, dict) and ("dtype" in item or "shape" in item):
        fixed = dict(item)
        for low, cap in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
            if low in fixed and cap not in fixed:
                fixed[cap] = fixed.pop(low)
        return fixed
    if isinstance(item, list):
        return [_normalise_leaf(x) for x in item]
    if isinstance(item, dict):
        return {k: _normalise_leaf(v) for k, v in item.items()}
    return item


def entries_from_generic(doc: dict, path) -> list[Entry]:
    """Convert a generic-format document into entries; raise InputError when malformed."""
    mods = doc.get("modules")
    if not isinstance(mods, list):
        raise InputError(f"{path}: generic dump needs a 'modules' list")
    entries = []
    for i, m in enumerate(mods):
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise InputError(f"{path}: modules[{i}] needs a string 'name'")
        for member, kind in (("inputs", list), ("outputs", list), ("kwargs", dict), ("parameters", dict)):
            if m.get(member) is not None and not isinstance(m[member], kind):
                raise InputError(f"{path}: modules[{i}].{member} must be a {'list' if kind is list else 'object'}")
        cls = m.get("class") if isinstance(m.get("class"), str) else "Module"
        call = m.get("call", 0)
        call = call if isinstance(call, int) and not isinstance(call, bool) and call >= 0 else 0
        key = f"Module.{m['name']}.{cls}.{FORWARD}.{call}"
        e = Entry(key=key, order=i, kind="module", raw_path=m["name"], cls=cls,
                  direction=FORWARD, call=call)
        args = _normalise_leaf(m.get("inputs") or [])
        e.n_args = sum(1 for a in args if a is not None) if isinstance(args, list) else 0
        flatten("input_args", args, e.leaves)
        for k, v in (m.get("kwargs") or {}).items():
            flatten(f"input_kwargs.{k}", _normalise_leaf(v), e.leaves)
        flatten("output", _normalise_leaf(m.get("outputs") or []), e.leaves)
        for k, v in (m.get("parameters") or {}).items():
            flatten(f"parameters.{k}", _normalise_leaf(v), e.leaves)
        entries.append(e)
    return entries
