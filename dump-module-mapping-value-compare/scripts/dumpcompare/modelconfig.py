"""The one reader of a checkpoint's or engine's config.json: the language model's config (nested
under ``text_config`` in a multimodal Gemma 3), the attention geometry (head counts, head size)
and the rotary values, wherever the transformers version put them (``rope_theta`` at the top
level, or inside ``rope_parameters`` since transformers 5; ``rope_scaling`` before it)."""
from __future__ import annotations

import math
import re

from .errors import InputError

# Sizes and counts the reference forward, the replays and the simulation turn into shapes, loop
# bounds and divisors: each must be a whole number of at least 1, or of at least 0 where 0 means
# "none" (no sliding window, no experts, windows from the first layer).
POSITIVE_INTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
                 "max_position_embeddings", "num_experts_per_tok", "n_group", "topk_group", "decoder_sparse_step",
                 "sliding_window_pattern")
NON_NEGATIVE_INTS = ("max_window_layers", "sliding_window", "num_experts", "num_local_experts")
# Values that enter the arithmetic as floats: finite, and > 0 where a zero would divide or vanish.
POSITIVE_FLOATS = ("rms_norm_eps", "layer_norm_eps", "layernorm_epsilon", "rope_theta", "rope_local_base_freq",
                   "partial_rotary_factor", "routed_scaling_factor", "query_pre_attn_scalar")
NON_NEGATIVE_FLOATS = ("attn_logit_softcapping", "final_logit_softcapping")
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# An attention layer's stored projections: split q/k/v, or one fused qkv_proj (Phi-3).
ATTENTION_WEIGHT = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|qkv_proj)\.weight$")


def text_config(config: dict) -> dict:
    """The language model's config (a multimodal Gemma 3 nests it under ``text_config``)."""
    inner = config.get("text_config")
    if isinstance(inner, dict) and config.get("model_type") == "gemma3":
        return {**inner, "tie_word_embeddings": config.get("tie_word_embeddings", inner.get("tie_word_embeddings"))}
    return config


def _int(cfg: dict, key: str) -> int | None:
    value = cfg.get(key)
    if not value:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"config {key} is not an integer: {value!r}") from None


def head_counts(config: dict) -> tuple[int | None, int | None]:
    """(query heads, key/value heads); the key/value count is the query count without GQA, and
    both are None when the config has no ``num_attention_heads``. ValueError on a non-integer."""
    cfg = text_config(config)
    heads = _int(cfg, "num_attention_heads")
    return heads, (_int(cfg, "num_key_value_heads") or heads)


def head_dim(config: dict) -> int | None:
    """The attention head size: ``head_dim`` when set, else hidden_size / num_attention_heads;
    None when neither is known. ValueError on a non-integer value."""
    cfg = text_config(config)
    hd = _int(cfg, "head_dim")
    if hd:
        return hd
    heads, hidden = _int(cfg, "num_attention_heads"), _int(cfg, "hidden_size")
    return hidden // heads if heads and hidden else None


def rope_parameters(config: dict) -> dict | None:
    """The nested rotary parameters of transformers 5 (``rope_parameters``), None when absent."""
    nested = text_config(config).get("rope_parameters")
    return nested if isinstance(nested, dict) else None


def lifted_rope(config: dict) -> dict:
    """The values of ``rope_parameters`` under the top-level names older configs use:
    ``rope_theta``, and ``rope_scaling`` (the whole dict) when the type is not the default; {}
    without ``rope_parameters``."""
    nested = rope_parameters(config)
    if nested is None:
        return {}
    out = {"rope_theta": nested.get("rope_theta")}
    if nested.get("rope_type") not in (None, "default"):
        out["rope_scaling"] = nested
    return out


def rope_scaling(config: dict):
    """The ``rope_scaling`` entry of an older config as written (a dict, a name or None)."""
    return text_config(config).get("rope_scaling")


def rope_theta(config: dict) -> float | None:
    """The RoPE base: the top-level ``rope_theta``, else the one inside ``rope_parameters``."""
    cfg = text_config(config)
    theta = cfg.get("rope_theta")
    if theta is None:
        theta = (rope_parameters(cfg) or {}).get("rope_theta")
    return None if theta is None else float(theta)


def rope_type(config: dict) -> str:
    """The rotary variant ("default" when unscaled): ``rope_scaling``'s type, else that of
    ``rope_parameters``."""
    scaling = rope_scaling(config) or rope_parameters(config) or {}
    if not isinstance(scaling, dict):
        return str(scaling)
    return str(scaling.get("rope_type", scaling.get("type", "default")) or "default")


