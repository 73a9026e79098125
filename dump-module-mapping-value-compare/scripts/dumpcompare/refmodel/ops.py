"""The numpy math of the standard decoder modules, float32 throughout.

``rnd`` is the rounding applied at an engine's rounding point: identity in fp32, round to
nearest-even bfloat16 (kept as float32 values) in bf16. Inside a module the math stays float32,
as transformers' kernels accumulate in float32. Where each family rounds and why:
references/reference_forward.md.

Speed (tools/bench.py stage ``reftorch``): the roundings are most of the elementwise work, so a
rounding of a buffer no one else holds (``inplace=True``: a matmul's or a ufunc's fresh result)
works on it in place, and the attention runs by blocks of queries over the keys they may see.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..replay.kernels import activation


class Round(Protocol):
    """A rounding point: ``rnd(a)`` returns a rounded float32 copy; ``rnd(a, inplace=True)``
    may round ``a`` (a float32 array the caller owns) in place and return it."""

    def __call__(self, a: np.ndarray, inplace: bool = False) -> np.ndarray: ...


def identity(a: np.ndarray, inplace: bool = False) -> np.ndarray:
    """fp32 rounding point: the value as computed (float32)."""
    return np.asarray(a, dtype=np.float32)


# Elements rounded per pass: the five integer passes of a block stay in the CPU cache, and the
# one temporary is this small whatever the array (a whole-array pass per step, on the logits of
# 1024 tokens by a 32k vocabulary, costs as much again in memory traffic and page faults).
_BLOCK = 1 << 16


def bf16(a: np.ndarray, inplace: bool = False) -> np.ndarray:
    """bf16 rounding point: round to nearest even bfloat16 (as torch casts), held as float32.

    The same rounding as tensorio.bfloat16_bits, done on the float32 bits block by block: add
    0x7FFF plus the lowest kept bit, clear the low half. ``inplace`` rounds ``a`` itself when it
    is a contiguous float32 array (the caller's fresh buffer); otherwise a copy is rounded."""
    x = a if inplace and isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous \
        and a.flags.writeable else np.array(a, dtype=np.float32, order="C")
    flat = x.reshape(-1)
    carry = np.empty(min(_BLOCK, flat.size), dtype=np.uint32)
    for start in range(0, flat.size, _BLOCK):
        vals = flat[start:start + _BLOCK]
        bits, c = vals.view(np.uint32), carry[:vals.size]
        # A NaN's bits may wrap or reach infinity: torch writes the quiet NaN. min() is NaN
        # exactly when the block holds one, and is cheaper than a mask of every block.
        nan = np.isnan(vals) if np.isnan(vals.min()) else None
        np.right_shift(bits, 16, out=c)
        c &= 1
        c += 0x7FFF
        bits += c       # finite and infinite values cannot wrap (at most 0xFF807FFF)
        bits &= 0xFFFF0000
        if nan is not None:
            vals[nan] = np.nan
    return x


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, rnd: Round, plus_one: bool = False) -> np.ndarray:
    """RMSNorm over the last axis. Llama-style scales the rounded normalised value by ``w`` (two
    roundings); Gemma-style (``plus_one``) scales by ``1 + w`` in float32 and rounds once."""
    x32 = np.asarray(x, dtype=np.float32)
    y = x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    if plus_one:
        y *= np.float32(1.0) + w
        return rnd(y, inplace=True)
    y = rnd(y, inplace=True)
    return rnd(np.multiply(w, y, out=y), inplace=True)


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, rnd: Round) -> np.ndarray:
    """x @ w.T (+ b), accumulated in float32, rounded once."""
    y = x @ w.T
    if b is not None:
        y += b
    return rnd(y, inplace=True)


def act(name: str, x: np.ndarray, rnd: Round) -> np.ndarray:
    """The activation ``name`` (silu, gelu, gelu_tanh, relu) of ``x``, rounded."""
    with np.errstate(over="ignore"):    # exp(-x) overflows to inf for very negative x: silu -> 0
        return rnd(np.asarray(activation(name, np.asarray(x, dtype=np.float32)), dtype=np.float32), inplace=True)


