"""The numerics of one engine side: every op of a layout runs through a ``Kernels`` instance.

A real engine runs the same math as the reference but with its own precision and its own
kernels. ``Kernels`` reproduces the two effects that matter for comparisons: bfloat16 storage
(inputs and weights rounded before an op, the op's output rounded after it, the arithmetic in
between in float32, as CUDA kernels do) and tiny kernel-to-kernel differences (a relative
perturbation of every op output), so that a fault-free pair is realistically not bit-identical.
"""
from contextlib import contextmanager

import numpy as np

from . import model

F32_NAME = "torch.float32"
BF16_NAME = "torch.bfloat16"


class Kernels:
    """Precision- and noise-aware wrappers around ``synth.model`` math."""

    def __init__(self, bf16: bool = False, noise: float = 0.0, seed: int = 0):
        self.bf16 = bf16
        self.noise = noise
        self._rng = np.random.default_rng(seed)

    @property
    def dtype(self) -> str:
        """The torch dtype name floats currently have on this side."""
        return BF16_NAME if self.bf16 else F32_NAME

    @contextmanager
    def bf16_scope(self, enabled: bool = True):
        """Run a block (e.g. only the lm_head) in bfloat16 while the rest of the side is not."""
        saved = self.bf16
        self.bf16 = saved or enabled
        try:
            yield
        finally:
            self.bf16 = saved

    def cast(self, x: np.ndarray) -> np.ndarray:
        """``x`` as stored in the current dtype (bf16 rounding, else unchanged)."""
        return model.to_bf16(x) if self.bf16 else x

    def _finish(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=model.F32)
        if self.noise:
            y = y * (1.0 + self.noise * self._rng.standard_normal(y.shape)).astype(model.F32)
        return self.cast(y)

    def embed(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        return self._finish(self.cast(table)[ids])

    def linear(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return self._finish(model.linear(self.cast(x), self.cast(w)))

    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        return self._finish(model.rms_norm(self.cast(x), self.cast(w), eps))

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._finish(self.cast(a) + self.cast(b))

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._finish(self.cast(a) * self.cast(b))

    def scale(self, x: np.ndarray, factor: float) -> np.ndarray:
        return self._finish(self.cast(x) * model.F32(factor))

    def act(self, name: str, x: np.ndarray) -> np.ndarray:
        return self._finish(model.ACTIVATIONS[name](self.cast(x)))

    def rope_cos_sin(self, angles: np.ndarray):
        """``(cos, sin)`` of the rotation angles, cast to the activation dtype as HF/vLLM do."""
        return self._finish(np.cos(angles)), self._finish(np.sin(angles))

    def rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        return self._finish(model.apply_rope(self.cast(x), self.cast(cos), self.cast(sin)))

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray):
        """Causal GQA attention; returns ``(out [tokens, heads*hd], probs [heads, tokens, tokens])``.

        The probabilities are rounded to the activation dtype before ``@ v``, like HF eager.
        """
        probs = self._finish(model.attention_probs(self.cast(q), self.cast(k), q.shape[-1] ** -0.5))
        return self._finish(model.attention_combine(probs, self.cast(v))), probs
