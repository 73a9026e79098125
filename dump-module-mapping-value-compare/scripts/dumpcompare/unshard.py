"""Merge the tensor-parallel ranks of one side into one logical dump (the "unsharder").

The planner (:func:`merge_rule`) decides per leaf how ranks relate; the executor
(:func:`merge_ranks`) combines statistics exactly where the math allows and records, for tensor
files, which file of which rank holds each shard. The rules, and why they hold for Megatron,
vLLM and SGLang, are in references/tensor_parallel.md.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from .compare import leaf_stats, n_calls
from .compare.stats import ATTRS, combine
from .errors import InputError
from .naming import ModuleRecord
from .records import FORWARD, Dump, Leaf

_ROW_PARALLEL_DEFAULT = ("o", "down")


def _same(a: Leaf, b: Leaf) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    for x, y in ((a.max, b.max), (a.min, b.min), (a.mean, b.mean), (a.norm, b.norm)):
        if (x is None) != (y is None):
            return False
        if x is not None and not (x == y or (math.isnan(x) and math.isnan(y))
                                  or abs(x - y) <= 1e-6 * max(abs(x), abs(y))):
            return False
    return a.checksum == b.checksum


def merge_rule(rec: ModuleRecord, leaf: str, group: list[Leaf], rules: dict) -> str:
    """How the ranks' copies of one leaf combine: replicated, concat:<dim> or sum.

    User overrides first, then what the dump declares (``shard_hint``), then guesses."""
    for o in rules.get("overrides", []) or []:
        if re.search(o["module"], rec.path) and re.search(o.get("leaf", "."), leaf):
            return o["rule"]
    hints = {g.shard_hint for g in group}
    if len(hints) == 1 and None not in hints:
        return hints.pop()
    if all(_same(group[0], g) for g in group[1:]):
        return "replicated"
    shapes = [g.shape for g in group]
    if all(s is not None for s in shapes) and len({len(s) for s in shapes}) == 1:
        diff = {i for s in shapes for i, (x, y) in enumerate(zip(s, shapes[0])) if x != y}
        if len(diff) == 1:
            return f"concat:{diff.pop()}"
    row = rec.role in rules.get("row_parallel_roles", _ROW_PARALLEL_DEFAULT)
    if leaf.startswith("parameters."):
        return "concat:1" if row and leaf.endswith("weight") else "concat:0"
    shape = group[0].shape
    tokens = rules.get("tokens")
    if shape and tokens and shape[0] * len(group) * (shape[1] if len(shape) > 2 else 1) == tokens:
        # Sequence parallel: each rank holds its slice of the tokens (Megatron [s/tp, b, h]).
        return "concat:0"
    if row and leaf.startswith("output"):
        return "sum"
    if shape and len(shape) == 4:
        # Per-head activations ([s, b, heads, head_dim] in Megatron): ranks hold heads, never a
        # slice of the head size.
        return "concat:2"
    return "concat:-1"


def _merged_leaf(group: list[Leaf], rule: str, dumps: list[Dump]) -> Leaf:
    first = group[0]
    # A leaf of a joined step already names its own folder (loaders/joining.py).
    files = tuple(g.shards[0] if g.shards else (d.dump_dir, g.data_name, d.dump_data_dir)
                  for d, g in zip(dumps, group)) if all(g.data_name for g in group) else None
    if rule == "replicated":
        return replace(first, merge=rule)
    if rule == "sum":
        # Partial sums: the statistics of a sum are not a function of the parts' statistics.
        return replace(first, max=None, min=None, mean=None, norm=None, per_call=None, merge=rule, shards=files,
                       checksum=None)
    dim = int(rule.split(":")[1])
    shape = list(first.shape) if first.shape is not None else None
    if shape is not None:
        dim = dim % len(shape) if shape else 0
        shape[dim] = sum(g.shape[dim] for g in group)
    st = combine([leaf_stats(g) for g in group])
    calls = n_calls(group)
    per_call = None
    if calls > 1:
        pc = combine([leaf_stats(g, calls) for g in group])
        per_call = np.stack([np.full(calls, np.nan) if getattr(pc, a) is None else getattr(pc, a)
                             for a in ATTRS], axis=1)
    # A digest is of one rank's shard, never of the concatenation.
    return replace(first, shape=tuple(shape) if shape is not None else None, max=st.max, min=st.min,
                   mean=st.mean, norm=st.norm, per_call=per_call, merge=f"concat:{dim}", shards=files,
                   checksum=None)


def merge_ranks(dumps: list[Dump], recs: list[ModuleRecord], rules: dict) -> Dump:
    """One dump holding the ranks' leaves merged; rank 0's records name the modules.

    The dumps given are not changed: merged entries are new objects.
    """
    base = dumps[0]
    if len(dumps) == 1:
        return base
    peers = [{e.key: e for e in d.entries} for d in dumps[1:]]
    counts: dict[str, int] = {}
    missing = 0
    entries = []
    for e, rec in zip(base.entries, recs):
        if e.direction != FORWARD or e.kind != "module":
            entries.append(e)
            continue
        others = [p.get(e.key) for p in peers]
        if any(o is None for o in others):
            missing += 1
            entries.append(e)
            continue
        by_name = [{lf.name: lf for lf in o.leaves} for o in others]
        leaves = []
        for lf in e.leaves:
            group = [lf] + [b.get(lf.name) for b in by_name]
            if not lf.is_tensor or any(g is None for g in group):
                leaves.append(lf)
                continue
            rule = merge_rule(rec, lf.name, group, rules)
            leaves.append(_merged_leaf(group, rule, dumps))
            kind = rule.split(":")[0]
            counts[kind] = counts.get(kind, 0) + 1
        entries.append(replace(e, leaves=leaves))
    notes = list(base.notes)
    if len({d.folded for d in dumps}) > 1:
        notes.append("the ranks' repeated calls could not all be folded alike: only call 0 of modules "
                     "whose calls some rank kept apart was merged across ranks")
    notes.append(f"merged {len(dumps)} tensor-parallel ranks: "
                 + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                 + (f"; {missing} entries missing on some rank kept from rank 0" if missing else ""))
    salvage = base.salvage or next((d.salvage for d in dumps[1:] if d.salvage), None)
    return replace(base, entries=entries, notes=notes, salvage=salvage)


@dataclass(frozen=True)
class RankLayout:
    """How the rank files of one step relate: ``stages`` lists, in pipeline order, the rank
    indices of each stage (the tensor-parallel group merged within it); ``offsets`` shift each
    stage's layer numbers when stages number their layers from 0. Under a virtual pipeline the
    indices are of (rank, model chunk) units, listed in ``units``."""
    kind: str                              # single | tensor_parallel | pipeline | pipeline+tensor_parallel
    stages: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    units: tuple[tuple[int, int], ...] | None = None   # (rank index, chunk index) per index


def rank_relation(modules: list[frozenset], layers: list[set], has_tokens: list[bool], where: str,
                  side: str = "<side>") -> RankLayout:
    """Decide from their content how ranks relate (pure; references/input_formats.md).

    Ranks holding the same modules are tensor-parallel shards (or replicas) of one model. Ranks
    holding different modules are pipeline stages when they form groups, the first of which was
    fed the token ids; stages follow rank order (stage = rank // tp in Megatron, vLLM and SGLang).
    Anything else is refused with what was found.
    """
    n = len(modules)
    if n == 1:
        return RankLayout("single", ((0,),), (0,))
    groups: dict[frozenset, list[int]] = {}
    for i, m in enumerate(modules):
        groups.setdefault(m, []).append(i)
    stages = sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])
    if len(stages) == 1:
        return RankLayout("tensor_parallel", tuple(stages), (0,))
    sizes = {len(g) for g in stages}
    first_has_tokens = any(has_tokens[i] for i in stages[0])
    # A pipeline stage runs layers; a rank with no module (an API-level dump) is none.
    if len(sizes) != 1 or not first_has_tokens or any(not layers[g[0]] for g in stages):
        listing = "; ".join(f"ranks {','.join(map(str, g))}: {len(modules[g[0]])} modules, layers "
                            f"{_span(layers[g[0]])}" for g in stages)
        raise InputError(f"{where}: the ranks hold different modules but are not pipeline stages of one model "
                         f"({listing}); choose one rank with --{side}-rank")
    stage_layers = [layers[g[0]] for g in stages]
    overlap = any(stage_layers[i] & stage_layers[j] for i in range(len(stages)) for j in range(i))
    offsets, total = [], 0
    for ls in stage_layers:
        offsets.append(total if overlap else 0)
        total += (max(ls) + 1) if ls else 0
    kind = "pipeline" if len(stages[0]) == 1 else "pipeline+tensor_parallel"
    return RankLayout(kind, tuple(stages), tuple(offsets))


def _span(ls: set) -> str:
    return f"{min(ls)}-{max(ls)}" if ls else "none"
