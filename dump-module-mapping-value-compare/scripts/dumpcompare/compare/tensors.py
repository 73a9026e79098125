"""Tensor-mode comparison: align layouts, then cosine, relative L2 and element errors."""
from __future__ import annotations

import numpy as np

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


def align(t: np.ndarray, r: np.ndarray, t_family: str, r_family: str, axis: str) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Bring two tensors to one shape; returns (t, r, note) or raises ValueError on conflict."""
    if axis == "features":
        t2, r2 = as_tokens(t, t_family), as_tokens(r, r_family)
        if t2.shape == r2.shape:
            return t2, r2, None if t.shape == r.shape else "layout aligned to [tokens, features]"
    t2, r2 = np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)
    if t2.shape == r2.shape:
        return t2, r2, None
    if t2.size == r2.size:
        return t2.reshape(-1), r2.reshape(-1), "flattened: same number of elements, different shapes"
    raise ValueError(f"shape conflict {tuple(t.shape)} vs {tuple(r.shape)}")


def metrics(t: np.ndarray, r: np.ndarray, rtol: float, atol: float) -> dict:
    """Cosine, relative L2, max abs/rel errors, fraction within tolerance, first bad token row."""
    d = r - t
    nt = float(np.linalg.norm(t))
    nr = float(np.linalg.norm(r))
    nd = float(np.linalg.norm(d))
    cos = float(np.dot(t.ravel(), r.ravel()) / (nt * nr)) if nt > 0 and nr > 0 else (1.0 if nt == nr else 0.0)
    bad = np.abs(d) > atol + rtol * np.abs(t)
    bad |= np.isnan(t) != np.isnan(r)
    first_token = None
    if bad.any():
        rows = bad.reshape(bad.shape[0], -1).any(axis=1) if bad.ndim >= 2 else bad
        first_token = int(np.argmax(rows))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(d) / (np.abs(t) + atol)
    return {
        "cosine": cos,
        "rel_l2": nd / nt if nt > 0 else (0.0 if nd == 0 else float("inf")),
        "max_abs": float(np.nanmax(np.abs(d))) if d.size else 0.0,
        "max_rel": float(np.nanmax(rel)) if rel.size else 0.0,
        "frac_within_tol": float(1.0 - bad.mean()) if bad.size else 1.0,
        "first_token_past_tol": first_token,
    }


def same_multiset(t: np.ndarray, r: np.ndarray, rtol: float, atol: float) -> bool:
    """True when the two tensors hold the same values in another order (a permutation)."""
    if t.size != r.size or t.size == 0:
        return False
    a, b = np.sort(t.ravel()), np.sort(r.ravel())
    return bool(np.all(np.abs(a - b) <= atol + rtol * np.abs(a)))


def stats_of(a: np.ndarray) -> tuple[float, float, float, float]:
    """Max, Min, Mean, Norm of an array (as msprobe computes them)."""
    if a.size == 0:
        return (float("nan"),) * 4
    return float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a.ravel()))
