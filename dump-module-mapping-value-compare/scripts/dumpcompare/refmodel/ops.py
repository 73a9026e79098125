"""The numpy math of the standard decoder modules, float32 throughout.

``rnd`` is the rounding applied at an engine's rounding point: identity in fp32, round to
nearest-even bfloat16 (kept as float32 values) in bf16. Inside a module the math stays float32,
as transformers' kernels accumulate in float32. Where each family rounds and why:
references/reference_forward.md.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..replay.kernels import activation

Round = Callable[[np.ndarray], np.ndarray]


def identity(a: np.ndarray) -> np.ndarray:
    """fp32 rounding point: the value as computed (float32)."""
    return np.asarray(a, dtype=np.float32)


def bf16(a: np.ndarray) -> np.ndarray:
    """bf16 rounding point: round to nearest even bfloat16 (as torch casts), held as float32.

    The same rounding as tensorio.bfloat16_bits, done in place on the float32 bits: a forward
    rounds weight blocks of tens of millions of values, and 64-bit temporaries would cost
    eight times the block."""
    x = np.array(a, dtype=np.float32)
    bits = x.view(np.uint32)
    carry = (bits >> 16) & 1
    carry += 0x7FFF
    nan = np.isnan(x)
    bits += carry       # finite and infinite values cannot wrap (at most 0xFF807FFF)
    del carry
    bits &= 0xFFFF0000
    if nan.any():       # a NaN's bits may have wrapped: the quiet NaN, as torch writes it
        x[nan] = np.nan
    return x


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, rnd: Round, plus_one: bool = False) -> np.ndarray:
    """RMSNorm over the last axis. Llama-style scales the rounded normalised value by ``w`` (two
    roundings); Gemma-style (``plus_one``) scales by ``1 + w`` in float32 and rounds once."""
    x32 = np.asarray(x, dtype=np.float32)
    y = x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    if plus_one:
        return rnd(y * (np.float32(1.0) + w))
    return rnd(w * rnd(y))


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, rnd: Round) -> np.ndarray:
    """x @ w.T (+ b), accumulated in float32, rounded once."""
    y = x @ w.T
    return rnd(y + b if b is not None else y)


def act(name: str, x: np.ndarray, rnd: Round) -> np.ndarray:
    """The activation ``name`` (silu, gelu, gelu_tanh, relu) of ``x``, rounded."""
    with np.errstate(over="ignore"):    # exp(-x) overflows to inf for very negative x: silu -> 0
        return rnd(activation(name, np.asarray(x, dtype=np.float32)).astype(np.float32))


def rope_tables(inv_freq: np.ndarray, positions: np.ndarray, rnd: Round) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [tokens, rotary dim] of the positions (both halves repeat, as transformers lays them)."""
    ang = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return rnd(np.cos(ang)), rnd(np.sin(ang))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rnd: Round) -> np.ndarray:
    """Rotate the first ``cos.shape[-1]`` features of each head of x [tokens, heads, head_dim]
    by halves (neox / transformers ``rotate_half``); the rest pass through."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    half = d // 2
    turned = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    # transformers rotates in the activation dtype: each product and the sum round
    out = rnd(rnd(rot * cos[:, None, :]) + rnd(turned * sin[:, None, :]))
    return np.concatenate([out, rest], axis=-1)


ATTENTION = ("eager", "flash", "fp32")


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, softcap: float | None,
              window: int | None, rnd: Round, kernel: str = "eager") -> np.ndarray:
    """Causal grouped-query attention of q [T, H, D], k/v [T, KV, D] -> [T, H * D], rounded.

    One sequence, masked by token order: token i sees tokens j <= i (and j > i - window with a
    sliding window), whatever position ids the rotary embedding was given. ``kernel`` says where
    the attention kernel rounds (bf16 only): ``eager`` as transformers' eager attention (the
    scores, the scaled and soft-capped scores and the probabilities each rounded), ``flash`` as
    flash-attention (scores in float32, probabilities rounded before p @ v), ``fp32`` (nothing
    rounded before the output)."""
    t, h, d = q.shape
    group = h // k.shape[1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    allowed = j <= i
    if window:
        allowed &= j > i - window
    inner = rnd if kernel == "eager" else identity
    out = np.empty((t, h, d), dtype=np.float32)
    for head in range(h):   # one head at a time: the scores of a long sequence are T x T each
        kv = head // group
        scores = inner(inner(q[:, head] @ k[:, kv].T) * np.float32(scale))
        if softcap:
            scores = inner(inner(np.tanh(inner(scores / np.float32(softcap)))) * np.float32(softcap))
        scores = np.where(allowed, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        if kernel != "fp32":
            p = rnd(p)
        out[:, head] = p @ v[:, kv]
    return rnd(out.reshape(t, h * d))


def softcap(logits: np.ndarray, cap: float | None, rnd: Round) -> np.ndarray:
    """Final logit softcapping cap * tanh(logits / cap) (Gemma 2); no cap: unchanged."""
    return logits if not cap else rnd(np.tanh(logits / np.float32(cap)) * np.float32(cap))
