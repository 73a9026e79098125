"""A side's calls at one reference point, judged as columns.

A generation dumps every module once per forward call: a prefill, then one call per decoded
token. The loader keeps a module's run of calls as one leaf with a row of statistics per call
(loaders/folding.py), and the reference forward judges each call against the reference rows of
its own tokens (refpoints.judge_point says why). Here the calls stay columns: the side's rows of
statistics as they were loaded, each call's reference rows gathered by its span of tokens, and
the calls of one dtype and size judged in one numpy pass, without a leaf or a judgement record
built per call. A call the columns cannot judge (tensors to read, a statistic missing, alone of
its size) is judged on its own by refjudge.judge_whole; every call gets the judgement that
function gives it (tests/refcheck/test_refcalls.py holds the two to each other).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .arrays import to_dtype
from .callruns import calls_held, with_row
from .compare.stats import Stats, stat_error_calls
from .dtypes import dtype_key
from .records import Leaf
from .refjudge import judge_whole
from .tolerances import pair_tolerances


class CallJudgements(NamedTuple):
    """Per call, in call order: ``matches_reference`` (True, False or "unknown") and the error
    (None where there is none); the last call's tolerance and how it was judged."""
    matches: list
    errors: list
    tolerance: float | None
    how: str


def _spans(ref: np.ndarray, runs: list[Leaf], held: list[int], call_ends: list[int]):
    """(first reference row, rows) of each call, or None where a call's size is neither its tokens'
    rows nor one row: a call holding one row of a point the reference holds for every token (the
    logits an engine keeps for the sampled position) is held to the last row of its span."""
    ends = np.asarray(call_ends, dtype=np.int64)
    starts = np.concatenate((np.zeros(1, dtype=np.int64), ends[:-1]))
    numel = np.repeat(np.array([lf.numel or 0 for lf in runs], dtype=np.int64), held)
    width = ref.shape[1]
    whole, last = numel == (ends - starts) * width, numel == width
    if not np.all(whole | last):
        return None
    return np.where(whole, starts, ends - 1), np.where(whole, ends - starts, 1)


def _columns_fit(lf: Leaf, n_calls: int, use_tensors: bool) -> bool:
    """Whether a run's calls are judged from their rows of statistics: one tensor each (a run of one
    call that still folds several is not), no tensor file to read instead, all four statistics."""
    one = n_calls > 1 or lf.per_call is None or len(lf.per_call) <= 1
    return (one and not (use_tensors and lf.data_name) and lf.numel is not None
            and None not in (lf.max, lf.min, lf.mean, lf.norm))


def judge_calls(ref: np.ndarray, view, runs: list[Leaf], expand: bool, call_ends: list[int], n_parts: int,
                tolerances: dict, use_tensors: bool) -> CallJudgements | None:
    """Every call of ``runs`` judged against its own rows of ``ref``; None when the runs do not hold
    the calls of ``call_ends`` one by one. ``expand``: each run stands for the calls it holds (a
    stitched or folded side); otherwise each run is one call."""
    if call_ends[-1] != len(ref):
        return None
    held = [calls_held(lf) if expand else 1 for lf in runs]
    if sum(held) != len(call_ends):
        return None
    spans = _spans(ref, runs, held, call_ends)
    if spans is None:
        return None
    lo, n_rows = spans
    offsets = np.cumsum([0] + held).tolist()
    out = _Judged(len(call_ends))

    def alone(r: int, p: int) -> None:
        lf = runs[r]
        c = offsets[r] + p
        call = with_row(lf, lf.per_call[p].tolist()) if held[r] > 1 else lf
        out.put(c, judge_whole(ref[lo[c]:lo[c] + n_rows[c]], view, [call], n_parts, tolerances, use_tensors,
                               extremes=False))

    # The calls of one dtype, size and span length form a batch, as one judgement each would.
    batches: dict[tuple, list[tuple[int, np.ndarray]]] = {}
    for r, (lf, n) in enumerate(zip(runs, held)):
        if not _columns_fit(lf, n, use_tensors):
            for p in range(n):
                alone(r, p)
            continue
        rows_here = n_rows[offsets[r]:offsets[r + 1]]
        for k in np.unique(rows_here).tolist():
            batches.setdefault((dtype_key(lf.dtype), lf.numel, k), []).append((r, np.flatnonzero(rows_here == k)))
    for (dtype, numel, k), parts in batches.items():
        if sum(len(p) for _r, p in parts) == 1:
            alone(parts[0][0], int(parts[0][1][0]))
            continue
        idx = np.concatenate([offsets[r] + p for r, p in parts])
        side_rows = np.concatenate([_stat_rows(runs[r], held[r])[p] for r, p in parts])
        side = Stats(*[np.ascontiguousarray(side_rows[:, i]) for i in range(4)], numel, runs[parts[0][0]].dtype)
        w = to_dtype(ref[lo[idx][:, None] + np.arange(k)].reshape(len(idx), -1), dtype).astype(np.float64)
        want = Stats(w.max(axis=1), w.min(axis=1), w.mean(axis=1), np.sqrt(np.sum(w * w, axis=1)), numel, dtype)
        tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
        out.put_batch(idx.tolist(), stat_error_calls(side, want, extremes=False)["scaled_error"].tolist(), tol)
    return CallJudgements(out.matches, out.errors, *out.last)


def _stat_rows(lf: Leaf, n_calls: int) -> np.ndarray:
    """float64 [calls, 4]: Max, Min, Mean, Norm of each call of a run (a run of one call: its leaf's)."""
    if n_calls > 1:
        return lf.per_call
    return np.array([[lf.max, lf.min, lf.mean, lf.norm]], dtype=np.float64)


class _Judged:
    """The per-call columns being filled, and the last call's tolerance and how."""

    def __init__(self, n: int):
        self.matches: list = [None] * n
        self.errors: list = [None] * n
        self.last: tuple = (None, None)

    def put(self, c: int, judged: dict) -> None:
        self.matches[c], self.errors[c] = judged["matches_reference"], judged["error"]
        if c == len(self.matches) - 1:
            self.last = (judged["tolerance"], judged["how"])

    def put_batch(self, calls: list[int], scaled: list[float], tol: float) -> None:
        for c, e in zip(calls, scaled):
            # NaN: no statistic to compare in that call (judge_whole's "unknown").
            self.matches[c], self.errors[c] = ("unknown", None) if math.isnan(e) else (e <= tol, e)
        if max(calls) == len(self.matches) - 1:
            self.last = (tol, "statistics")
