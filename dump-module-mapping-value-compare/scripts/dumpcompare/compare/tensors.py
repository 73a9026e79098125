"""Tensor-mode comparison: align layouts, then cosine, relative L2 and element errors."""
from __future__ import annotations

import math

import numpy as np

from ..arrays import relative

TOKEN_FIRST = {"vllm", "sglang"}      # [tokens, ...]
BATCH_SEQ = {"hf"}                    # [batch, seq, ...]
SEQ_BATCH = {"megatron"}              # [seq, batch, ...]


def as_tokens(arr: np.ndarray, family: str) -> np.ndarray:
    """Reshape an activation to [tokens, features] in (batch, seq) order for its engine.

    vLLM/SGLang put tokens first ([T, ...], ids [T]); HF has [batch, seq, ...] and Megatron
    [seq, batch, ...] (ids [batch, seq] / [seq, batch]); a 1-D tensor is one value per token.
    """
    a = np.asarray(arr, dtype=np.float64)
    if a.ndim == 0:
        return a.reshape(1, 1)
    if family in SEQ_BATCH and a.ndim >= 2:
        a = np.swapaxes(a, 0, 1)
    if (family in SEQ_BATCH or family in BATCH_SEQ) and a.ndim >= 2:
        return a.reshape(a.shape[0] * a.shape[1], -1)
    return a.reshape(a.shape[0], -1)


class ShapeConflict(ValueError):
    """The two tensors hold different numbers of elements: no layout makes them one shape."""


def align(t: np.ndarray, r: np.ndarray, t_family: str, r_family: str, axis: str) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Bring two tensors to one shape; returns (t, r, note) or raises ShapeConflict."""
    if axis == "features":
        t2, r2 = as_tokens(t, t_family), as_tokens(r, r_family)
        if t2.shape == r2.shape:
            return t2, r2, None if t.shape == r.shape else "layout aligned to [tokens, features]"
    t2, r2 = np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)
    if t2.shape == r2.shape:
        return t2, r2, None
    if t2.size == r2.size:
        return t2.reshape(-1), r2.reshape(-1), "flattened: same number of elements, different shapes"
    raise ShapeConflict(f"shape conflict {tuple(t.shape)} vs {tuple(r.shape)}")


def _norm(a: np.ndarray) -> float:
    """L2 norm without BLAS: BLAS threads would fight the worker processes for the cores."""
    flat = a.ravel()
    return math.sqrt(float(np.einsum("i,i->", flat, flat)))


class Metrics:
    """Tensor metrics accumulated block by block (a whole tensor is one block).

    Norms are combined with hypot (no overflow of a sum of squares), counts and dot products are
    summed, maxima kept; ``first_token_past_tol`` is the first row, over all blocks, holding an
    element past the element tolerance. Blocks must be float64, with NaN/Inf already zeroed.
    """

    def __init__(self, rtol: float, atol: float, per_token: bool = False):
        self.rtol, self.atol = rtol, atol
        self.nt = self.nr = self.nd = self.dot = 0.0
        # Per-row relative L2 error, kept only when asked (layer outputs: the token x layer map).
        self.rows: list[np.ndarray] | None = [] if per_token else None
        self.max_abs = self.max_rel = np.nan
        self.bad = self.size = 0
        self.first_token: int | None = None

    def add(self, t: np.ndarray, r: np.ndarray, row0: int = 0) -> None:
        """Fold in one block; ``row0`` is the index of its first row in the whole tensor."""
        d = r - t
        ad = np.abs(d)
        at = np.abs(t)
        self.nt = float(np.hypot(self.nt, _norm(t)))
        self.nr = float(np.hypot(self.nr, _norm(r)))
        nd = _norm(d)
        self.nd = float(np.hypot(self.nd, nd))
        self.dot += float(np.einsum("i,i->", t.ravel(), r.ravel()))
        bad = ad > self.atol + self.rtol * at
        if bad.any():
            rows = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim >= 2 else bad
            first = row0 + int(np.argmax(rows))
            self.first_token = first if self.first_token is None else min(self.first_token, first)
        self.bad += int(np.count_nonzero(bad))
        self.size += int(d.size)
        if self.rows is not None and d.ndim == 2:
            with np.errstate(divide="ignore", invalid="ignore"):
                nrow = np.sqrt(np.einsum("ij,ij->i", d, d))
                trow = np.sqrt(np.einsum("ij,ij->i", t, t))
                self.rows.append(np.where(trow > 0, nrow / trow, np.where(nrow > 0, np.inf, 0.0)))
        if d.size:
            at += self.atol
            with np.errstate(divide="ignore", invalid="ignore"):
                self.max_abs = float(np.fmax(self.max_abs, np.nanmax(ad)))
                self.max_rel = float(np.fmax(self.max_rel, np.nanmax(np.divide(ad, at, out=at))))

    def result(self) -> dict:
        """Cosine, relative L2, max abs/rel errors, fraction within tolerance, first bad token row."""
        nt, nr, nd = self.nt, self.nr, self.nd
        return {
            "cosine": self.dot / (nt * nr) if nt > 0 and nr > 0 else (1.0 if nt == nr else 0.0),
            "rel_l2": relative(nd, nt),
            "max_abs": self.max_abs if self.size else 0.0,
            "max_rel": self.max_rel if self.size else 0.0,
            "frac_within_tol": 1.0 - self.bad / self.size if self.size else 1.0,
            "first_token_past_tol": self.first_token,
            **({"per_token": compact(np.concatenate(self.rows))} if self.rows else {}),
        }


PER_TOKEN_MAX = 256     # longest per-token vector written to output_3; longer ones keep bucket maxima


def compact(values: np.ndarray, limit: int = PER_TOKEN_MAX) -> dict:
    """A per-token vector small enough for output_3: at most ``limit`` values, 3 significant digits.

    Longer sequences are cut into ``bucket`` consecutive tokens and keep each bucket's maximum, so
    a bad token is never averaged away.
    """
    n = int(values.size)
    bucket = max(1, -(-n // limit))
    if bucket > 1:
        pad = np.full(bucket * -(-n // bucket) - n, -np.inf)
        values = np.max(np.concatenate([values, pad]).reshape(-1, bucket), axis=1)
    return {"tokens": n, "bucket": bucket, "values": [float(f"{v:.3g}") for v in values.tolist()]}


class Moments:
    """Max, Min, Mean and Norm of a tensor accumulated block by block (as msprobe computes them)."""

    def __init__(self):
        self.max = self.min = None
        self.sum = self.norm = 0.0
        self.size = 0

    def add(self, a: np.ndarray) -> None:
        """Fold in one block."""
        if not a.size:
            return
        mx, mn = float(a.max()), float(a.min())
        self.max = mx if self.max is None else float(np.maximum(self.max, mx))
        self.min = mn if self.min is None else float(np.minimum(self.min, mn))
        self.sum += float(a.sum())
        self.norm = float(np.hypot(self.norm, _norm(a)))
        self.size += int(a.size)

    def result(self) -> tuple[float, float, float, float]:
        """(max, min, mean, norm); NaN for an empty tensor."""
        if not self.size:
            return (float("nan"),) * 4
        return self.max, self.min, self.sum / self.size, self.norm


def same_multiset(t: np.ndarray, r: np.ndarray, rtol: float, atol: float) -> bool:
    """True when the two tensors hold the same values in another order (a permutation)."""
    if t.size != r.size or t.size == 0:
        return False
    a, b = np.sort(t.ravel()), np.sort(r.ravel())
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(a)))