def rope_tables(inv_freq: np.ndarray, positions: np.ndarray, rnd: Round) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [tokens, rotary dim] of the positions (both halves repeat, as transformers lays them)."""
    ang = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)
    return rnd(np.cos(ang), inplace=True), rnd(np.sin(ang), inplace=True)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rnd: Round) -> np.ndarray:
    """Rotate the first ``cos.shape[-1]`` features of each head of x [tokens, heads, head_dim]
    by halves (neox / transformers ``rotate_half``); the rest pass through."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    half = d // 2
    turned = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    # transformers rotates in the activation dtype: each product and the sum round
    out = rnd(rot * cos[:, None, :], inplace=True)
    out += rnd(np.multiply(turned, sin[:, None, :], out=turned), inplace=True)
    out = rnd(out, inplace=True)
    return out if rest.shape[-1] == 0 else np.concatenate([out, rest], axis=-1)


ATTENTION = ("eager", "flash", "fp32")
# Query tokens per block of the attention. Small enough that a block's scores (tokens x heads of
# a KV group x visible keys, float32: 4 MB at 256 x 4 x 1024) stay in the last-level cache
# through the elementwise passes, where whole T x T scores per head would stream through memory
# on each; large enough that the BLAS calls are few (on a busy machine a call's hand-off to the
# BLAS threads costs more than the arithmetic of a small block: 128 tokens took 2x longer).
QUERY_BLOCK = 256


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, softcap: float | None,
              window: int | None, rnd: Round, kernel: str = "eager") -> np.ndarray:
    """Causal grouped-query attention of q [T, H, D], k/v [T, KV, D] -> [T, H * D], rounded.

    One sequence, masked by token order: token i sees tokens j <= i (and j > i - window with a
    sliding window), whatever position ids the rotary embedding was given. ``kernel`` says where
    the attention kernel rounds (bf16 only): ``eager`` as transformers' eager attention (the
    scores, the scaled and soft-capped scores and the probabilities each rounded), ``flash`` as
    flash-attention (scores in float32, probabilities rounded before p @ v), ``fp32`` (nothing
    rounded before the output).

    Queries run by blocks of ``QUERY_BLOCK`` tokens against the keys the block may see (keys
    after its last token, or before its window, get probability 0 and are never computed); the
    softmax sums a row over those keys only, so its float32 sum may group the terms differently
    from a sum over all T keys (last-bit differences, below the bf16 rounding of p)."""
    t, h, d = q.shape
    kvh = k.shape[1]
    group = h // kvh
    inner = rnd if kernel == "eager" else identity
    # The heads sharing a key/value head go through one matmul, their queries as rows
    # (token, head) of one [rows * group, D] block: fewer, larger BLAS calls.
    qg = np.ascontiguousarray(q.reshape(t, kvh, group, d).transpose(1, 0, 2, 3))
    out = np.empty((kvh, t, group, d), dtype=np.float32)
    for r0 in range(0, t, QUERY_BLOCK):
        r1 = min(t, r0 + QUERY_BLOCK)
        lo = max(0, r0 - window + 1) if window else 0
        i, j = np.arange(r0, r1)[:, None], np.arange(lo, r1)[None, :]
        hidden = j > i
        if window:
            hidden |= j <= i - window
        hidden = hidden[:, None, :]
        rows = (r1 - r0) * group
        for kv in range(kvh):
            scores = inner(qg[kv, r0:r1].reshape(rows, d) @ k[lo:r1, kv].T, inplace=True)
            scores = scores.reshape(r1 - r0, group, r1 - lo)
            scores *= np.float32(scale)
            scores = inner(scores, inplace=True)
            if softcap:
                scores /= np.float32(softcap)
                scores = inner(np.tanh(inner(scores, inplace=True), out=scores), inplace=True)
                scores *= np.float32(softcap)
                scores = inner(scores, inplace=True)
            np.copyto(scores, -np.inf, where=hidden)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores, out=scores)
            p /= p.sum(axis=-1, keepdims=True)
            if kernel != "fp32":
                p = rnd(p, inplace=True)
            out[kv, r0:r1] = (p.reshape(rows, r1 - lo) @ v[lo:r1, kv]).reshape(r1 - r0, group, d)
    return rnd(out.transpose(1, 0, 2, 3).reshape(t, h * d), inplace=True)


def softcap(logits: np.ndarray, cap: float | None, rnd: Round) -> np.ndarray:
    """Final logit softcapping cap * tanh(logits / cap) (Gemma 2); no cap: unchanged."""
    if not cap:
        return logits
    y = np.tanh(logits / np.float32(cap))
    y *= np.float32(cap)
    return rnd(y, inplace=True)
