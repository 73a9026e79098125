"""Statistics-mode comparison: combine shard/part statistics exactly, then scale the errors.

Raw relative errors of a Mean near zero flag every module of a real bf16 dump, so each
statistic's difference is scaled by the tensor's magnitude instead: Norm by Norm, Mean by
the RMS (Norm / sqrt(numel)), Max and Min by max |x|.

Every statistic is either a float (one call) or a float64 array with one value per call of a
folded module (loaders/folding.py); the math below is written once, in numpy, for both. In the
arrays returned per call, NaN stands for "no value" (the None of the one-call results).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np

from .sides import StatErrors

Value = Union[float, np.ndarray, None]
ATTRS = ("max", "min", "mean", "norm")
# The names of stat_error_calls' arrays (sides.StatErrors' fields), made once.
_DIFF_REL = {a: (f"{a}_diff", f"{a}_rel") for a in ATTRS}


@dataclass
class Stats:
    """The four msprobe statistics of one (possibly combined) tensor, for one call or per call."""
    max: Value
    min: Value
    mean: Value
    norm: Value
    numel: int | None
    dtype: str | None
    is_int: bool = False


def _is_scalar(parts: list[Stats]) -> bool:
    return not any(isinstance(getattr(p, a), np.ndarray) for p in parts for a in ATTRS)


def _scalar(x):
    """Back from a one-element array to the one-call form: float, or None for NaN."""
    v = float(x[0])
    return None if math.isnan(v) else v


def combine(parts: list[Stats]) -> Stats:
    """Statistics of the concatenation of ``parts`` (order does not matter for these four).

    Max of Max, min of Min, element-weighted Mean and root-sum-square Norm are exact; a
    missing statistic in any part makes the combined one missing.
    """
    if len(parts) == 1:
        return parts[0]

    def all_have(attr):
        return all(getattr(p, attr) is not None for p in parts)

    scalar = _is_scalar(parts)

    def stacked(attr):
        # One-call parts (a generation's calls, taken one by one) build their column in one go.
        if scalar:
            return np.array([[getattr(p, attr)] for p in parts], dtype=np.float64)
        return np.stack([np.atleast_1d(np.asarray(getattr(p, attr), dtype=np.float64)) for p in parts])

    numel = sum(p.numel for p in parts) if all_have("numel") else None
    out = {a: None for a in ATTRS}
    with np.errstate(all="ignore"):
        if all_have("max"):
            out["max"] = np.max(stacked("max"), axis=0)
        if all_have("min"):
            out["min"] = np.min(stacked("min"), axis=0)
        # Weights as ratios and hypot for the norm: no intermediate overflows for huge values or counts.
        if all_have("mean") and numel:
            weights = np.array([[p.numel / numel] for p in parts])
            out["mean"] = np.sum(stacked("mean") * weights, axis=0)
        if all_have("norm"):
            out["norm"] = np.hypot.reduce(stacked("norm"), axis=0)
    if scalar:
        out = {a: None if v is None else float(v[0]) for a, v in out.items()}
    dtypes = {p.dtype for p in parts}
    return Stats(out["max"], out["min"], out["mean"], out["norm"], numel,
                 dtypes.pop() if len(dtypes) == 1 else None, all(p.is_int for p in parts))


def _arrays(t: Stats, r: Stats) -> dict:
    """Every present statistic of both sides as float64 arrays of one common length."""
    vals = {(s, a): getattr(x, a) for s, x in (("t", t), ("r", r)) for a in ATTRS}
    n = max((v.shape[0] for v in vals.values() if isinstance(v, np.ndarray)), default=1)
    return {k: None if v is None else v if isinstance(v, np.ndarray) else np.full(n, v, dtype=np.float64)
            for k, v in vals.items()}


def nonfinite_one_side_calls(t: Stats, r: Stats) -> np.ndarray:
    """Per call: a NaN/Inf statistic on one side where the other side's is finite."""
    v = _arrays(t, r)
    n = next((len(x) for x in v.values() if x is not None), 1)
    out = np.zeros(n, dtype=bool)
    for a in ATTRS:
        x, y = v[("t", a)], v[("r", a)]
        if x is not None and y is not None:
            out |= np.isfinite(x) != np.isfinite(y)
    return out


