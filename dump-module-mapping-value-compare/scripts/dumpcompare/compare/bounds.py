"""What statistics prove when one side holds one token row more (references/generation_bounds.md).

A generation engine feeds the prompt, then each sampled token but the last; a trainer scoring
prompt + response feeds that last token too. With the engine's calls stitched, its elements are
the trainer's minus one token row, so the two sides' statistics cannot be compared as equal, but
they bound each other: the engine's Max/Min lie within the trainer's, its element count is the
trainer's minus one row, its Norm^2 is at most the trainer's and short of it by no more than one
row can hold, and the last row's sum (from the Means) must fit that row's Norm and range. A bound
broken beyond the dtype tolerance proves a divergence; bounds that all hold prove nothing more than
"consistent, not verified".

Every bound is checked the way the equal-token comparison grades a difference (stats.py): the
excess over the bound is scaled by the statistic's magnitude (Max/Min by max |x|, Norm by Norm,
a sum by the RMS times the count) and broken when that exceeds the pair tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .stats import ATTRS, Stats, combine

# The bounds in the order they are reported (output_3 ``bounds.checked``).
BOUNDS = ("count", "max", "min", "norm_upper", "norm_lower", "last_row_sum")


@dataclass
class Verdict:
    """How the pieces of one side (calls, parts) fit inside the other side's whole.

    ``status`` is ``bounded`` (every checked bound holds: consistent, not verified), ``mismatch``
    (a bound broken beyond tolerance) or ``nonfinite`` (a piece holds NaN/Inf while the whole,
    which contains it, has none). ``error`` is the largest scaled excess over the bounds;
    ``broken`` names the first broken bound in BOUNDS order (a piece's Max or Min before the
    sums, which one wrong Norm breaks too) and ``piece`` the piece that breaks it, when one does.
    """
    status: str
    error: float
    checked: list[str]
    broken: str | None = None
    piece: int | None = None
    detail: str | None = None


def _finite(s: Stats) -> bool:
    return all(getattr(s, a) is None or math.isfinite(getattr(s, a)) for a in ATTRS)


def _scaled(excess: float, scale: float) -> float:
    """Excess over a bound as a share of its scale (0 when within, inf past a zero scale)."""
    if excess <= 0:
        return 0.0
    return excess / scale if scale > 0 else math.inf


def judge(pieces: list[Stats], whole: Stats, row: int, tol: float) -> Verdict | None:
    """Judge statistics of ``pieces`` (one side's calls, whose elements together are the other
    side's minus one token row of ``row`` elements) against the statistics of ``whole``.

    ``tol`` is the pair tolerance of the statistics (tolerances.yaml; 0 for integer tensors).
    None when the bounds cannot be checked: folded per-call arrays, or a NaN/Inf in the whole
    (the extra row may hold it).
    """
    every = [*pieces, whole]
    if any(isinstance(getattr(s, a), np.ndarray) for s in every for a in ATTRS):
        return None
    if not _finite(whole):
        return None
    bad = next((i for i, p in enumerate(pieces) if not _finite(p)), None)
    if bad is not None:
        return Verdict("nonfinite", math.inf, [], "nonfinite", bad,
                       "NaN/Inf in these rows, none in the other side's rows that contain them")
    both = combine(pieces)
    found: dict[str, tuple[float, int | None, str]] = {}     # bound -> (scaled excess, piece, detail)
    if whole.numel is not None and both.numel is not None:
        found["count"] = (0.0 if whole.numel - both.numel == row else math.inf, None,
                          f"{both.numel} + one row of {row} elements != {whole.numel}")
    n = row
    extremes = [abs(v) for s in every for v in (s.max, s.min) if v is not None]
    amax = max(extremes, default=0.0)
    # Each piece's Max and Min lie within the whole's: the whole holds every element of the piece.
    for attr, sign in (("max", 1.0), ("min", -1.0)):
        if getattr(whole, attr) is None or any(getattr(p, attr) is None for p in pieces):
            continue
        excess = [sign * (getattr(p, attr) - getattr(whole, attr)) for p in pieces]
        worst = max(range(len(pieces)), key=lambda i: excess[i])
        found[attr] = (_scaled(excess[worst], amax), worst,
                       f"{attr.capitalize()} {getattr(pieces[worst], attr):.6g} vs {getattr(whole, attr):.6g}")
    if whole.norm is not None and both.norm is not None:
        nt, ne = whole.norm, both.norm
        scale = max(nt, ne)
        # Norm^2 adds over disjoint elements: the pieces' is the whole's minus the extra row's, which
        # is >= 0, and at most n * max|x|^2 because the whole's Max/Min bound that row's elements.
        found["norm_upper"] = (_scaled(ne - nt, scale), None, f"Norm {ne:.6g} over the other side's {nt:.6g}")
        if whole.max is not None and whole.min is not None:
            reach = math.hypot(ne, math.sqrt(n) * max(abs(whole.max), abs(whole.min)))
            found["norm_lower"] = (_scaled(nt - reach, scale), None,
                                   f"Norm {nt:.6g} beyond {reach:.6g}, what these rows and one row within "
                                   f"[{whole.min:.6g}, {whole.max:.6g}] can reach")
        if whole.mean is not None and both.mean is not None and whole.numel and both.numel is not None:
            found["last_row_sum"] = _last_row_sum(whole, both, n, tol, amax)
    checked = [b for b in BOUNDS if b in found]
    err = max((found[b][0] for b in checked), default=0.0)
    if err <= tol:
        return Verdict("bounded", err, checked)
    broken = next(b for b in checked if found[b][0] > tol)
    return Verdict("mismatch", err, checked, broken, found[broken][1], found[broken][2])


def _last_row_sum(whole: Stats, both: Stats, n: int, tol: float, amax: float) -> tuple[float, None, str]:
    """The extra row's sum, from the Means, against what its Norm and the whole's range allow.

    Its sum is the whole's minus the pieces'; Cauchy-Schwarz bounds it by sqrt(n) times its Norm,
    and its elements lie within the whole's Min/Max. Its Norm^2 is the difference of two rounded
    Norm^2, so it is taken at the far end of the Norm tolerance (pieces' Norm smaller by ``tol``):
    the test must not break from the Norms' rounding, which a near-zero last row magnifies.
    """
    nt, ne = whole.norm, both.norm
    s = whole.mean * whole.numel - both.mean * both.numel
    ne_low = max(0.0, ne - tol * max(nt, ne))
    reach = math.sqrt(n * max(0.0, nt * nt - ne_low * ne_low))
    lo, hi = -reach, reach
    if whole.max is not None and whole.min is not None:
        lo, hi = max(lo, n * whole.min), min(hi, n * whole.max)
    excess = max(lo - s, s - hi)
    # The Mean's scale is the RMS (stats.py); the sum's is the RMS times the count.
    scale = nt * math.sqrt(whole.numel) if nt else amax * whole.numel
    return _scaled(excess, scale), None, f"last row's sum {s:.6g} outside [{lo:.6g}, {hi:.6g}]"
