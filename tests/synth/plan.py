"""What one side actually runs: its weights and numeric knobs after that side's faults.

A clean ``SidePlan`` reproduces the reference model exactly; each fault in ``synth.faults``
edits one aspect of it. Layouts read only the plan, never the fault list.
"""
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .kernels import Kernels
from .model import Config, Weights


@dataclass
class ExtraOpSpec:
    """A one-sided module inserted in a layer's MLP, on the down_proj input."""

    op: str  # "scale" or an activation name
    value: float


@dataclass
class SidePlan:
    """Weights and numerics of one side; built by ``SidePlan.clean`` and edited by faults."""

    cfg: Config
    weights: Weights
    rope_theta: float
    final_eps: float
    layer_eps: list
    acts: list  # activation name per layer; None = activation missing
    extra_ops: dict = field(default_factory=dict)  # layer -> ExtraOpSpec
    qkv_perms: dict = field(default_factory=dict)  # layer -> (mode, seed)
    bf16: bool = False
    lm_head_bf16: bool = False
    noise: float = 0.0
    noise_seed: int = 0

    @classmethod
    def clean(cls, cfg: Config, weights: Weights) -> "SidePlan":
        """The fault-free plan: a private copy of ``weights`` and the config's hyper-parameters."""
        return cls(cfg=cfg, weights=weights.copy(), rope_theta=cfg.rope_theta,
                   final_eps=cfg.norm_eps, layer_eps=[cfg.norm_eps] * cfg.layers,
                   acts=[cfg.act] * cfg.layers)

    def kernels(self) -> Kernels:
        """The side's kernels (precision and noise)."""
        return Kernels(bf16=self.bf16, noise=self.noise, seed=self.noise_seed)

    def fuse_qkv(self, layer: int, segments) -> np.ndarray:
        """Stack ``(role, rows)`` segments into one fused weight, applying any row permutation.

        ``segments`` is in the layout's own order (``[q, k, v]`` for vLLM, per query group for
        Megatron). ``swap_qk`` puts every k block before the q block it follows; ``shuffle``
        permutes all q and k rows among their positions (v rows stay), so the fused output holds
        the same values in another order.
        """
        mode, seed = self.qkv_perms.get(layer, (None, 0))
        if mode == "swap_qk":
            segments = list(segments)
            for i in range(len(segments) - 1):
                if segments[i][0] == "q" and segments[i + 1][0] == "k":
                    segments[i], segments[i + 1] = segments[i + 1], segments[i]
        fused = np.concatenate([rows for _, rows in segments], axis=0)
        if mode == "shuffle":
            roles = np.concatenate([[role] * len(rows) for role, rows in segments])
            qk = np.flatnonzero(roles != "v")
            order = np.arange(len(fused))
            order[qk] = np.random.default_rng(seed).permutation(qk)
            fused = fused[order]
        return fused

    def eps(self, layer: Optional[int]) -> float:
        """Norm epsilon of a layer's norms, or of the final norm when ``layer`` is None."""
        return self.final_eps if layer is None else self.layer_eps[layer]
