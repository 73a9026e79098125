"""The one reader of a checkpoint's or engine's config.json: the language model's config (nested
under ``text_config`` in a multimodal Gemma 3), the attention geometry (head counts, head size)
and the rotary values, wherever the transformers version put them (``rope_theta`` at the top
level, or inside ``rope_parameters`` since transformers 5; ``rope_scaling`` before it)."""
from __future__ import annotations


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
