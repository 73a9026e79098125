"""Read the ``dims`` annotation an SGLang dumper call may carry (``dumper.dump(..., dims=...)``).

The annotation names each dimension of the dumped tensor and how it is split over parallel ranks:
``"b s h[tp]"``, ``"t (num_heads*head_dim)[tp]"``, ``"t h[tp:partial]"``, ``"t h # tp:replicated"``.
Only what this bundle acts on is taken from it: the token layout (a leading ``t``, ``b s`` or
``s b``) and, for tensor-parallel axes, how the ranks' copies join. Anything else (context or
expert parallel axes, zigzag ordering, several sharded axes) gives no hint, and the usual
guesses apply (references/input_formats.md).
"""
from __future__ import annotations

import re

# Axes whose ranks are the tensor-parallel ranks that --<side>-rank all merges.
TP_AXES = frozenset({"tp", "attn_tp", "moe_tp", "etp", "sp"})
_TOKEN = re.compile(r"^(?:(?P<name>[A-Za-z_]\w*|1)|\((?P<fused>[^)]+)\))(?:\[(?P<mods>[^\]]+)\])?$")
LAYOUTS = {("t",): "t", ("b", "s"): "bs", ("s", "b"): "sb"}


def _dims(text: str) -> tuple[list[tuple[str, list[str]]], str] | None:
    """[(dim name, [modifier, ...]), ...] and the declaration after ``#``; None when malformed."""
    shape, _, decl = text.partition("#")
    out = []
    for tok in shape.split():
        m = _TOKEN.match(tok)
        if m is None:
            return None
        name = m.group("name") or m.group("fused").replace(" ", "")
        mods = [x.strip() for x in (m.group("mods") or "").split(",") if x.strip()]
        out.append((name, mods))
    return (out, decl) if out else None


def layout(text) -> str | None:
    """"t" (tokens first), "bs" ([batch, seq, ...]) or "sb" ([seq, batch, ...]), or None."""
    parsed = _dims(text) if isinstance(text, str) else None
    if parsed is None:
        return None
    names = tuple(n for n, _ in parsed[0])
    for lead, name in LAYOUTS.items():
        if names[:len(lead)] == lead:
            return name
    return None


def shard_rule(text) -> str | None:
    """How the tensor-parallel ranks' copies of the tensor join: ``concat:<dim>``, ``sum`` (a
    ``partial`` reduction) or ``replicated`` (``# tp:replicated``); None without a usable hint."""
    parsed = _dims(text) if isinstance(text, str) else None
    if parsed is None:
        return None
    dims, decl = parsed
    if any(t.split(":")[0] in TP_AXES for t in decl.split() if t.endswith(":replicated")):
        return "replicated"
    sharded = [(i, mod) for i, (_, mods) in enumerate(dims) for mod in mods]
    if len(sharded) != 1:
        return None            # unsharded, or several axes: joining them needs more than one rule
    i, mod = sharded[0]
    axis, _, quals = mod.partition(":")
    quals = set(quals.split("+")) - {"", "sharded", "natural"}
    if axis not in TP_AXES or quals - {"partial"}:
        return None
    return "sum" if "partial" in quals else f"concat:{i}"
