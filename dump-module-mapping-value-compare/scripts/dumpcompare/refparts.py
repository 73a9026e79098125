"""Which part of a fused output departs from the reference, from statistics alone.

A fused engine module (vLLM's qkv_proj, gate_up_proj) writes one output whose statistics cover
all its parts, while the trainer's modules and the reference compute each part on its own. When
such an output departs, "only part X is wrong" predicts that every other part still equals the
reference. The fused statistics must then contain those parts: Max at least their Max, Min at
most their Min, Norm^2 at least the sum of their Norm^2, and what is left for X (its sum and its
Norm^2, by difference) must be a possible tensor of X's size (|sum| <= sqrt(n) * norm, and the
sum within n * [Min, Max]). Each engine call gives these tests again on its own rows. A part
whose hypothesis breaks any of them beyond tolerance is ruled out; the parts that remain are the
suspects. These tests only rule out, never prove: several parts can remain.

Among the parts left, a part whose reference Max (or Min) is the fused output's Max (Min) at some
call, while another part's never is, is taken as unchanged: a changed weight moves every value
the part outputs, its extreme one included, so that equality is the mark of a part left intact.
Why, and where it can mislead: references/reference_forward_evidence.md ("Which part of a fused
output").
"""
from __future__ import annotations

import math

import numpy as np

from .compare.stats import combine
from .dtypes import dtype_key
from .refjudge import leaf_calls, ref_stats
from .refpoints import call_groups


def _ref(a: np.ndarray, dtype: str) -> dict:
    """A reference part's statistics as sums: what adds up over the parts of a fused output."""
    s = ref_stats(a, dtype)
    return {"max": s.max, "min": s.min, "sum": s.mean * s.numel, "sq": s.norm ** 2, "n": s.numel}


def _broken(stats, others: list[dict], n_x: int, tol: float) -> str | None:
    """Why the side's statistics ``stats`` cannot hold ``others`` unchanged plus some part of
    ``n_x`` values (None when they can)."""
    scale = max(abs(stats.max), abs(stats.min), 1e-30)
    if stats.max < max(o["max"] for o in others) - tol * scale:
        return "its Max is below an unchanged part's Max"
    if stats.min > min(o["min"] for o in others) + tol * scale:
        return "its Min is above an unchanged part's Min"
    sq = stats.norm ** 2
    rest_sq = sq - sum(o["sq"] for o in others)
    if rest_sq < -2 * tol * sq:
        return "its Norm is below what the unchanged parts alone hold"
    rest_sq = max(rest_sq, 0.0)
    n = stats.numel
    rest_sum = stats.mean * n - sum(o["sum"] for o in others)
    slack = 2 * tol * math.sqrt(sq * n)      # the Mean's tolerance, as a sum over the tensor
    if abs(rest_sum) > math.sqrt(n_x * rest_sq) + slack:
        return "the part's sum left by the Mean exceeds what its Norm allows"
    if not (n_x * stats.min - slack <= rest_sum <= n_x * stats.max + slack):
        return "the part's sum left by the Mean is outside its size times Min..Max"
    return None


def suspects(point: str, arrays: dict, view, leaves, call_ends: list[int] | None, tolerance: float) -> dict | None:
    """``{"parts": {part: reason ruled out or None}, "suspects": [parts not ruled out]}`` for a
    fused ``point`` that one side holds as one output; None where the test does not apply (one
    part, a part the reference lacks, statistics missing)."""
    parts = point.split("+")
    refs = [arrays.get(p) for p in parts]
    if len(parts) < 2 or any(r is None for r in refs) or len({r.shape[0] for r in refs}) != 1:
        return None
    whole = np.concatenate(refs, axis=1)
    ends = call_ends if call_ends else [whole.shape[0]]
    groups = call_groups(leaves, whole, ends) if len(ends) > 1 else None
    if groups is None:
        groups = [(leaves, whole)]
    dtype = dtype_key(leaves[0].dtype)
    widths = np.cumsum([r.shape[1] for r in refs])[:-1]
    out: dict[str, str | None] = {p: None for p in parts}
    seen: dict[str, str] = {}
    for c, (group, rows) in enumerate(groups):
        stats = combine([s for lf in group for s in leaf_calls(lf)])
        if None in (stats.max, stats.min, stats.mean, stats.norm, stats.numel) or stats.numel != rows.size:
            return None
        pieces = [_ref(a, dtype) for a in np.split(rows, widths, axis=1)]
        at = f" (call {c})" if len(groups) > 1 else ""
        for i, p in enumerate(parts):
            if out[p] is None:
                why = _broken(stats, pieces[:i] + pieces[i + 1:], pieces[i]["n"], tolerance)
                if why:
                    out[p] = why + at
        for p, what in _extremes_held(stats, parts, pieces, tolerance).items():
            seen.setdefault(p, what + at)
    left = [p for p in parts if out[p] is None]
    unseen = [p for p in left if p not in seen]
    if unseen and len(unseen) < len(left):
        for p in left:
            if p in seen:
                out[p] = (f"its reference {seen[p]}: that value is unchanged, and a change of the part's "
                          "weight would move it")
    return {"parts": out, "suspects": [p for p in parts if out[p] is None]}


def _extremes_held(stats, parts: list[str], pieces: list[dict], tol: float) -> dict[str, str]:
    """part -> which of its reference extremes the fused statistics hold, for a part that alone
    holds it (two parts with the same extreme prove nothing about either)."""
    scale = max(abs(stats.max), abs(stats.min), 1e-30)
    found = {}
    for key, word in (("max", "Max"), ("min", "Min")):
        got = getattr(stats, key)
        hits = [p for p, piece in zip(parts, pieces) if abs(piece[key] - got) <= tol * scale]
        if len(hits) == 1:
            found.setdefault(hits[0], f"{word} is the fused output's")
    return found