def validate(config: dict, source: str) -> dict:
    """``config`` when every field the package computes with is usable, else InputError naming
    ``source`` and the field: a wrong type (a string, a bool, a list), NaN or inf, a count or size
    below 1, or head counts that do not divide. Absent and null fields are left to the defaults."""
    cfg = text_config(config)
    for key in POSITIVE_INTS + NON_NEGATIVE_INTS:
        _whole(cfg, key, source, 0 if key in NON_NEGATIVE_INTS else 1)
    nested = rope_parameters(cfg) or {}
    for key in POSITIVE_FLOATS + NON_NEGATIVE_FLOATS:
        for where, src in ((key, cfg), (f"rope_parameters.{key}", nested)):
            _real(src, key, where, source, key in POSITIVE_FLOATS)
    heads, kv, hidden = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"), cfg.get("hidden_size")
    if heads and kv and heads % kv:
        raise InputError(f"{source}: num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    if heads and hidden and not cfg.get("head_dim") and hidden % heads:
        raise InputError(f"{source}: num_attention_heads {heads} does not divide hidden_size {hidden} "
                         "(and no head_dim is given)")
    return config


# model_type (or architectures[0]) -> the family of the reference forward (refmodel/), whose
# attention projections hold heads x head size rows each.
FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
            "gemma3": "gemma3", "gemma3_text": "gemma3", "phi3": "phi3", "qwen3_moe": "qwen3_moe",
            "mixtral": "mixtral"}
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
                 "Gemma3ForConditionalGeneration": "gemma3", "Phi3ForCausalLM": "phi3",
                 "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral"}


def family(config: dict) -> str | None:
    """The reference forward's family of ``config`` (a config.json dict), or None."""
    if not isinstance(config, dict):
        return None
    fam = FAMILIES.get(str(config.get("model_type", "")))
    if fam is None:
        archs = config.get("architectures")
        fam = ARCHITECTURES.get(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    return fam


def check_heads(config: dict, shapes: dict, source: str) -> dict:
    """``config`` when its head counts and head size give the rows of the checkpoint's q/k/v
    projections (``shapes``: tensor name -> shape), else InputError naming ``source``, the field and
    the tensor. The first attention layer stored is checked: a config read against another model's
    weights would give the reference forward shapes its weights cannot have. Only the families of
    :data:`FAMILIES` are checked: others size their projections otherwise (DeepSeek's latent
    attention, Qwen3-Next's gated q with twice the rows), and a refusal there would be wrong."""
    if family(config) is None:
        return config
    heads, kv = head_counts(config)
    size = head_dim(config)
    layers: dict[int, dict[str, tuple]] = {}
    for name, shape in shapes.items():
        m = ATTENTION_WEIGHT.search(name)
        if m and shape:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = (name, shape[0])
    if not (heads and size and layers):
        return config
    stored = layers[min(layers)]
    cfg = text_config(config)
    kv_key = "num_key_value_heads" if cfg.get("num_key_value_heads") else "num_attention_heads"
    # The head size is a field of its own only when head_dim is set (else hidden_size / heads).
    per = "/head_dim" if cfg.get("head_dim") else ""
    wanted = {"q_proj": ("num_attention_heads" + per, heads * size), "k_proj": (kv_key + per, kv * size),
              "v_proj": (kv_key + per, kv * size),
              "qkv_proj": (f"num_attention_heads/{kv_key}{per}", (heads + 2 * kv) * size)}
    for proj, (field_name, want) in wanted.items():
        name, rows = stored.get(proj, (None, want))
        if rows != want:
            raise InputError(f"{source}: {field_name} does not fit the checkpoint: {name} has {rows} rows, "
                             f"not the {want} the config's heads x head size {size} give")
    return config


def _whole(cfg: dict, key: str, source: str, least: int) -> None:
    value = cfg.get(key)
    if value is None:
        return
    # bool is an int in Python; a float such as 4.0 is written by some exporters and is whole.
    ok = not isinstance(value, bool) and (isinstance(value, int) or
                                          (isinstance(value, float) and math.isfinite(value) and value.is_integer()))
    if not ok:
        raise InputError(f"{source}: {key} must be a whole number, not {_shown(value)}")
    if value < least:
        raise InputError(f"{source}: {key} must be at least {least}, not {_shown(value)}")


def _real(src: dict, key: str, where: str, source: str, positive: bool) -> None:
    value = src.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{source}: {where} must be a number, not {_shown(value)}")
    if not math.isfinite(value):
        raise InputError(f"{source}: {where} must be finite, not {value}")
    if value < 0 or (positive and value == 0):
        raise InputError(f"{source}: {where} must be {'above' if positive else 'at least'} 0, not {value}")


def _shown(value) -> str:
    """A config value for a one-line message: its type for containers, a short repr otherwise."""
    if isinstance(value, (list, dict)):
        return f"a {type(value).__name__}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def layers_present(tensor_names) -> int:
    """How many decoder layers a checkpoint's tensors hold (highest ``layers.N.`` index + 1)."""
    found = (LAYER_INDEX.search(name) for name in tensor_names)
    return max((int(m.group(1)) + 1 for m in found if m), default=0)


def trust_layers(config: dict, present: int) -> dict:
    """``config`` with ``num_hidden_layers`` lowered to the layers the tensors hold: a count above
    them describes no weights, and the per-layer tables built from it would fill memory."""
    nested = isinstance(config.get("text_config"), dict) and text_config(config) is not config
    cfg = config["text_config"] if nested else config
    count = cfg.get("num_hidden_layers")
    if not isinstance(count, int) or count <= present:
        return config
    fixed = {**cfg, "num_hidden_layers": present}
    if isinstance(cfg.get("layer_types"), list):
        fixed["layer_types"] = cfg["layer_types"][:present]
    return {**config, "text_config": fixed} if nested else fixed
