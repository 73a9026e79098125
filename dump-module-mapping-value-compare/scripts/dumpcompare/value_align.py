"""Align the modules no naming rule explains by the values they carry, then by position.

Name-based pairing leaves two kinds of modules one-sided: those a profile expects to exist on one
side only (a rotary module, an attention kernel, a wrapper), and those no rule explains, which is
most of a family no profile describes. The second kind is aligned here, in execution order, one
stretch at a time: the name pairs are anchors, and between two consecutive anchors each side has
a run of unexplained modules.

* ``values``: within a run, the longest order-keeping alignment (as in a sequence alignment) of
  modules whose outputs carry the same statistics (shape, Max, Min, Mean, Norm; checksums when
  the dump has them) within the statistics tolerance of their dtype.
* ``order``: a diverged module cannot match by value, nor can anything downstream of it, so the
  modules left between two aligned modules are paired by position when both sides hold the same
  number of them with the same shapes in the same order.

Pairs found by name are never touched, and a module neither rule pairs stays one-sided. Why the
rules hold: references/naming_profiles.md, "Alignment by values and by order".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .compare.stats import ATTRS, Stats, stat_error_calls
from .dtypes import is_int_dtype
from .naming import ModuleRecord
from .passthrough import how as pass_through
from .plan import Aligned
from .records import Entry, Leaf
from .tolerances import pair_tolerances

# Value alignment of one run compares at most this many module pairs; a longer run is left to
# the order rule.
MAX_CELLS = 200_000


@dataclass
class Values:
    """What value alignment reads: each side's entries (indexed like its records) and the
    statistics tolerance by dtype (tolerances.yaml ``statistics``)."""
    entries: dict[str, list[Entry]]
    tolerance: dict


def align(fwd: dict[str, list[ModuleRecord]], anchors: list[tuple[int, int]],
          candidate: Callable[[str, ModuleRecord], bool], *, values: Values) -> list[Aligned]:
    """Pair the candidate modules of both sides between consecutive anchors.

    ``fwd``: each side's forward module records in execution order; ``anchors``: (train index,
    rollout index) of the pairs found by name; ``candidate(side, record)``: whether a record is
    one no rule explains (unpaired, not expected one-sided)."""
    chain = _monotone(sorted(anchors))
    cands = {s: [r for r in recs if candidate(s, r) and not _passes_through(values, s, r)]
             for s, recs in fwd.items()}
    out: list[Aligned] = []
    bounds = [(-1, -1)] + chain + [(float("inf"), float("inf"))]
    for (t0, r0), (t1, r1) in zip(bounds, bounds[1:]):
        tr = [r for r in cands["train"] if t0 < r.index < t1]
        ro = [r for r in cands["rollout"] if r0 < r.index < r1]
        if tr and ro:
            out += _align_run(tr, ro, values)
    return out


def _monotone(anchors: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Anchors sorted by train index, keeping those whose rollout index increases: a run lies
    between two points both sides agree on."""
    chain: list[tuple[int, int]] = []
    for t, r in anchors:
        if not chain or (t > chain[-1][0] and r > chain[-1][1]):
            chain.append((t, r))
    return chain


def _passes_through(values: Values, side: str, rec: ModuleRecord) -> bool:
    # A pass-through hands its input on: its output "matches" whatever produced that input.
    return pass_through(values.entries[side][rec.index]) is not None


def _tensors(values: Values, side: str, rec: ModuleRecord) -> dict[str, Leaf]:
    return {lf.name: lf for lf in values.entries[side][rec.index].leaves if lf.is_tensor}


def _io(leaf: str) -> str:
    if leaf.startswith("parameters."):
        return "param"
    return "out" if leaf.startswith("output") else "in"


def _size(lf: Leaf) -> tuple:
    return (lf.numel, lf.shape[-1] if lf.shape else None)


def _param_shapes(leaves: dict[str, Leaf]) -> tuple:
    """A module's parameters and their sizes: the checkpoint's, whatever the tokens."""
    return tuple(sorted((n, _size(lf)) for n, lf in leaves.items() if _io(n) == "param"))


def _signature(leaves: dict[str, Leaf]) -> tuple:
    """Sizes of a module's first output and of its parameters, leading size-1 dims ignored
    (engines flatten the batch). Further outputs are left out: engines differ in what else a
    module returns (attention weights, a residual)."""
    first = next((lf for n, lf in leaves.items() if _io(n) == "out"), None)
    return (_size(first) if first is not None else None, _param_shapes(leaves))


