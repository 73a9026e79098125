"""Tensor sources read block by block, so a comparison never holds more than a block in float64.

A planned comparison reads one or more leaves per side; each leaf is one tensor file, or one file
per tensor-parallel rank with a merge rule (unshard.py). The files are memory-mapped where the
format allows (``.npy``), and a comparison of big tensors walks them in blocks along an axis that
no layout step touches: the tokens of an activation (after [batch, seq] or [seq, batch] are
merged into one token axis) or the last axis of a weight. Every other step (joining fused parts,
regrouping qkv, trimming padded vocabulary, aligning layouts) then runs on one block at a time,
with the same code as for a whole tensor.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass

import numpy as np

from ..arrays import merge_rule
from ..tensorio import widen_bf16
from .tensors import BATCH_SEQ, SEQ_BATCH

# Float64 bytes of one side above which a comparison is streamed in blocks of about this size.
# Small blocks keep a block's float64 temporaries in cache; measured on the bench pair, 1 MB ran
# faster than 16 MB, and memory stays about 200 MB per process whatever the tensor size.
BLOCK_BYTES = 1 << 20


@dataclass
class Leafsrc:
    """One leaf's tensor: the arrays of its rank files (memory-mapped when possible) and how they merge.

    ``raw_bf16`` marks shards holding raw bfloat16 bits (tensorio.open_tensor), widened when read.
    """
    shards: list[np.ndarray]
    merge: str | None = None
    raw_bf16: bool = False

    def read(self, a: np.ndarray) -> np.ndarray:
        """Values of (a view of) one shard as float64."""
        return np.asarray(widen_bf16(a) if self.raw_bf16 else a, dtype=np.float64)

    @property
    def size(self) -> int:
        return sum(int(s.size) for s in self.shards) if merge_rule(self.merge).is_concat \
            else int(self.shards[0].size)

    def release(self) -> None:
        """Drop the pages of memory-mapped shards that a block read (they stay in the page cache)."""
        for a in self.shards:
            while a is not None and not isinstance(getattr(a, "_mmap", None), mmap.mmap):
                a = getattr(a, "base", None)
            if a is not None and hasattr(mmap, "MADV_DONTNEED"):
                a._mmap.madvise(mmap.MADV_DONTNEED)

    def whole(self) -> np.ndarray:
        """The merged tensor in memory (sums in float64, as the shards' sum may not fit their dtype)."""
        parts = [widen_bf16(p) if self.raw_bf16 else np.asarray(p) for p in self.shards]
        rule = merge_rule(self.merge)
        if len(parts) == 1 or rule.kind in (None, "replicated"):
            return parts[0]
        if rule.is_sum:
            return np.sum(np.stack([p.astype(np.float64) for p in parts]), axis=0)
        return np.concatenate(parts, axis=rule.dim)


def token_form(a: np.ndarray, family: str) -> np.ndarray:
    """[tokens, ...rest] view of an activation (no copy for the usual contiguous layouts)."""
    if a.ndim == 0:
        return a.reshape(1)
    if family in SEQ_BATCH and a.ndim >= 2:
        a = np.swapaxes(a, 0, 1)
    if (family in SEQ_BATCH or family in BATCH_SEQ) and a.ndim >= 2:
        return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])
    return a


