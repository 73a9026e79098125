"""The reference math of a tiny Llama-like decoder, in float32 numpy.

Everything here is layout-free: the engine layouts (``synth.layouts``) decide tensor shapes,
fusion and module boundaries, and reach these functions through ``synth.kernels.Kernels``,
which adds the side's precision and noise. Arrays are ``[tokens, ...]``; no batch dimension.
"""
from dataclasses import dataclass, field

import numpy as np

F32 = np.float32


@dataclass
class Config:
    """Shape and hyper-parameters of the synthetic model (batch size is always 1)."""

    vocab: int = 128
    hidden: int = 64
    intermediate: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    seq_len: int = 8
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    seed: int = 0
    act: str = "silu"
    tie_embeddings: bool = False

    def __post_init__(self):
        if self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if self.tie_embeddings:
            raise ValueError("tied embeddings are not modelled")

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass
class LayerWeights:
    """One decoder layer's weights in HF orientation (``[out_features, in_features]``)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray
    input_norm: np.ndarray
    post_norm: np.ndarray


@dataclass
class Weights:
    """All weights of the model; every layout derives its parameters from these."""

    embed: np.ndarray
    final_norm: np.ndarray
    lm_head: np.ndarray
    layers: list = field(default_factory=list)

    def copy(self) -> "Weights":
        """New containers over the same arrays, so one side's faults never leak into the other
        side: a fault replaces a weight (synth.faults sets a new array) and no layout writes into
        one, so the arrays need no copy (a second copy of a 1 GB model's weights per side)."""
        layers = [LayerWeights(**vars(lw)) for lw in self.layers]
        return Weights(self.embed, self.final_norm, self.lm_head, layers)


def init_weights(cfg: Config) -> Weights:
    """Seeded random weights scaled so that activations stay O(1) through every layer.

    Norm weights are drawn around 1 rather than set to 1, so a corrupted or swapped norm weight
    changes the math visibly.
    """
    rng = np.random.default_rng(cfg.seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(F32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(cfg.hidden)).astype(F32)

    h, i = cfg.hidden, cfg.intermediate
    embed = rng.standard_normal((cfg.vocab, h)).astype(F32)
    layers = [LayerWeights(q=mat(cfg.q_size, h), k=mat(cfg.kv_size, h), v=mat(cfg.kv_size, h),
                           o=mat(h, cfg.q_size), gate=mat(i, h), up=mat(i, h), down=mat(h, i),
                           input_norm=norm(), post_norm=norm())
              for _ in range(cfg.layers)]
    return Weights(embed=embed, final_norm=norm(), lm_head=mat(cfg.vocab, h), layers=layers)


def make_tokens(cfg: Config) -> np.ndarray:
    """The prompt token ids ``[seq_len]`` (int64) shared by both sides."""
    rng = np.random.default_rng(cfg.seed + 1)
    return rng.integers(0, cfg.vocab, cfg.seq_len).astype(np.int64)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even); result stays float32."""
    bits = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF0000)
    out = rounded.view(F32)
    return np.where(np.isnan(x), x, out).astype(F32)


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` (torch.nn.functional.linear without bias)."""
    return np.matmul(x, w.T).astype(F32)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last dimension, computed in float32 as HF, vLLM and TE do."""
    var = np.mean(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return (w * (x * (F32(1.0) / np.sqrt(var + F32(eps))))).astype(F32)


def rope_angles(positions: np.ndarray, head_dim: int, theta: float) -> np.ndarray:
    """Rotation angles ``[tokens, head_dim]``: ``cat(freqs, freqs)`` as HF and Megatron build them."""
    inv_freq = (1.0 / (F32(theta) ** (np.arange(0, head_dim, 2, dtype=F32) / F32(head_dim))))
    freqs = positions.astype(F32)[:, None] * inv_freq.astype(F32)[None, :]
    return np.concatenate([freqs, freqs], axis=-1).astype(F32)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """HF/neox ``rotate_half``: ``cat(-x2, x1)`` over the last dimension."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate ``x [tokens, heads, head_dim]`` with ``cos/sin [tokens, head_dim]``."""
    return (x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]).astype(F32)


def attention_probs(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """Causal softmax probabilities ``[heads, tokens, tokens]`` with grouped KV heads.

    ``q [tokens, heads, hd]``, ``k [tokens, kv_heads, hd]``; query head h reads KV head
    ``h // (heads // kv_heads)`` (HF ``repeat_kv``).
    """
    rep = q.shape[1] // k.shape[1]
    kk = np.repeat(k, rep, axis=1)
    scores = np.matmul(q.transpose(1, 0, 2), kk.transpose(1, 2, 0)) * F32(scale)
    t = q.shape[0]
    scores = np.where(np.triu(np.ones((t, t), bool), 1)[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def attention_combine(probs: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``probs @ v`` back to ``[tokens, heads * hd]``."""
    rep = probs.shape[0] // v.shape[1]
    vv = np.repeat(v, rep, axis=1).transpose(1, 0, 2)
    out = np.matmul(probs, vv).transpose(1, 0, 2)
    return out.reshape(out.shape[0], -1).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (x / (F32(1.0) + np.exp(-x))).astype(F32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = F32(np.sqrt(2.0 / np.pi))
    return (F32(0.5) * x * (F32(1.0) + np.tanh(c * (x + F32(0.044715) * x ** 3)))).astype(F32)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, F32(0.0))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh, "relu": relu}