def _agreement(lt: list[dict[str, Leaf]], lr: list[dict[str, Leaf]], io: str,
               tolerance: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every (train, rollout) module of a run, over the leaves of kind ``io`` both carry:
    how many there are, how many have the same size, and how many of those agree (equal
    checksums when both have one, else a scaled statistics error within the comparison's own
    tolerance: a value pair is one the comparison would not flag, so a diverged module is never
    paired by its values). One vectorised statistics comparison per leaf name and size."""
    n, m = len(lt), len(lr)
    present, sized, agree = (np.zeros((n, m), dtype=np.int64) for _ in range(3))
    for name in sorted({k for leaves in lt for k in leaves if _io(k) == io}):
        ti = [i for i in range(n) if name in lt[i]]
        rj = [j for j in range(m) if name in lr[j]]
        if not ti or not rj:
            continue
        present[np.ix_(ti, rj)] += 1
        a, b = [lt[i][name] for i in ti], [lr[j][name] for j in rj]
        for numel in {x.numel for x in a} & {y.numel for y in b} - {None}:
            ii = [k for k, x in enumerate(a) if x.numel == numel]
            jj = [k for k, y in enumerate(b) if y.numel == numel]
            rows, cols = np.array(ti)[ii], np.array(rj)[jj]
            sized[np.ix_(rows, cols)] += 1
            agree[np.ix_(rows, cols)] += _agree([a[k] for k in ii], [b[k] for k in jj], numel, tolerance)
    return present, sized, agree


def _agree(a: list[Leaf], b: list[Leaf], numel: int, tolerance: dict) -> np.ndarray:
    """[len(a), len(b)] 0/1: whether each pair of same-size leaves carries the same values."""
    def column(leaves, attr):
        return np.array([np.nan if getattr(lf, attr) is None else float(getattr(lf, attr)) for lf in leaves])
    shape = (len(a), len(b))
    ii, jj = (x.ravel() for x in np.indices(shape))
    ints = (any(is_int_dtype(lf.dtype) for lf in a), any(is_int_dtype(lf.dtype) for lf in b))
    t = Stats(*(column(a, k)[ii] for k in ATTRS), numel, None, ints[0])
    r = Stats(*(column(b, k)[jj] for k in ATTRS), numel, None, ints[1])
    err = stat_error_calls(t, r)["scaled_error"]
    tol = np.array([pair_tolerances(tolerance, x.dtype, y.dtype)[0] for x in a for y in b])
    ok = np.isfinite(err) & (err <= tol) & ~np.isnan(t.max) & ~np.isnan(r.max)
    sums = [(x.checksum, y.checksum) for x in a for y in b]
    ok = np.array([(cx == cy) if cx and cy else bool(o) for (cx, cy), o in zip(sums, ok)])
    return ok.reshape(shape).astype(np.int64)


def _scores(lt: list[dict[str, Leaf]], lr: list[dict[str, Leaf]], tolerance: dict) -> np.ndarray:
    """Per (train, rollout) module: 0 unless every output both carry agrees (and there is one);
    2, plus 1 when every same-size input agrees too (which tells a module from its container)."""
    out_present, _, out_agree = _agreement(lt, lr, "out", tolerance)
    _, in_sized, in_agree = _agreement(lt, lr, "in", tolerance)
    outputs = (out_present > 0) & (out_agree == out_present)
    inputs = (in_sized > 0) & (in_agree == in_sized)
    return np.where(outputs, 2 + inputs, 0)


def _align_run(tr: list[ModuleRecord], ro: list[ModuleRecord], values: Values) -> list[Aligned]:
    leaves = {"train": [_tensors(values, "train", r) for r in tr],
              "rollout": [_tensors(values, "rollout", r) for r in ro]}
    score = _scores(leaves["train"], leaves["rollout"], values.tolerance) if len(tr) * len(ro) <= MAX_CELLS \
        else np.zeros((len(tr), len(ro)), dtype=np.int64)
    found = {ij: "values" for ij in _best_monotone(score)}
    # The order rule, between consecutive aligned modules: first the modules holding parameters,
    # by their parameters' shapes (engines add parameterless helpers, but each checkpoint tensor
    # lives in one module a side), then whatever is left, by its first output's size too.
    for key, holds_params in ((_param_shapes, True), (_signature, False)):
        for ti, rj in _gaps(sorted(found), len(tr), len(ro)):
            if holds_params:
                ti = [i for i in ti if _param_shapes(leaves["train"][i])]
                rj = [j for j in rj if _param_shapes(leaves["rollout"][j])]
            if ti and len(ti) == len(rj) and all(key(leaves["train"][i]) == key(leaves["rollout"][j])
                                                 for i, j in zip(ti, rj)):
                found.update({(i, j): "order" for i, j in zip(ti, rj)})
    return [_aligned(tr[i], ro[j], by, leaves["train"][i], leaves["rollout"][j])
            for (i, j), by in sorted(found.items())]


def _gaps(matched: list[tuple[int, int]], n: int, m: int):
    """(train positions, rollout positions) strictly between consecutive matches and the ends."""
    cuts = [(-1, -1)] + matched + [(n, m)]
    for (i0, j0), (i1, j1) in zip(cuts, cuts[1:]):
        yield list(range(i0 + 1, i1)), list(range(j0 + 1, j1))


def _best_monotone(score: np.ndarray) -> list[tuple[int, int]]:
    """(i, j) pairs with increasing i and j maximising the summed score (zero = no pair)."""
    n, m = score.shape
    dp = np.zeros((n + 1, m + 1), dtype=np.int64)
    for i in range(1, n + 1):
        diag = dp[i - 1, :-1] + score[i - 1]
        dp[i, 1:] = np.maximum.accumulate(np.maximum(dp[i - 1, 1:], diag))
    pairs, i, j = [], n, m
    while i > 0 and j > 0:
        s = score[i - 1, j - 1]
        if s > 0 and dp[i, j] == dp[i - 1, j - 1] + s:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif dp[i, j] == dp[i - 1, j]:
            i -= 1
        else:
            j -= 1
    return pairs[::-1]


def _aligned(t: ModuleRecord, r: ModuleRecord, by: str, tl: dict[str, Leaf], rl: dict[str, Leaf]) -> Aligned:
    common = [(n, _io(n)) for n in tl if n in rl and tl[n].numel == rl[n].numel]
    return Aligned(t, r, by, common)

