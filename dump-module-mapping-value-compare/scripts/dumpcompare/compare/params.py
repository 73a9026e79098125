"""Parameter equality: are the two sides' copies of one parameter the same tensor?

This module owns the answer (output_3 ``param_equality``); the root-cause skill and the reference
checks read it and never re-derive it. Why each rule holds is in references/tolerances.md
("Parameters").

* md5/crc on every leaf of both sides (msprobe ``summary_mode: md5``): equal digests, exact.
* Tensors read: equal iff every element is equal (``max_abs == 0``), exact.
* Statistics only: Max and Min of a parameter are elements of it, exact in any dtype and under
  any permutation, shard merge or fused concatenation. Different Max or Min (after rounding the
  wider dtype to the narrower one) prove different tensors. Equal Max and Min with Mean and Norm
  within tolerance are "equal as far as statistics show": a small update can leave all four
  unchanged, so the answer is not exact.
"""
from __future__ import annotations

import numpy as np

from ..tensorio import bfloat16_bits, widen_bf16

# Widths in mantissa bits, for rounding the wider side's Max/Min to the narrower dtype.
_NARROW = {"bfloat16": "bfloat16", "float16": "float16"}


def _round_to(value: float, dtype: str) -> float:
    """``value`` rounded to nearest-even in ``dtype`` (bfloat16 or float16), as a float."""
    if dtype == "float16":
        return float(np.float16(value))
    return float(widen_bf16(bfloat16_bits(np.array([value], dtype=np.float32)))[0])


def _same_extreme(a, b, dt: str, dr: str) -> bool:
    if a is None or b is None:
        return True
    if dt != dr:
        narrow = _NARROW.get(dr) if dr in _NARROW else _NARROW.get(dt)
        if narrow is None:
            return True          # other dtypes (fp8, quantized ints): no exact statement
        a, b = _round_to(a, narrow), _round_to(b, narrow)
    return a == b


def by_checksum(tl: list, rl: list) -> dict | None:
    """Equality from md5/crc digests, when every leaf of one-leaf sides has one."""
    if len(tl) != 1 or len(rl) != 1 or not tl[0].checksum or not rl[0].checksum:
        return None
    same = tl[0].checksum == rl[0].checksum and tl[0].dtype == rl[0].dtype and tl[0].shape == rl[0].shape
    return {"equal": same, "how": "md5", "exact": True,
            "detail": "equal digests" if same else f"digests differ ({tl[0].checksum} vs {rl[0].checksum})"}


def by_tensor(max_abs: float | None) -> dict:
    """Equality from the compared tensors."""
    same = max_abs == 0.0
    return {"equal": same, "how": "tensor", "exact": True,
            "detail": "every element equal" if same else f"largest element difference {max_abs:.3g}"}


def by_statistics(ts, rs, dt: str, dr: str, within_tolerance: bool) -> dict:
    """Equality from Max/Min (exact) and Mean/Norm (``within_tolerance`` of their reduction noise)."""
    if ts.max is None or rs.max is None or ts.min is None or rs.min is None:
        return {"equal": None, "how": "statistics", "exact": False, "detail": "no Max/Min to compare"}
    extremes = _same_extreme(ts.max, rs.max, dt, dr) and _same_extreme(ts.min, rs.min, dt, dr)
    if not extremes:
        return {"equal": False, "how": "statistics", "exact": True,
                "detail": f"Max/Min differ (train {ts.max:.9g}/{ts.min:.9g}, rollout {rs.max:.9g}/{rs.min:.9g}): "
                          "they are elements of the tensor, so the tensors differ"}
    if not within_tolerance:
        return {"equal": False, "how": "statistics", "exact": False,
                "detail": "Max/Min equal but Mean/Norm differ beyond their reduction noise"}
    return {"equal": True, "how": "statistics", "exact": False,
            "detail": "Max/Min equal and Mean/Norm within noise; a small update can leave all four unchanged "
                      "(dump with summary_mode md5 to be sure)"}
