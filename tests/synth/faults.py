"""Injectable faults: plain dataclasses that edit one side's ``SidePlan``.

Each fault names the side it hits (``"train"`` or ``"rollout"``), changes the math of that
side's forward pass only, and explains itself with ``describe()``. ``parse_fault`` reads the
CLI string form ``kind:side[:arg...]`` whose positional args follow the dataclass fields, e.g.
``corrupt:rollout:gate:1`` or ``eps:train:1e-3``; see README.md for the full list.
"""
import typing
from dataclasses import dataclass, fields
from typing import ClassVar, Optional

import numpy as np

from .model import ACTIVATIONS, Config, LayerWeights
from .plan import ExtraOpSpec, SidePlan

SIDES = ("train", "rollout")
GLOBAL_ROLES = ("embed", "final_norm", "lm_head")
LAYER_ROLES = tuple(f.name for f in fields(LayerWeights))
# Layouts whose q/k/v come from one fused weight; row permutations only exist there.
FUSED_QKV_LAYOUTS = ("vllm", "sglang", "megatron", "megatron_local")


@dataclass
class Fault:
    """Base class: ``side`` is checked; subclasses implement ``apply`` and ``describe``."""

    kind: ClassVar[str] = ""

    def __post_init__(self):
        if self.side not in SIDES:
            raise ValueError(f"{self.kind}: side must be one of {SIDES}, got {self.side!r}")

    def apply(self, plan: SidePlan) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, cfg: Config, layout: str) -> None:
        """Raise ValueError when the fault cannot change the math of ``layout`` for ``cfg``."""
        layer = getattr(self, "layer", None)
        if layer is not None and not 0 <= layer < cfg.layers:
            raise ValueError(f"{self.kind}: layer {layer} out of range (model has {cfg.layers})")


@dataclass
class CorruptWeight(Fault):
    """Gaussian noise of ``scale`` times the weight's RMS added to one weight (a bad weight sync)."""

    side: str
    role: str
    layer: Optional[int] = None
    scale: float = 0.5
    seed: int = 0
    kind: ClassVar[str] = "corrupt"

    def __post_init__(self):
        super().__post_init__()
        if self.role not in GLOBAL_ROLES + LAYER_ROLES:
            raise ValueError(f"corrupt: unknown role {self.role!r}")
        if self.role in LAYER_ROLES and self.layer is None:
            raise ValueError(f"corrupt: role {self.role!r} needs a layer")

    def apply(self, plan):
        owner = plan.weights if self.role in GLOBAL_ROLES else plan.weights.layers[self.layer]
        w = getattr(owner, self.role)
        noise = np.random.default_rng(self.seed).standard_normal(w.shape).astype(w.dtype)
        setattr(owner, self.role, w + self.scale * np.sqrt(np.mean(w * w)) * noise)

    def describe(self):
        where = "" if self.role in GLOBAL_ROLES else f" of layer {self.layer}"
        return f"{self.side}: {self.role} weight{where} corrupted (noise x{self.scale} of its RMS)"


@dataclass
class PermuteQKV(Fault):
    """Rows of one layer's fused qkv weight in the wrong order (``swap_qk`` or ``shuffle``)."""

    side: str
    layer: int
    mode: str = "swap_qk"
    seed: int = 0
    kind: ClassVar[str] = "permute_qkv"

    def __post_init__(self):
        super().__post_init__()
        if self.mode not in ("swap_qk", "shuffle"):
            raise ValueError(f"permute_qkv: mode must be swap_qk or shuffle, got {self.mode!r}")

    def apply(self, plan):
        plan.qkv_perms[self.layer] = (self.mode, self.seed)

    def check(self, cfg, layout):
        super().check(cfg, layout)
        if layout not in FUSED_QKV_LAYOUTS:
            raise ValueError(f"permute_qkv: layout {layout!r} has no fused qkv weight")

    def describe(self):
        return f"{self.side}: fused qkv weight rows of layer {self.layer} permuted ({self.mode})"


@dataclass
class NormEps(Fault):
    """A different RMSNorm epsilon, in every norm or only in one layer's two norms."""

    side: str
    eps: float
    layer: Optional[int] = None
    kind: ClassVar[str] = "eps"

    def apply(self, plan):
        if self.layer is None:
            plan.final_eps = self.eps
            plan.layer_eps = [self.eps] * plan.cfg.layers
        else:
            plan.layer_eps[self.layer] = self.eps

    def describe(self):
        where = "all norms" if self.layer is None else f"layer {self.layer} norms"
        return f"{self.side}: norm eps {self.eps:g} in {where}"


