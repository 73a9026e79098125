"""One judgement of a side's values at one reference point: the side's tensor against the
reference's by relative L2 where tensors were dumped, its statistics against the reference's
rounded to the side's dtype otherwise (``matches_reference``). refpoints.py decides which rows of
the reference each judgement gets; refcalls.py judges a generation's calls as columns. Why the
judgement holds: references/reference_forward_evidence.md.
"""
from __future__ import annotations

import math

import numpy as np

from .arrays import leaf_array, rel_error, to_dtype
from .compare.stats import Stats, combine, stat_errors
from .compare.tensors import as_tokens
from .dtypes import dtype_key
from .records import Leaf
from .tolerances import pair_tolerances


def leaf_calls(leaf: Leaf) -> list[Stats]:
    """The statistics of every call a leaf holds (NaN rows read as absent statistics)."""
    rows = leaf.per_call if leaf.per_call is not None and len(leaf.per_call) > 1 else None
    if rows is None:
        return [Stats(leaf.max, leaf.min, leaf.mean, leaf.norm, leaf.numel, leaf.dtype)]
    return [Stats(*[None if math.isnan(v) else float(v) for v in row], leaf.numel, leaf.dtype) for row in rows]


def ref_stats(a: np.ndarray, dtype: str) -> Stats:
    """Max/Min/Mean/Norm of a reference tensor rounded to the side's dtype."""
    w = to_dtype(a, dtype).astype(np.float64)
    return Stats(float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt(np.sum(w * w))), int(w.size), dtype)


def _side_tensor(view, leaves: list[Leaf], n_parts: int) -> np.ndarray | None:
    """The side's tensor as [tokens, features]: parts side by side, steps one after another."""
    if any(lf.per_call is not None or not lf.data_name for lf in leaves):
        return None
    arrays = [leaf_array(view, lf) for lf in leaves]
    if any(a is None for a in arrays):
        return None
    rows = [as_tokens(a, view.family) for a in arrays]
    if n_parts > 1 and len(rows) == n_parts:
        return np.concatenate(rows, axis=1) if len({r.shape[0] for r in rows}) == 1 else None
    return np.concatenate(rows, axis=0) if len({r.shape[1] for r in rows}) == 1 else None


def judge_whole(ref: np.ndarray, view, leaves: list[Leaf], n_parts: int, tolerances: dict,
                use_tensors: bool, extremes: bool = True) -> dict:
    """One judgement over all the leaves together (every call's rows as one tensor). ``extremes=False``:
    statistics judged on Norm and Mean only, as one call of a generation is (refcalls.py)."""
    dtype = dtype_key(leaves[0].dtype)
    side = _side_tensor(view, leaves, n_parts) if use_tensors else None
    if side is not None and side.size == ref.size:
        side = side.reshape(ref.shape) if side.shape != ref.shape else side
        tol = tolerances["tensor"]["rel_l2"].get(dtype, tolerances["tensor"]["rel_l2"]["default"])
        rounded = to_dtype(ref, dtype).astype(np.float64)
        err, how = rel_error(side.astype(np.float64), rounded), "tensor"
        if err > tol and n_parts > 1:
            # A fused layout orders each token's features its own way: compare the sorted rows.
            err, how = min(err, rel_error(np.sort(side, axis=1), np.sort(rounded, axis=1))), "tensor, rows sorted"
        return {"matches_reference": bool(err <= tol), "error": err, "tolerance": tol, "how": how}
    stats = combine([s for lf in leaves for s in leaf_calls(lf)])
    if stats.numel is not None and stats.numel != ref.size:
        return {"matches_reference": "unknown", "error": None, "tolerance": None, "how": "statistics",
                "detail": f"the side holds {stats.numel} values, the reference {ref.size} (tokens or slice differ)"}
    tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
    err = stat_errors(stats, ref_stats(ref, dtype), extremes).get("scaled_error")
    if err is None:
        return {"matches_reference": "unknown", "error": None, "tolerance": tol, "how": "statistics",
                "detail": "no statistics to compare"}
    return {"matches_reference": bool(err <= tol), "error": err, "tolerance": tol, "how": "statistics"}
