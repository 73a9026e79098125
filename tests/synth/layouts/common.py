"""What every layout receives, and the few pieces of module structure they share."""
from dataclasses import dataclass, field

import numpy as np

from ..kernels import Kernels
from ..model import Config, rope_angles
from ..plan import SidePlan
from ..record import Recorder

# Class of the one-sided module an ExtraOp fault inserts, by op.
EXTRA_OP_CLASSES = {"scale": "Scale", "silu": "SiLU", "gelu_tanh": "GELUTanh", "relu": "ReLU"}


@dataclass
class Side:
    """One engine side during its forward pass."""

    cfg: Config
    plan: SidePlan
    k: Kernels
    rec: Recorder
    ids: np.ndarray  # [tokens] int64
    positions: np.ndarray  # [tokens] int64
    options: dict = field(default_factory=dict)

    def angles(self) -> np.ndarray:
        """RoPE angles ``[tokens, head_dim]`` for this side's theta."""
        return rope_angles(self.positions, self.cfg.head_dim, self.plan.rope_theta)


def gated_act(s: Side, layer: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``act(gate) * up`` computed as a plain function (Megatron MLP.forward, or no act module)."""
    act = s.plan.acts[layer]
    return s.k.mul(gate if act is None else s.k.act(act, gate), up)


def extra_op(s: Side, layer: int, mlp_path: str, h: np.ndarray) -> np.ndarray:
    """Apply the ExtraOp fault's module of ``layer`` (if any) to the down-projection input."""
    spec = s.plan.extra_ops.get(layer)
    if spec is None:
        return h
    with s.rec.module(f"{mlp_path}.extra_op", EXTRA_OP_CLASSES[spec.op], args=[h]) as m:
        y = s.k.scale(h, spec.value) if spec.op == "scale" else s.k.act(spec.op, h)
        return m.returns(y)


def pad_rows(w: np.ndarray, multiple: int) -> np.ndarray:
    """Zero rows appended so the vocab dimension is a multiple of ``multiple`` (padded vocab)."""
    extra = -len(w) % multiple
    return np.concatenate([w, np.zeros((extra, w.shape[1]), w.dtype)]) if extra else w


def causal_mask(t: int, dtype_min: float) -> np.ndarray:
    """HF eager's additive causal mask ``[1, 1, t, t]``: 0 on and below the diagonal."""
    upper = np.triu(np.ones((t, t), bool), 1)
    return np.where(upper, np.float32(dtype_min), np.float32(0.0))[None, None]
