"""Point names (references/output_schemas.md): ``L<n>.<name>`` inside layer n, ``M.<name>`` at
model level; ``a+b+c`` is a fused point made of its parts side by side; ``<point>@<k>`` is the
module's call k (a decode step); parameter points end in a parameter name."""
from __future__ import annotations

# Last name parts of a parameter point (a module's weight or bias, Megatron's fused norm ones).
PARAM_NAMES = {"weight", "bias", "layer_norm_weight", "layer_norm_bias"}


def parts(point: str) -> list[str]:
    """The parts of a fused point (one part for a plain point)."""
    return point.split("+")


def layer(point: str) -> int | None:
    """The layer a point belongs to (``L3.up`` -> 3); None for a model-level point (``M.logits``)."""
    head = point.split(".")[0]
    return int(head[1:]) if head.startswith("L") and head[1:].isdigit() else None


def at_call(point: str, n: int) -> str:
    """The name of call ``n`` of a (possibly fused) point: each part carries the call."""
    return "+".join(f"{p}@{n}" for p in parts(point))


def is_parameter_name(point: str) -> bool:
    """Whether a point's (first part's) last name is a parameter's."""
    return parts(point)[0].rsplit(".", 1)[-1] in PARAM_NAMES


def without_call(point: str) -> str:
    """The point a call of it names (``L0.q_rot@2`` -> ``L0.q_rot``); a point without a call as is."""
    return "+".join(p.split("@", 1)[0] for p in parts(point))