@dataclass
class RopeTheta(Fault):
    """A different RoPE base frequency."""

    side: str
    theta: float
    kind: ClassVar[str] = "rope_theta"

    def apply(self, plan):
        plan.rope_theta = self.theta

    def describe(self):
        return f"{self.side}: rope theta {self.theta:g}"


@dataclass
class Activation(Fault):
    """A different MLP activation (e.g. ``gelu_tanh`` for ``silu``), everywhere or in one layer."""

    side: str
    act: str
    layer: Optional[int] = None
    kind: ClassVar[str] = "act"

    def __post_init__(self):
        super().__post_init__()
        if self.act not in ACTIVATIONS:
            raise ValueError(f"act: unknown activation {self.act!r} (known: {sorted(ACTIVATIONS)})")

    def apply(self, plan):
        layers = range(plan.cfg.layers) if self.layer is None else [self.layer]
        for i in layers:
            plan.acts[i] = self.act

    def describe(self):
        where = "every layer" if self.layer is None else f"layer {self.layer}"
        return f"{self.side}: activation {self.act} in {where}"


@dataclass
class MissingActivation(Fault):
    """One layer's MLP skips its activation: no act module, the MLP computes down(gate * up)."""

    side: str
    layer: int
    kind: ClassVar[str] = "no_act"

    def apply(self, plan):
        plan.acts[self.layer] = None

    def describe(self):
        return f"{self.side}: activation missing in layer {self.layer} MLP"


@dataclass
class ExtraOp(Fault):
    """A one-sided module in a layer's MLP, between the activation and down_proj."""

    side: str
    layer: int
    op: str = "scale"
    value: float = 0.5
    kind: ClassVar[str] = "extra_op"

    def __post_init__(self):
        super().__post_init__()
        if self.op != "scale" and self.op not in ACTIVATIONS:
            raise ValueError(f"extra_op: op must be 'scale' or an activation, got {self.op!r}")

    def apply(self, plan):
        plan.extra_ops[self.layer] = ExtraOpSpec(self.op, self.value)

    def describe(self):
        what = f"scale x{self.value:g}" if self.op == "scale" else self.op
        return f"{self.side}: extra {what} module in layer {self.layer} MLP"


@dataclass
class HalfPrecision(Fault):
    """bfloat16 on one side: the whole side (``all``) or only the lm_head/logits (``lm_head``)."""

    side: str
    scope: str = "all"
    kind: ClassVar[str] = "bf16"

    def __post_init__(self):
        super().__post_init__()
        if self.scope not in ("all", "lm_head"):
            raise ValueError(f"bf16: scope must be all or lm_head, got {self.scope!r}")

    def apply(self, plan):
        if self.scope == "all":
            plan.bf16 = True
        else:
            plan.lm_head_bf16 = True

    def describe(self):
        return f"{self.side}: bfloat16 {'everywhere' if self.scope == 'all' else 'in lm_head/logits'}"


@dataclass
class KernelNoise(Fault):
    """Relative noise ``rel`` on every op output, like a different but correct kernel."""

    side: str
    rel: float = 1e-6
    seed: int = 0
    kind: ClassVar[str] = "noise"

    def apply(self, plan):
        plan.noise = self.rel
        plan.noise_seed = self.seed

    def describe(self):
        return f"{self.side}: kernel noise, relative {self.rel:g} on every op output"


FAULT_TYPES = {cls.kind: cls for cls in (CorruptWeight, PermuteQKV, NormEps, RopeTheta, Activation,
                                         MissingActivation, ExtraOp, HalfPrecision, KernelNoise)}


def _convert(text: str, annotation):
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(options) < len(typing.get_args(annotation)) and text.lower() in ("", "none", "all"):
        return None
    return options[0](text)


def parse_fault(text: str) -> Fault:
    """Build a fault from ``kind:side[:arg...]``; args fill the dataclass fields after ``side``."""
    kind, *args = text.split(":")
    if kind not in FAULT_TYPES:
        raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(FAULT_TYPES)})")
    cls = FAULT_TYPES[kind]
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    if len(args) > len(names):
        raise ValueError(f"{kind}: too many arguments (fields: {', '.join(names)})")
    try:
        values = {name: _convert(arg, hints[name]) for name, arg in zip(names, args)}
        return cls(**values)
    except TypeError as exc:
        raise ValueError(f"{kind}: expected {':'.join(names)} ({exc})") from exc