class Blocks:
    """One side of a comparison as a list of parts, each readable block by block along one axis.

    Modes: ``tokens`` (activations): blocks of token rows, each returned as [rows, features]
    float64; a side whose calls are stitched reads its leaves one after the other along the
    tokens. ``rows`` (weights whose parts are simply stacked): blocks of rows of the stacked
    parts, contiguous in the files. ``columns`` (weights whose rows get regrouped): blocks of the
    last axis, each part returned in its own shape.
    """

    def __init__(self, leaves: list[Leafsrc], family: str, mode: str, stitched: bool):
        self.mode = mode
        self.tokens = mode == "tokens"
        self.family = family
        self.parts = [leaves] if stitched or mode == "rows" else [[lf] for lf in leaves]

    def length(self) -> int | None:
        """Size of the block axis, or None when the parts disagree on it (then read whole)."""
        lengths = {sum(self._len(lf) for lf in seq) for seq in self.parts}
        return lengths.pop() if len(lengths) == 1 else None

    def _len(self, lf: Leafsrc) -> int:
        a = lf.shards[0]
        ranks = len(lf.shards) if self._rank_axis(lf) == "block" else 1
        if self.tokens:
            return token_form(a, self.family).shape[0] * ranks
        return a.shape[0 if self.mode == "rows" else -1] * ranks if a.ndim else 1

    def streamable(self) -> bool:
        """Every leaf's merge rule leaves the block axis alone (or concatenates along it)."""
        for seq in self.parts:
            for lf in seq:
                if self._rank_axis(lf) == "other" or lf.shards[0].ndim == 0:
                    return False
                if self.mode == "columns" and lf.shards[0].ndim < 2:
                    return False
        return True

    def _rank_axis(self, lf: Leafsrc):
        """How the ranks of a leaf join: None (one copy, or a sum), 'block' (along the block axis),
        'other' (along a token axis that is not the block axis alone), or the axis of a block to
        concatenate the ranks' blocks along."""
        rule = merge_rule(lf.merge)
        if len(lf.shards) == 1 or rule.kind in (None, "replicated", "sum"):
            return None
        nd = lf.shards[0].ndim
        dim = rule.dim % max(nd, 1)
        if self.tokens:
            token_axes = {0, 1} if self.family in BATCH_SEQ | SEQ_BATCH and nd >= 2 else {0}
            if dim in token_axes:
                return "block" if len(token_axes) == 1 else "other"
            return -1 if dim == nd - 1 else "other"
        return "block" if dim == (0 if self.mode == "rows" else nd - 1) else dim

    def take(self, lo: int, hi: int) -> list[np.ndarray]:
        """Block [lo, hi) of every part, as float64."""
        return [self._take_seq(seq, lo, hi) for seq in self.parts]

    def release(self) -> None:
        """Let go of the file pages the last block touched."""
        for seq in self.parts:
            for lf in seq:
                lf.release()

    def _take_seq(self, seq: list[Leafsrc], lo: int, hi: int) -> np.ndarray:
        pieces, start = [], 0
        for lf in seq:
            n = self._len(lf)
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                pieces.append(self._take_leaf(lf, a - start, b - start))
            start += n
        return _cat(pieces, self.mode)

    def _take_leaf(self, lf: Leafsrc, lo: int, hi: int) -> np.ndarray:
        how = self._rank_axis(lf)
        if how == "block":
            n = self._len(lf) // len(lf.shards)
            return _cat([self._slice(lf, s, max(lo - i * n, 0), min(hi - i * n, n))
                         for i, s in enumerate(lf.shards) if lo < (i + 1) * n and hi > i * n], self.mode)
        if merge_rule(lf.merge).is_sum and len(lf.shards) > 1:
            return np.sum(np.stack([self._slice(lf, s, lo, hi) for s in lf.shards]), axis=0)
        if how is None:
            return self._slice(lf, lf.shards[0], lo, hi)
        return np.concatenate([self._slice(lf, s, lo, hi) for s in lf.shards], axis=how)

    def _slice(self, lf: Leafsrc, a: np.ndarray, lo: int, hi: int) -> np.ndarray:
        if self.tokens:
            return lf.read(token_form(a, self.family)[lo:hi]).reshape(hi - lo, -1)
        if self.mode == "rows":
            return lf.read(a[lo:hi])
        return lf.read(a[..., lo:hi])


def _cat(blocks: list[np.ndarray], mode: str) -> np.ndarray:
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=-1 if mode == "columns" else 0)


def block_ranges(length: int, bytes_per_unit: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of about ``BLOCK_BYTES`` each; never a last block of a single unit."""
    step = max(2, BLOCK_BYTES // max(1, bytes_per_unit))
    out = [(lo, min(lo + step, length)) for lo in range(0, length, step)]
    if len(out) > 1 and out[-1][1] - out[-1][0] < 2:
        out[-2:] = [(out[-2][0], length)]
    return out
