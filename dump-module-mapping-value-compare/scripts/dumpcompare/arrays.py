"""Leaf arrays: one dumped leaf read as an array, values rounded to a side's dtype, the relative
error every replay, reference check and tensor comparison uses, and the parsed form of a leaf's
merge rule (how tensor-parallel ranks were joined, unshard.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import tensorio


@dataclass(frozen=True)
class Merge:
    """A leaf's merge rule, parsed: ``kind`` is None (one rank), "concat" (along ``dim``), "sum"
    (partial sums) or "replicated"; the published string form stays on ``Leaf.merge``."""
    kind: str | None
    dim: int | None = None

    @property
    def is_concat(self) -> bool:
        """The ranks' shards were laid side by side along ``dim``."""
        return self.kind == "concat"

    @property
    def is_sum(self) -> bool:
        """Each rank holds a partial sum (statistics of the parts do not combine)."""
        return self.kind == "sum"


def merge_rule(rule: str | None) -> Merge:
    """Parse ``"concat:<dim>"``, ``"sum"``, ``"replicated"`` or None (not merged)."""
    if not rule:
        return Merge(None)
    kind, _, dim = rule.partition(":")
    return Merge(kind, int(dim) if kind == "concat" else None)


def leaf_array(view, leaf) -> np.ndarray | None:
    """One dumped leaf as an array (tensor-parallel ranks concatenated as merged), None without files."""
    if not leaf.data_name:
        return None
    files = leaf.shards or ((view.dump.dump_dir, leaf.data_name, view.dump.dump_data_dir),)
    try:
        got = [tensorio.load_tensor(tensorio.resolve_data_file(*f)) for f in files]
    except tensorio.TensorReadError:
        return None
    rule = merge_rule(leaf.merge)
    return np.concatenate(got, axis=rule.dim if rule.is_concat else 0) if len(got) > 1 else got[0]


def to_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to the side's dtype, as float32 (float64 kept for float64 sides)."""
    if dtype == "bfloat16":
        return tensorio.widen_bf16(tensorio.bfloat16_bits(a))
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype == "float64":
        return a.astype(np.float64)
    return a.astype(np.float32)


def relative(diff_norm: float, ref_norm: float) -> float:
    """||a - ref|| / ||ref|| from the two norms: 0 when both are 0, infinite when only the
    reference is 0 (any difference from an all-zero tensor is a total one)."""
    return diff_norm / ref_norm if ref_norm > 0 else (0.0 if diff_norm == 0 else math.inf)


def rel_error(a: np.ndarray, ref: np.ndarray) -> float:
    """Relative L2 error of ``a`` against ``ref`` (:func:`relative`); the shapes must agree."""
    if a.shape != ref.shape:
        raise ValueError(f"replay shape {a.shape} is not the output's {ref.shape}")
    return relative(float(np.linalg.norm(a - ref)), float(np.linalg.norm(ref)))
