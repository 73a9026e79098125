"""Merge the tensor-parallel ranks of one side into one logical dump (the "unsharder").

Ranks are merged one at a time (:class:`RankMerge`, fed by loaders/assembly.py), so a side never
holds all its ranks: per leaf, the facts its rule needs are gathered rank by rank and the rule
(:meth:`RuleFacts.rule`) decided at the end; statistics are combined exactly where the math allows,
and for tensor files the merge records which file of which rank holds each shard. The rules, and
why they hold for Megatron, vLLM and SGLang, are in references/tensor_parallel.md.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from .arrays import merge_rule
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


class RuleFacts:
    """What the rule of one leaf depends on, gathered one rank at a time (rank 0's leaf first)."""
    __slots__ = ("first", "n", "hinted", "same", "diff", "shape")

    def __init__(self, first: Leaf) -> None:
        self.first = first
        self.n = 1
        self.hinted = first.shard_hint is not None     # every rank declares first's shard_hint
        self.same = True                               # every rank replicates rank 0
        self.diff: set | None = set() if first.shape is not None else None   # dims whose sizes differ
        self.shape = list(first.shape) if first.shape is not None else None  # sizes summed over ranks

    def add(self, lf: Leaf) -> None:
        """Take the next rank's copy of the leaf."""
        first = self.first
        self.n += 1
        self.hinted = self.hinted and lf.shard_hint == first.shard_hint
        self.same = self.same and _same(first, lf)
        if self.diff is not None:
            if lf.shape is None or len(lf.shape) != len(first.shape):
                self.diff = self.shape = None
            else:
                self.diff.update(i for i, (x, y) in enumerate(zip(lf.shape, first.shape)) if x != y)
                self.shape = [a + b for a, b in zip(self.shape, lf.shape)]

    def rule(self, rec: ModuleRecord, leaf: str, rules: dict, experts: int | None = None) -> str:
        """How the ranks' copies combine: replicated, concat:<dim>, sum or expert_parallel.

        ``experts`` is the number of experts of the MoE block holding the module (its router's
        output width), None outside one. Expert parallelism read from the shapes first, then
        overrides, then what the dump declares (``shard_hint``), then guesses."""
        if (experts and leaf.startswith("parameters.") and not self.same and self.shape
                and self.diff is not None and self.diff <= {0} and self.shape[0] == experts):
            # Each rank holds whole experts and together they hold each once: the leading dims add
            # up to the router's width, which no tensor-parallel split of [E, ...] can do
            # (references/tensor_parallel.md, "Expert parallelism").
            return "expert_parallel"
        for o in rules.get("overrides", []) or []:
            if re.search(o["module"], rec.path) and re.search(o.get("leaf", "."), leaf):
                return o["rule"]
        if self.hinted:
            return self.first.shard_hint
        if self.same:
            return "replicated"
        if self.diff is not None and len(self.diff) == 1:
            return f"concat:{next(iter(self.diff))}"
        row = rec.role in rules.get("row_parallel_roles", _ROW_PARALLEL_DEFAULT)
        if leaf.startswith("parameters."):
            return "concat:1" if row and leaf.endswith("weight") else "concat:0"
        shape = self.first.shape
        tokens = rules.get("tokens")
        if shape and tokens and shape[0] * self.n * (shape[1] if len(shape) > 2 else 1) == tokens:
            # Sequence parallel: each rank holds its slice of the tokens (Megatron [s/tp, b, h]).
            return "concat:0"
        if row and leaf.startswith("output"):
            return "sum"
        if shape and len(shape) == 4:
            # Per-head activations ([s, b, heads, head_dim] in Megatron): ranks hold heads, never a
            # slice of the head size.
            return "concat:2"
        return "concat:-1"


def _rows(lf: Leaf) -> np.ndarray:
    """A leaf's statistics as float64 [calls, 4] (Max, Min, Mean, Norm), NaN where absent."""
    if lf.per_call is not None:
        return lf.per_call
    return np.array([[np.nan if v is None else v for v in (lf.max, lf.min, lf.mean, lf.norm)]], dtype=np.float64)


class _LeafMerge:
    """The running merge of one leaf: its rule facts, the rank files of its shards, and the
    statistics of the concatenation so far (exact: max of Max, min of Min, element-weighted Mean,
    root-sum-square Norm, per call; compare/stats.combine is the same math over all parts at once)."""
    __slots__ = ("facts", "files", "has", "numel", "rows")

    def __init__(self, lf: Leaf, d: Dump) -> None:
        self.facts = RuleFacts(lf)
        self.files = [_file_of(lf, d)] if lf.data_name else None
        self.has = [v is not None for v in (lf.max, lf.min, lf.mean, lf.norm)]
        self.numel = lf.numel
        self.rows = _rows(lf).copy()    # a fresh accumulator: the loaded leaf is never written

    def add(self, lf: Leaf, d: Dump) -> None:
        """Fold in the next rank's copy of the leaf."""
        self.facts.add(lf)
        if self.files is not None and lf.data_name:
            self.files.append(_file_of(lf, d))
        else:
            self.files = None
        self.has = [h and v is not None for h, v in zip(self.has, (lf.max, lf.min, lf.mean, lf.norm))]
        r = _rows(lf)
        # Only the calls every rank holds are merged (compare.n_calls).
        k = min(len(self.rows), len(r))
        acc, r = self.rows[:k], r[:k]
        n_old, n_new = self.numel, lf.numel
        self.numel = None if n_old is None or n_new is None else n_old + n_new
        with np.errstate(all="ignore"):
            np.maximum(acc[:, 0], r[:, 0], out=acc[:, 0])
            np.minimum(acc[:, 1], r[:, 1], out=acc[:, 1])
            if self.numel:
                # Weights below 1 keep the running mean from overflowing for huge values or counts.
                acc[:, 2] = acc[:, 2] * (n_old / self.numel) + r[:, 2] * (n_new / self.numel)
            np.hypot(acc[:, 3], r[:, 3], out=acc[:, 3])
        self.rows = acc

    def leaf(self, rec: ModuleRecord, rules: dict, experts: int | None = None) -> tuple[Leaf, str]:
        """The merged leaf and the rule that merged it (``experts``: see :meth:`RuleFacts.rule`)."""
        first, facts = self.facts.first, self.facts
        rule = facts.rule(rec, first.name, rules, experts)
        ep = rule == "expert_parallel"
        if ep:
            # Experts in rank order: contiguous placement (rank r holds the r-th block of experts).
            rule = "concat:0"
        files = tuple(self.files) if self.files is not None else None
        if rule == "replicated":
            return replace(first, merge=rule), rule
        if rule == "sum":
            # Partial sums: the statistics of a sum are not a function of the parts' statistics.
            return replace(first, max=None, min=None, mean=None, norm=None, per_call=None, merge=rule,
                           shards=files, checksum=None), rule
        dim = merge_rule(rule).dim
        shape = first.shape if not first.shape else None     # unknown, or a 0-d tensor: kept
        if first.shape:
            dim = dim % len(first.shape)
            if facts.shape is not None:
                shape = list(first.shape)
                shape[dim] = facts.shape[dim]
        elif first.shape is not None:
            dim = 0
        has = list(self.has)
        has[2] = has[2] and bool(self.numel)
        rows = self.rows.copy()
        rows[:, [j for j, h in enumerate(has) if not h]] = np.nan
        stats = [float(v) if h else None for v, h in zip(rows[0], has)]
        # A digest is of one rank's shard, never of the concatenation.
        return replace(first, shape=tuple(shape) if shape is not None else None, max=stats[0], min=stats[1],
                       mean=stats[2], norm=stats[3], per_call=rows if len(rows) > 1 else None,
                       merge=f"concat:{dim}", shards=files, checksum=None), "expert_parallel" if ep else f"concat:{dim}"


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _experts_by_block(entries, recs: list[ModuleRecord]) -> dict[str, int]:
    """The number of experts of each MoE block, by the block's path: the width of its router's
    logits, which every rank computes whole (the router is replicated under TP and EP alike)."""
    out: dict[str, int] = {}
    for e, rec in zip(entries, recs):
        if rec.role != "router" or e.direction != FORWARD:
            continue
        logits = next((lf for lf in e.leaves if lf.name in ("output", "output.0")), None)
        if logits is not None and logits.shape and len(logits.shape) >= 2:
            out.setdefault(_parent(rec.path), logits.shape[-1])
    return out


def _file_of(lf: Leaf, d: Dump) -> tuple:
    # A leaf of a joined step already names its own folder (loaders/joining.py).
    return lf.shards[0] if lf.shards else (d.dump_dir, lf.data_name, d.dump_data_dir)


class RankMerge:
    """The tensor-parallel ranks of one side merged one rank at a time, so that only the merge so
    far and the incoming rank are held (a running reduction whose statistics stay exact).

    Rank 0's dump and records name the modules; entries missing on some rank, non-tensor leaves
    and everything but forward modules are kept from rank 0. No dump given is changed.
    """

    def __init__(self, base: Dump, recs: list[ModuleRecord], rules: dict) -> None:
        self.base, self.recs, self.rules = base, recs, rules
        self.n = 1
        self.folded = {base.folded}
        self.salvage = base.salvage
        # Per entry of rank 0: None (kept as is), or one _LeafMerge (None: kept) per leaf. Built when
        # a second rank arrives: a side of one rank (most inputs) never needs it.
        self.acc: list[list | None] | None = None
        self.missing = 0

    def _start(self) -> list[list | None]:
        return [[_LeafMerge(lf, self.base) if lf.is_tensor else None for lf in e.leaves]
                if e.direction == FORWARD and e.kind == "module" else None for e in self.base.entries]

    def add(self, d: Dump) -> None:
        """Merge in the next rank's dump (ranks in rank order)."""
        if self.acc is None:
            self.acc = self._start()
        self.n += 1
        self.folded.add(d.folded)
        self.salvage = self.salvage or d.salvage
        peers = {e.key: e for e in d.entries}
        for i, (e, acc) in enumerate(zip(self.base.entries, self.acc)):
            if acc is None:
                continue
            o = peers.get(e.key)
            if o is None:
                self.acc[i] = None
                self.missing += 1
                continue
            by_name = {lf.name: lf for lf in o.leaves}
            for j, (lf, m) in enumerate(zip(e.leaves, acc)):
                if m is None:
                    continue
                g = by_name.get(lf.name)
                if g is None:
                    acc[j] = None
                else:
                    m.add(g, d)

    def finish(self) -> Dump:
        """The merged dump."""
        base = self.base
        if self.n == 1:
            return base
        counts: dict[str, int] = {}
        entries = []
        experts = _experts_by_block(base.entries, self.recs)
        for e, rec, acc in zip(base.entries, self.recs, self.acc):
            if acc is None:
                entries.append(e)
                continue
            leaves = []
            for lf, m in zip(e.leaves, acc):
                if m is None:
                    leaves.append(lf)
                    continue
                merged, rule = m.leaf(rec, self.rules, experts.get(_parent(rec.path)))
                leaves.append(merged)
                kind = merge_rule(rule).kind
                counts[kind] = counts.get(kind, 0) + 1
            entries.append(replace(e, leaves=leaves))
        notes = list(base.notes)
        if len(self.folded) > 1:
            notes.append("the ranks' repeated calls could not all be folded alike: only call 0 of modules "
                         "whose calls some rank kept apart was merged across ranks")
        notes.append(f"merged {self.n} tensor-parallel ranks: "
                     + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                     + ("; expert_parallel: stacked experts concatenated on dim 0 in rank order"
                        if "expert_parallel" in counts else "")
                     + (f"; {self.missing} entries missing on some rank kept from rank 0" if self.missing else ""))
        return replace(base, entries=entries, notes=notes, salvage=self.salvage)


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
    # Only the first stage of a pipeline is fed the token ids: files that each were are whole
    # models (dumps of several runs in one folder), not stages.
    later_have_tokens = any(has_tokens[i] for g in stages[1:] for i in g)
    # A pipeline stage runs layers; a rank with no module (an API-level dump) is none.
    if len(sizes) != 1 or not first_has_tokens or later_have_tokens or any(not layers[g[0]] for g in stages):
        listing = "; ".join(f"ranks {','.join(map(str, g))}: {len(modules[g[0]])} modules, layers "
                            f"{_span(layers[g[0]])}" for g in stages)
        raise InputError(f"{where}: the dump files found here hold different modules and are not pipeline stages "
                         f"of one model ({listing}); if they are dumps of different runs, pass the one you mean "
                         f"(its dump.json or its own folder); if they are ranks of one run, choose one with "
                         f"--{side}-rank")
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
