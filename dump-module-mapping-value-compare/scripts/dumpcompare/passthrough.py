"""Pass-through modules: one-sided modules that hand their input on unchanged.

Megatron's local layer spec puts ``IdentityOp`` placeholders in every layer (``q_layernorm``,
``k_layernorm`` without qk-layernorm, ``pre_cross_attn_layernorm``, ...); dropout at inference
and ``nn.Identity`` do the same. Such a module is not an op: it can never be the missing or
extra op between two aligned modules, nor break a boundary (rl-consistency-analysis/references/
analysis_rules.md, "Pass-through modules are not ops"). Whether a module passes its input through
is read from its own dump entry, never from its name, so a placeholder that does compute
something is still caught.
"""
from __future__ import annotations

from dataclasses import replace

from .records import Entry, Leaf

_STATS = ("dtype", "shape", "max", "min", "mean", "norm")


def _tensors(entry: Entry, head: str) -> list[Leaf]:
    return [lf for lf in entry.leaves if lf.is_tensor and lf.name.split(".")[0].startswith(head)]


def _same(a: Leaf, b: Leaf) -> str | None:
    """'checksum' when both carry equal checksums, 'statistics' when shape, dtype and every
    statistic agree exactly, else None."""
    if a.checksum and b.checksum:
        return "checksum" if a.checksum == b.checksum and a.shape == b.shape else None
    vals = [(getattr(a, k), getattr(b, k)) for k in _STATS]
    if any(x is None or y is None for x, y in vals[:3]) or any(x != y for x, y in vals):
        return None
    return "statistics"


def how(entry: Entry) -> str | None:
    """How ``entry`` is shown to pass its input through: 'checksum' (every output's checksum
    equals an input's: the same values), 'statistics' (shape, dtype, Max, Min, Mean and Norm
    equal: statistics only, since a permutation keeps them too) or None (not shown)."""
    ins, outs = _tensors(entry, "input"), _tensors(entry, "output")
    if not ins or not outs:
        return None
    found = []
    for o in outs:
        match = next((m for m in (_same(i, o) for i in ins) if m), None)
        if match is None:
            return None
        found.append(match)
    return "checksum" if all(m == "checksum" for m in found) else "statistics"


def mark(one_sided: list, entries: dict[str, list[Entry]]) -> list:
    """The one-sided records with ``pass_through`` set from each module's own entry (new records;
    ``entries`` maps a side to its entries, indexed like the records)."""
    return [replace(o, pass_through=how(entries[o.side][o.rec])) for o in one_sided]