def nonfinite_one_side(a: Stats, b: Stats) -> bool:
    """A NaN/Inf statistic on one side where the other side's is finite (any call)."""
    if _floats(a, b):
        isfinite = math.isfinite
        for x, y in ((a.max, b.max), (a.min, b.min), (a.mean, b.mean), (a.norm, b.norm)):
            if x is not None and y is not None and isfinite(x) != isfinite(y):
                return True
        return False
    return bool(nonfinite_one_side_calls(a, b).any())


def _floats(t: Stats, r: Stats) -> bool:
    """Both sides one call, every statistic a Python float or absent: the case of nearly every
    comparison of a dump whose calls do not fold, where numpy on one-element arrays cost ~20x the
    float arithmetic itself (issue 28, item 4)."""
    # A plain loop: asked twice per comparison, where a generator's frame cost more than the test.
    for v in (t.max, t.min, t.mean, t.norm, r.max, r.min, r.mean, r.norm):
        if v is not None and type(v) is not float:
            return False
    return True


def _truthy(x: np.ndarray) -> np.ndarray:
    """Where a scale exists and is not zero (NaN stands for a missing scale)."""
    return ~np.isnan(x) & (x != 0)


def _ratio_or_inf(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """|num| / den where den is a usable scale, else 0 for no difference and inf for any."""
    return np.where(_truthy(den), np.abs(num) / np.where(_truthy(den), den, 1.0), np.where(num == 0, 0.0, np.inf))


def stat_error_calls(t: Stats, r: Stats, extremes: bool = True) -> dict[str, np.ndarray]:
    """Per call: raw and scaled differences (rollout minus train); NaN where there is no value.
    ``extremes=False``: the scaled error of the reductions (Norm, Mean) only, as a generation's calls
    are judged against the reference (references/reference_forward_evidence.md says why)."""
    v = _arrays(t, r)
    n = next((len(x) for x in v.values() if x is not None), 1)
    nan = np.full(n, np.nan)
    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for a in ATTRS:
            x, y = v[("t", a)], v[("r", a)]
            if x is None or y is None:
                out[_DIFF_REL[a][0]] = out[_DIFF_REL[a][1]] = nan
                continue
            ok = np.isfinite(x) & np.isfinite(y)
            d = np.where(ok, y - x, np.nan)
            rel = np.where(x != 0, np.abs(d) / np.where(x != 0, np.abs(x), 1.0), np.where(d == 0, 0.0, np.inf))
            out[_DIFF_REL[a][0]], out[_DIFF_REL[a][1]] = d, np.where(ok, rel, np.nan)
        ends = [np.where(np.isfinite(x), np.abs(x), np.nan)
                for x in (v[("t", "max")], v[("t", "min")], v[("r", "max")], v[("r", "min")]) if x is not None]
        amax = np.fmax.reduce(ends) if ends else nan
        scaled = []
        tn, rn = v[("t", "norm")], v[("r", "norm")]
        nd = out["norm_diff"]
        if tn is not None and rn is not None:
            denom = np.maximum(np.abs(tn), np.abs(rn))
            scaled.append(np.where(np.isnan(nd), np.nan, np.where(denom > 0, np.abs(nd) / np.where(denom > 0, denom, 1.0), 0.0)))
        md = out["mean_diff"]
        if v[("t", "mean")] is not None and v[("r", "mean")] is not None:
            rms = nan
            if tn is not None and rn is not None and (t.numel or r.numel):
                count = math.sqrt(float(min(max(t.numel or 1, r.numel or 1), 1e300)))
                rms = np.where(np.isfinite(tn) & np.isfinite(rn), np.maximum(np.abs(tn), np.abs(rn)) / count, np.nan)
            scale = np.where(_truthy(rms), rms, amax)
            scaled.append(np.where(np.isnan(md), np.nan, _ratio_or_inf(md, scale)))
        for a in ("max", "min") if extremes else ():
            dd = out[f"{a}_diff"]
            if v[("t", a)] is None or v[("r", a)] is None:
                continue
            if t.is_int or r.is_int:
                s = np.where(dd == 0, 0.0, np.inf)
            else:
                s = _ratio_or_inf(dd, amax)
            scaled.append(np.where(np.isnan(dd), np.nan, s))
        out["scaled_error"] = np.fmax.reduce(scaled) if scaled else nan
    return out


def stat_errors(t: Stats, r: Stats, extremes: bool = True) -> StatErrors:
    """Raw and scaled differences between two one-call statistics sets (None where there is none);
    ``extremes`` as stat_error_calls has it."""
    if _floats(t, r):
        return _float_errors(t, r, extremes)
    return StatErrors(**{k: _scalar(v) for k, v in stat_error_calls(t, r, extremes).items()})


_INF, _NAN = math.inf, math.nan


def _fmax(values: list[float]) -> float:
    """np.fmax.reduce of floats: the largest that is not NaN; NaN when there is none."""
    kept = [v for v in values if v == v]
    return max(kept) if kept else _NAN


def _truthy_float(x: float) -> bool:
    return x == x and x != 0


def _ratio_float(num: float, den: float) -> float:
    return abs(num) / den if _truthy_float(den) else (0.0 if num == 0 else _INF)


def _float_errors(t: Stats, r: Stats, extremes: bool = True) -> StatErrors:
    """stat_errors for one call of floats, in float arithmetic: the same IEEE operations in the same
    order as stat_error_calls, so the same values, None where it has NaN (no value);
    tests/compare/test_stats_floats.py holds the two to each other."""
    # A clean pair's statistics are mostly equal (half the values of the many-module pair are zero):
    # each +0.0 is the one object, not a float of its own held by every result.
    vals: list[float | None] = []       # StatErrors' order: diff and rel of max, min, mean, norm
    isfinite, copysign = math.isfinite, math.copysign
    for x, y in ((t.max, r.max), (t.min, r.min), (t.mean, r.mean), (t.norm, r.norm)):
        if x is None or y is None or not (isfinite(x) and isfinite(y)):
            vals += (None, None)
            continue
        d = y - x
        if not d and copysign(1.0, d) > 0:
            d = 0.0
        vals += (d, (abs(d) / abs(x) if d else 0.0) if x != 0 else (0.0 if d == 0 else _INF))
    amax = _fmax([abs(x) if isfinite(x) else _NAN for x in (t.max, t.min, r.max, r.min) if x is not None])
    scaled = []
    tn, rn, nd = t.norm, r.norm, vals[6]
    nd = _NAN if nd is None else nd
    if tn is not None and rn is not None:
        # np.maximum propagates NaN where max() would not.
        denom = _NAN if tn != tn or rn != rn else max(abs(tn), abs(rn))
        scaled.append(_NAN if nd != nd else (abs(nd) / denom if denom > 0 else 0.0))
    md = vals[4]
    md = _NAN if md is None else md
    if t.mean is not None and r.mean is not None:
        rms = _NAN
        if tn is not None and rn is not None and (t.numel or r.numel):
            count = math.sqrt(float(min(max(t.numel or 1, r.numel or 1), 1e300)))
            rms = max(abs(tn), abs(rn)) / count if isfinite(tn) and isfinite(rn) else _NAN
        scale = rms if _truthy_float(rms) else amax
        scaled.append(_NAN if md != md else _ratio_float(md, scale))
    for dd, x, y in ((vals[0], t.max, r.max), (vals[2], t.min, r.min)) if extremes else ():
        if x is None or y is None:
            continue
        if dd is None:
            dd = _NAN
        if t.is_int or r.is_int:
            s = 0.0 if dd == 0 else _INF
        else:
            s = _ratio_float(dd, amax)
        scaled.append(_NAN if dd != dd else s)
    err = _fmax(scaled)
    return StatErrors(*vals, None if err != err else 0.0 if err == 0 else err)
