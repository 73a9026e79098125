"""The math the replays share: norms, activations, RoPE and logit softcapping in float64, the
candidate grids a side's config value is fitted on, and ``Fit``, which records how well each
candidate reproduces a dumped output (references: rl-consistency-analysis/references/
deciding_the_side.md, "Replay")."""
from __future__ import annotations

import math

import numpy as np

# Candidate values tried when fitting what a side used.
EPS_GRID = (1e-12, 1e-10, 1e-8, 1e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 1e-3, 1e-2, 1e-1)
# config.json hidden_act names -> the function they select in transformers and vLLM.
ACT_NAMES = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
             "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}
ACTS = ("silu", "gelu", "gelu_tanh", "relu")
# RoPE bases tried for rope_theta besides the config's own: those of common released checkpoints
# (1e4 Llama 2, 5e5 Llama 3, 1e6 Qwen 2) and 1e5 between them.
ROPE_THETAS = (1e4, 1e5, 5e5, 1e6)
# Replays use at most this many elements of a tensor (leading tokens): enough to tell values
# apart. Modules with a leaf over MAX_LEAF elements are not replayed: a tensor file is read whole.
MAX_ELEMENTS = 1 << 20
MAX_LEAF = 1 << 24
_erf = np.vectorize(math.erf, otypes=[np.float64])


def activation(name: str, x: np.ndarray) -> np.ndarray:
    """The activation ``name`` (silu, gelu (erf), gelu_tanh, relu) in float64."""
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return np.maximum(x, 0.0)


def norm(kind: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    """RMSNorm (``rms``), Gemma RMSNorm (``gemma_rms``: scaled by 1 + w) or LayerNorm, in float64."""
    if kind == "layer":
        c = x - x.mean(-1, keepdims=True)
        y = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w
    else:
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * ((1.0 + w) if kind == "gemma_rms" else w)
    return y + b if b is not None else y


class Fit:
    """Residual of each candidate value; which ones reproduce the dumped output (shared by the
    module, routing and attention replays)."""

    def __init__(self, key: str, reference, tol: float):
        self.key, self.reference, self.tol, self.res = key, reference, tol, {}

    def add(self, value, residual: float) -> None:
        self.res[value] = residual

    def record(self) -> dict:
        ok = [v for v, r in self.res.items() if r <= self.tol]
        at_ref = self.res.get(self.reference) if self.reference is not None else None
        # Among values that all reproduce the output, the reference's is the one to report.
        best = self.reference if at_ref is not None and at_ref <= self.tol else min(self.res, key=self.res.get)
        out = {"key": self.key, "reference_value": self.reference,
               "residual_at_reference": at_ref,
               "reproduces_reference": None if at_ref is None else at_ref <= self.tol,
               "fitted": {"value": best, "residual": self.res[best]}, "tolerance": self.tol,
               "reproducing_values": ok}
        if self.reference is not None and at_ref is not None and at_ref <= self.tol and len(ok) > 1:
            out["indistinguishable"] = (f"{self.key} values {ok} all reproduce the output within {self.tol:g}: "
                                        "they cannot be told apart at this precision")
        return out


def rope_angles(positions: np.ndarray, rotary: int, theta: float) -> np.ndarray:
    """Rotation angles [tokens, rotary / 2] of each position at ``theta`` (float64)."""
    inv = 1.0 / theta ** (np.arange(0, rotary, 2, dtype=np.float64) / rotary)
    return np.outer(positions.astype(np.float64), inv)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    """Neox-style RoPE of [T, heads*d] rows with cos/sin [T, r/2]: the first r features of each
    head rotated as two halves, the rest passed through (partial rotary)."""
    t = x.reshape(x.shape[0], -1, head_dim)
    half = cos.shape[-1]
    c, s_ = cos[:, None, :], sin[:, None, :]
    a, b, rest = t[..., :half], t[..., half:2 * half], t[..., 2 * half:]
    return np.concatenate([a * c - b * s_, b * c + a * s_, rest], axis=-1).reshape(x.shape)


def rope(x: np.ndarray, positions: np.ndarray, head: int, rotary: int, theta: float,
         interleaved: bool = False) -> np.ndarray:
    """Rotary embedding of [tokens, heads * head] rows: the first ``rotary`` features of each head
    rotated as two halves (neox style) or as adjacent pairs (``interleaved``, GPT-J style), the
    rest passed through (partial rotary)."""
    ang = rope_angles(positions, rotary, theta)
    cos, sin = np.cos(ang), np.sin(ang)
    if not interleaved:
        return rotate(x, cos, sin, head)
    t = x.reshape(x.shape[0], -1, head)
    rot, rest = t[..., :rotary], t[..., rotary:]
    a, b = rot[..., 0::2], rot[..., 1::2]
    c, s_ = cos[:, None, :], sin[:, None, :]
    rot = np.stack([a * c - b * s_, b * c + a * s_], axis=-1).reshape(rot.shape)
    return np.concatenate([rot, rest], axis=-1).reshape(x.shape)


def softcap(logits: np.ndarray, cap: float | None) -> np.ndarray:
    """Logit softcapping (Gemma 2): cap * tanh(logits / cap); no cap: unchanged."""
    return logits if not cap else cap * np.tanh(logits / cap)
