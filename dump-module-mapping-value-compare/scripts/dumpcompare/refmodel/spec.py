"""Which family a config.json describes, and the numbers its forward needs (one ``Spec``).

The values are read the way each family's transformers model code reads them (config key names,
defaults, per-layer attention types); an Injection's config overrides are laid over the file's
values. Why each default holds: references/reference_forward.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import modelconfig

# config activation names -> the function transformers' ACT2FN gives them.
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_tanh": "gelu_tanh", "relu": "relu"}
GEMMA = ("gemma2", "gemma3")
MOE = ("qwen3_moe", "mixtral")
QWEN = ("qwen2", "qwen3", "qwen3_moe")


class UnsupportedModel(ValueError):
    """The config asks for something this forward does not implement (a rope type, an activation)."""


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of one attention type: inverse frequencies (float32, as transformers
    computes them) over the first ``dim`` features of each head."""
    inv_freq: np.ndarray
    dim: int


@dataclass(frozen=True)
class Spec:
    """The resolved numbers of one forward (one per set of config overrides)."""
    family: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    act: str
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    embed_scale: float | None
    layer_types: tuple      # per layer: "sliding_attention" or "full_attention"
    windows: tuple          # per layer: sliding window or None
    ropes: tuple            # per layer: Rope
    tied: bool
    moe_layers: tuple = ()  # per layer: True where the MLP is a routed mixture of experts
    experts: int = 0
    top_k: int = 0
    norm_topk: bool = False


def family(config: dict) -> str | None:
    """The family of ``config`` (a config.json dict) this package can run, or None."""
    return modelconfig.family(config)


def _pick(cfg: dict, over: dict, *keys, default=None):
    """First of ``keys`` the overrides set, else the first the config sets, else ``default``."""
    for src in (over, cfg):
        for k in keys:
            if src.get(k) is not None:
                return src[k]
    return default


def _layer_types(fam: str, cfg: dict, n: int) -> list[str]:
    lt = cfg.get("layer_types")
    if isinstance(lt, list) and len(lt) == n:
        return [str(t) for t in lt]
    if fam == "gemma2":     # every other layer slides, starting with the first
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if fam == "gemma3":
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if fam in QWEN:         # windows only when switched on, and only from max_window_layers up
        start = int(cfg.get("max_window_layers", n))
        on = bool(cfg.get("use_sliding_window"))
        return ["sliding_attention" if on and i >= start else "full_attention" for i in range(n)]
    # Mistral, Mixtral and Phi-3 apply their sliding_window (when set) on every layer.
    return ["sliding_attention"] * n


def _rope_params(fam: str, cfg: dict, over: dict, kind: str) -> dict:
    params = modelconfig.rope_parameters(cfg) or modelconfig.rope_scaling(cfg) or {}
    if isinstance(params.get(kind), dict):      # per attention type (Gemma 3, transformers 5)
        params = params[kind]
    elif fam == "gemma3" and kind == "sliding_attention":
        params = {}     # an older Gemma 3 config's rope_scaling is for its full-attention layers only
    out = {k: v for k, v in params.items() if k != "type"}
    out.setdefault("rope_type", params.get("type", "default"))
    # Gemma 3's sliding layers rotate with their own base (rope_local_base_freq before transformers 5).
    key = "rope_local_base_freq" if fam == "gemma3" and kind == "sliding_attention" else "rope_theta"
    base = modelconfig.rope_theta(cfg) if key == "rope_theta" else cfg.get(key)
    theta = over.get(key, out.get("rope_theta", 10000.0 if base is None else base))
    out["rope_theta"] = float(theta)
    return out


def _rope(fam: str, cfg: dict, over: dict, kind: str, head_dim: int) -> Rope:
    p = _rope_params(fam, cfg, over, kind)
    factor = float(over.get("partial_rotary_factor", p.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))))
    dim = int(head_dim * factor)
    # float32 as transformers builds it: the angles of long positions then round the same way.
    inv = (1.0 / (np.float32(p["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    inv = inv.astype(np.float32)
    kind_ = p.get("rope_type", "default")
    if kind_ == "linear":
        inv = (inv / np.float32(p["factor"])).astype(np.float32)
    elif kind_ == "llama3":
        factor, low, high = float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"])
        old = float(p.get("original_max_position_embeddings", cfg.get("max_position_embeddings")))
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    elif kind_ != "default":
        raise UnsupportedModel(f"rope type {kind_!r} is not implemented by the reference forward")
    return Rope(inv, dim)


def resolve(config: dict, over: dict | None = None) -> Spec:
    """The Spec of ``config`` with ``over`` (an Injection's config) laid over it."""
    fam = family(config)
    if fam is None:
        raise UnsupportedModel(f"model_type {config.get('model_type')!r} is not a supported family")
    over = dict(over or {})
    cfg = modelconfig.text_config(config)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = modelconfig.head_dim(cfg)
    n = int(cfg["num_hidden_layers"])
    # Gemma reads hidden_activation; an injected hidden_act replaces the activation in any family.
    keys = ("hidden_activation", "hidden_act") if fam in GEMMA else ("hidden_act", "hidden_activation")
    act_name = over.get("hidden_act", _pick(cfg, over, *keys, default="silu"))
    act = ACTIVATIONS.get(str(act_name))
    if act is None:
        raise UnsupportedModel(f"activation {act_name!r} is not implemented by the reference forward")
    if "attention_scale" in over:
        scale = float(over["attention_scale"])
    elif fam in GEMMA:
        scale = float(_pick(cfg, over, "query_pre_attn_scalar", default=head_dim)) ** -0.5
    else:
        scale = head_dim ** -0.5
    types = _layer_types(fam, cfg, n)
    window = _pick(cfg, over, "sliding_window")
    ropes = {t: _rope(fam, cfg, over, t, head_dim) for t in set(types)}
    gemma_cap = lambda key: _pick(cfg, over, key) if fam in GEMMA else over.get(key)  # noqa: E731
    embed_scale = over.get("embed_scale", hidden ** 0.5 if fam in GEMMA else None)
    experts = int(_pick(cfg, over, "num_experts", "num_local_experts", default=0)) if fam in MOE else 0
    # Qwen3-MoE keeps a dense MLP on mlp_only_layers and off the decoder_sparse_step grid.
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    moe = tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n))
    return Spec(
        family=fam, hidden=hidden, heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim, layers=n,
        eps=float(_pick(cfg, over, "rms_norm_eps", default=1e-6)), act=act, attn_scale=scale,
        attn_softcap=gemma_cap("attn_logit_softcapping"), final_softcap=gemma_cap("final_logit_softcapping"),
        embed_scale=embed_scale,
        layer_types=tuple(types), windows=tuple(int(window) if window and t == "sliding_attention" else None for t in types),
        ropes=tuple(ropes[t] for t in types),
        tied=bool(_pick(cfg, over, "tie_word_embeddings", default=fam in GEMMA)),
        moe_layers=moe, experts=experts, top_k=int(_pick(cfg, over, "num_experts_per_tok", default=0)) if fam in MOE else 0,
        # Mixtral always renormalises the top-k weights (its config has no norm_topk_prob).
        norm_topk=bool(over.get("norm_topk_prob", True) if fam == "mixtral" else _pick(cfg, over, "norm_topk_prob",
                                                                                        default=False)))
