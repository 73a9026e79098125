"""Point names (references/output_schemas.md): ``L<n>.<name>`` inside layer n, ``M.<name>`` at
model level; ``a+b+c`` is a fused point made of its parts side by side; ``<point>@<k>`` is the
module's call k (a decode step); parameter points end in a parameter name."""
from __future__ import annotations

# Last name parts of a parameter point (a module's weight or bias, Megatron's fused norm ones).
PARAM_NAMES = {"weight", "bias", "layer_norm_weight", "layer_norm_bias"}
# What the names inside a scope stand for, in words (references/naming_profiles.md); published in
# output_4 ``vocabulary.point_words`` for the root-cause skill's glossary.
WORDS = {
    "tokens": "input token ids", "positions": "position ids", "resid_in": "residual stream entering the layer",
    "attn_norm_out": "output of the layer's input norm", "q": "query projection output",
    "k": "key projection output", "v": "value projection output", "q_rot": "query after RoPE",
    "k_rot": "key after RoPE", "attn_core_out": "attention kernel output (input of o_proj)",
    "attn_out": "attention output projection (o_proj) output", "resid_mid": "residual stream after attention",
    "mlp_norm_out": "output of the post-attention norm", "gate": "MLP gate projection output",
    "up": "MLP up projection output", "act_gate": "act(gate)", "act_out": "act(gate) * up (input of down_proj)",
    "mlp_out": "MLP down projection output", "resid_out": "residual stream leaving the layer",
    "final_norm_out": "final norm output", "logits": "logits of every token", "logits_last": "logits of the last token",
    "embed": "embedding", "o": "attention output projection", "down": "MLP down projection",
    "input_norm": "input norm", "post_norm": "post-attention norm", "final_norm": "final norm", "lm_head": "lm_head",
    "q_normed": "query after its per-head norm", "k_normed": "key after its per-head norm",
}


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


def form(point: str) -> dict:
    """The parsed form of a point name that output_4 publishes (``vocabulary.points``), so that no
    reader parses names itself: ``kind`` (parameter or activation, by the first part), ``layer``
    (of the first part) and per part its own ``point`` name, ``scope``, ``layer``, ``name``,
    ``parameter`` and ``call``."""
    each = [_part(p) for p in parts(point)]
    return {"kind": "parameter" if each[0]["parameter"] else "activation", "layer": layer(point), "parts": each}


def _part(part: str) -> dict:
    """One part: ``L3.down.weight@2`` -> scope layer, layer 3, name down, parameter weight, call 2.
    A part outside the ``L<n>.``/``M.`` grammar (a pair aligned by values) has no scope; its last
    name still says whether it is a parameter, as is_parameter_name reads it."""
    name, at, call = part.partition("@")
    if at and not call.isdigit():
        name, call = part, ""
    scope, _, rest = name.partition(".")
    scoped = bool(rest) and (scope == "M" or (scope.startswith("L") and scope[1:].isdigit()))
    body = rest if scoped else name
    head, _, last = body.rpartition(".")
    param = last if head and last in PARAM_NAMES else None
    return {"point": part, "scope": ("model" if scope == "M" else "layer") if scoped else None,
            "layer": int(scope[1:]) if scoped and scope != "M" else None, "name": head if param else body,
            "parameter": param, "call": int(call) if call else None}
