"""Statistics-mode comparison: combine shard/part statistics exactly, then scale the errors.

Raw relative errors of a Mean near zero flag every module of a real bf16 dump, so each
statistic's difference is scaled by the tensor's magnitude instead: Norm by Norm, Mean by
the RMS (Norm / sqrt(numel)), Max and Min by max |x|.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Stats:
    """The four msprobe statistics of one (possibly combined) tensor."""
    max: float | None
    min: float | None
    mean: float | None
    norm: float | None
    numel: int | None
    dtype: str | None
    is_int: bool = False


def combine(parts: list[Stats]) -> Stats:
    """Statistics of the concatenation of ``parts`` (order does not matter for these four).

    Max of Max, min of Min, element-weighted Mean and root-sum-square Norm are exact; a
    missing statistic in any part makes the combined one missing.
    """
    if len(parts) == 1:
        return parts[0]

    def all_have(attr):
        return all(getattr(p, attr) is not None for p in parts)

    numel = sum(p.numel for p in parts) if all_have("numel") else None
    mx = max(p.max for p in parts) if all_have("max") else None
    mn = min(p.min for p in parts) if all_have("min") else None
    # Weights as ratios and hypot for the norm: no intermediate overflows for huge values or counts.
    mean = (sum(p.mean * (p.numel / numel) for p in parts)
            if all_have("mean") and numel else None)
    norm = math.hypot(*(p.norm for p in parts)) if all_have("norm") else None
    dtypes = {p.dtype for p in parts}
    return Stats(mx, mn, mean, norm, numel, dtypes.pop() if len(dtypes) == 1 else None,
                 all(p.is_int for p in parts))


def _finite(x):
    return x is not None and math.isfinite(x)


def nonfinite_one_side(a: Stats, b: Stats) -> bool:
    """A NaN/Inf statistic on one side where the other side's is finite."""
    for attr in ("max", "min", "mean", "norm"):
        x, y = getattr(a, attr), getattr(b, attr)
        if x is None or y is None:
            continue
        if _finite(x) != _finite(y):
            return True
    return False


def stat_errors(t: Stats, r: Stats) -> dict:
    """Raw and scaled differences between two statistics sets (rollout minus train)."""
    out: dict = {}
    for attr in ("max", "min", "mean", "norm"):
        x, y = getattr(t, attr), getattr(r, attr)
        if x is None or y is None or not (_finite(x) and _finite(y)):
            out[f"{attr}_diff"] = None
            out[f"{attr}_rel"] = None
            continue
        d = y - x
        out[f"{attr}_diff"] = d
        out[f"{attr}_rel"] = abs(d) / abs(x) if x != 0 else (0.0 if d == 0 else math.inf)
    scaled = []
    amax = max((abs(v) for v in (t.max, t.min, r.max, r.min) if _finite(v)), default=None)
    if out.get("norm_diff") is not None:
        denom = max(abs(t.norm), abs(r.norm))
        scaled.append(abs(out["norm_diff"]) / denom if denom > 0 else 0.0)
    if out.get("mean_diff") is not None:
        rms = None
        if _finite(t.norm) and _finite(r.norm) and (t.numel or r.numel):
            rms = max(abs(t.norm), abs(r.norm)) / math.sqrt(float(min(max(t.numel or 1, r.numel or 1), 1e300)))
        scale = rms if rms else amax
        scaled.append(abs(out["mean_diff"]) / scale if scale else (0.0 if out["mean_diff"] == 0 else math.inf))
    for attr in ("max", "min"):
        if out.get(f"{attr}_diff") is not None:
            if t.is_int or r.is_int:
                scaled.append(0.0 if out[f"{attr}_diff"] == 0 else math.inf)
            elif amax:
                scaled.append(abs(out[f"{attr}_diff"]) / amax)
            else:
                scaled.append(0.0 if out[f"{attr}_diff"] == 0 else math.inf)
    out["scaled_error"] = max(scaled) if scaled else None
    return out
