"""The reference forward: every standard module's output, in execution order, layer by layer.

Each family's decoder layer is written from its transformers model code (module names, order of
the hooks, where norms sit); weights come from ``weights.Weights`` one module at a time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..checkpoint import Checkpoint
from . import ops
from .spec import GEMMA, Spec, resolve
from .weights import Weights


@dataclass(frozen=True)
class Injection:
    """A candidate fault, applied from layer ``from_layer`` on.

    ``config``: config keys laid over config.json (rms_norm_eps, rope_theta, rope_local_base_freq,
    hidden_act, attention_scale (the score multiplier itself), query_pre_attn_scalar, embed_scale,
    norm_topk_prob, tie_word_embeddings, attn_logit_softcapping, final_logit_softcapping,
    sliding_window, partial_rotary_factor, ...); they apply to layers >= from_layer, the final
    norm and the head, and to the embedding only when from_layer is 0.
    ``weights``: tensor name (``model.``-prefixed checkpoint name, or the fused / split form of a
    projection, or ``lm_head.weight``) -> function of the float32 tensor returning its replacement;
    layer tensors are replaced in layers >= from_layer, the embedding and head always."""
    config: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    from_layer: int = 0


@dataclass
class Output:
    """One module's output.0 as transformers names the module, [tokens, features] float32
    (q_norm / k_norm: [tokens, heads * head_dim]; rotary_emb: the cos table [tokens, rotary dim]);
    a tuple for a module with several outputs (a layer's rotary_emb: the rotated q and k)."""
    module: str
    array: np.ndarray | tuple
    engine: bool = False        # a module transformers does not have (forward's ``engine_points``)


def forward(ckpt: Checkpoint, config: dict, token_ids: np.ndarray, *, dtype: str = "fp32",
            inject: Injection | None = None, start_layer: int = 0, hidden: np.ndarray | None = None,
            positions: np.ndarray | None = None, attention: str = "eager",
            engine_points: bool = False) -> Iterator[Output]:
    """:func:`_forward`, with the outputs of the modules only an engine has (``engine_points``: each
    layer's rotary module, its rotated q and k, and the attention kernel's output, which
    transformers computes inline and vLLM dumps as modules) left out unless asked for."""
    outs = _forward(ckpt, config, token_ids, dtype=dtype, inject=inject, start_layer=start_layer, hidden=hidden,
                    positions=positions, attention=attention)
    return outs if engine_points else (o for o in outs if not o.engine)


def _forward(ckpt: Checkpoint, config: dict, token_ids: np.ndarray, *, dtype: str = "fp32",
             inject: Injection | None = None, start_layer: int = 0, hidden: np.ndarray | None = None,
             positions: np.ndarray | None = None, attention: str = "eager") -> Iterator[Output]:
    """Run the checkpoint's forward on one sequence of ``token_ids`` and yield each module's output.

    ``dtype``: "fp32", or "bf16" to round weights and each module output (and the residual
    stream) to bfloat16 as the engines do. ``start_layer`` with ``hidden`` (that layer's input,
    [tokens, hidden_size]) resumes mid-model: nothing before that layer is yielded.
    ``positions``: rotary position ids (default 0..T-1). ``attention``: where the attention kernel
    rounds in bf16 (ops.attention: "eager" is transformers' eager attention, "flash" a flash
    kernel, "fp32" none). Raises spec.UnsupportedModel for a family or feature not implemented,
    ValueError for bad arguments."""
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, not {dtype!r}")
    if attention not in ops.ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ops.ATTENTION)}, not {attention!r}")
    inject = inject or Injection()
    rnd = ops.bf16 if dtype == "bf16" else ops.identity
    base = resolve(config)
    hurt = resolve(config, inject.config) if inject.config else base
    spec_at = lambda i: hurt if i >= inject.from_layer else base  # noqa: E731
    ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
    t = ids.size
    if t == 0:
        raise ValueError("no token ids")
    pos = np.arange(t) if positions is None else np.asarray(positions, dtype=np.int64).reshape(-1)
    if pos.size != t:
        raise ValueError(f"{pos.size} positions for {t} tokens")
    if not 0 <= start_layer <= base.layers:
        raise ValueError(f"start_layer {start_layer} outside 0..{base.layers}")
    w = Weights(ckpt, hurt, inject.weights, inject.from_layer, rnd)
    if hidden is None:
        if start_layer:
            raise ValueError("start_layer > 0 needs that layer's input as hidden")
        x = yield from _embed(w, spec_at(0), ids, pos, rnd)
    else:
        x = rnd(np.asarray(hidden, dtype=np.float32).reshape(t, base.hidden))
    for i in range(start_layer, base.layers):
        x = yield from _layer(w, spec_at(i), i, x, pos, rnd, attention)
    h = ops.rms_norm(x, w.need("model.norm.weight"), hurt.eps, rnd, hurt.family in GEMMA)
    yield Output("model.norm", h)
    yield Output("lm_head", w.head(h))


def final_logits(config: dict, lm_head_output: np.ndarray, dtype: str = "fp32",
                 inject: Injection | None = None) -> np.ndarray:
    """The logits after the head: Gemma 2's final softcapping applies after lm_head (the
    CausalLM forward, not a module), as a rollout engine's logits processor applies it."""
    spec = resolve(config, (inject or Injection()).config)
    return ops.softcap(lm_head_output, spec.final_softcap, ops.bf16 if dtype == "bf16" else ops.identity)


def _embed(w: Weights, s: Spec, ids: np.ndarray, pos: np.ndarray, rnd):
    x = w.embedding(ids)
    if s.embed_scale is not None:     # Gemma: the scale is cast to the weights' dtype first
        x = rnd(x * rnd(np.float32(s.embed_scale)), inplace=True)
    yield Output("model.embed_tokens", x)
    # Gemma 3 calls its rotary module once per attention type, sliding first; the others once.
    kinds = sorted(set(s.layer_types), reverse=True) if s.family == "gemma3" else [s.layer_types[0]]
    for kind in kinds:
        rope = s.ropes[s.layer_types.index(kind)]
        yield Output("model.rotary_emb", ops.rope_tables(rope.inv_freq, pos, rnd)[0])
    return x


def _layer(w: Weights, s: Spec, i: int, x: np.ndarray, pos: np.ndarray, rnd, kernel: str):
    p = f"model.layers.{i}"
    gemma = s.family in GEMMA
    norm = lambda name, v: ops.rms_norm(v, w.need(f"{p}.{name}.weight", i), s.eps, rnd, gemma)  # noqa: E731
    h = norm("input_layernorm", x)
    yield Output(f"{p}.input_layernorm", h)
    a = yield from _attention(w, s, i, h, pos, rnd, kernel)
    if gemma:     # Gemma's sandwich: the sublayer's output is normed before the residual add
        a = norm("post_attention_layernorm", a)
        yield Output(f"{p}.post_attention_layernorm", a)
        x = rnd(x + a, inplace=True)
        h = norm("pre_feedforward_layernorm", x)
        yield Output(f"{p}.pre_feedforward_layernorm", h)
    else:
        x = rnd(x + a, inplace=True)
        h = norm("post_attention_layernorm", x)
        yield Output(f"{p}.post_attention_layernorm", h)
    m = yield from (_moe(w, s, i, h, rnd) if s.moe_layers and s.moe_layers[i] else _mlp(w, s, i, h, rnd))
    if gemma:
        m = norm("post_feedforward_layernorm", m)
        yield Output(f"{p}.post_feedforward_layernorm", m)
    x = rnd(x + m, inplace=True)
    yield Output(p, x)
    return x


def _attention(w: Weights, s: Spec, i: int, h: np.ndarray, pos: np.ndarray, rnd, kernel: str):
    a = f"model.layers.{i}.self_attn"
    t, d = h.shape[0], s.head_dim
    sizes = (s.heads * d, s.kv_heads * d, s.kv_heads * d)
    split = ("q_proj", "k_proj", "v_proj")
    weights = w.parts(a, split, "qkv_proj", sizes, i)
    biases = w.parts(a, split, "qkv_proj", sizes, i, kind="bias")
    q, k, v = (ops.linear(h, wt, b, rnd) for wt, b in zip(weights, biases))
    fused = not w.has(f"{a}.q_proj.weight")
    heads = {"q": q.reshape(t, s.heads, d), "k": k.reshape(t, s.kv_heads, d)}
    normed = {}
    for name in ("q", "k"):
        nw = w.get(f"{a}.{name}_norm.weight", i)
        if nw is not None:    # Qwen3 / Gemma 3: RMSNorm over each head
            normed[name] = ops.rms_norm(heads[name], nw, s.eps, rnd, s.family in GEMMA)
    if fused:    # Phi-3: one qkv_proj module
        order = [("qkv_proj", np.concatenate([q, k, v], axis=-1))]
    else:
        order = [("q_proj", q), ("q_norm", normed.get("q")), ("k_proj", k), ("k_norm", normed.get("k")), ("v_proj", v)]
        if s.family == "gemma3":    # projections first, then the two norms
            order = order[0::2] + order[1::2]
    for name, out in order:
        if out is not None:
            yield Output(f"{a}.{name}", out.reshape(t, -1))
    heads.update(normed)
    rope = s.ropes[i]
    cos, sin = ops.rope_tables(rope.inv_freq, pos, rnd)
    qr, kr = (ops.apply_rope(heads[n], cos, sin, rnd) for n in ("q", "k"))
    # What an engine's rotary and attention-kernel modules output (vLLM dumps both; HF computes them inline).
    yield Output(f"{a}.rotary_emb", (qr.reshape(t, -1), kr.reshape(t, -1)), engine=True)
    core = ops.attention(qr, kr, v.reshape(t, s.kv_heads, d), s.attn_scale, s.attn_softcap, s.windows[i], rnd,
                         kernel)
    yield Output(f"{a}.attn", core.reshape(t, -1), engine=True)
    o = ops.linear(core, w.need(f"{a}.o_proj.weight", i), w.get(f"{a}.o_proj.bias", i), rnd)
    yield Output(f"{a}.o_proj", o)
    yield Output(a, o)
    return o


def _mlp(w: Weights, s: Spec, i: int, h: np.ndarray, rnd):
    m = f"model.layers.{i}.mlp"
    gw, uw = w.parts(m, ("gate_proj", "up_proj"), "gate_up_proj", None, i)
    gb, ub = w.parts(m, ("gate_proj", "up_proj"), "gate_up_proj", None, i, kind="bias")
    gate, up = ops.linear(h, gw, gb, rnd), ops.linear(h, uw, ub, rnd)
    if not w.has(f"{m}.gate_proj.weight"):    # Phi-3: gate_up_proj, then activation_fn
        yield Output(f"{m}.gate_up_proj", np.concatenate([gate, up], axis=-1))
        act = ops.act(s.act, gate, rnd)
        yield Output(f"{m}.activation_fn", act)
    else:
        yield Output(f"{m}.gate_proj", gate)
        act = ops.act(s.act, gate, rnd)
        yield Output(f"{m}.act_fn", act)
        yield Output(f"{m}.up_proj", up)
    out = ops.linear(rnd(act * up, inplace=True), w.need(f"{m}.down_proj.weight", i), w.get(f"{m}.down_proj.bias", i), rnd)
    yield Output(f"{m}.down_proj", out)
    yield Output(m, out)
    return out


def _moe(w: Weights, s: Spec, i: int, h: np.ndarray, rnd):
    m = f"model.layers.{i}.mlp"
    logits = ops.linear(h, w.router(i), None, rnd)
    yield Output(f"{m}.gate", logits)
    z = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    # top-k by probability, highest first (torch.topk; ties go to the lower expert index)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :s.top_k]
    weight = np.take_along_axis(probs, top, axis=-1)
    if s.norm_topk:
        weight = weight / weight.sum(axis=-1, keepdims=True)
    if s.family != "mixtral":   # Mixtral's router keeps its weights in float32 (Qwen3-MoE casts them)
        weight = rnd(weight, inplace=True)
    # Each (token, slot) output times its weight, in the weight's dtype (bf16 x bf16 rounds,
    # bf16 x fp32 does not); a token's slots summed in float32 and rounded once, as
    # transformers' grouped experts and vLLM's fused MoE (moe_sum) do.
    slots = np.zeros((h.shape[0], s.top_k, h.shape[1]), dtype=np.float32)
    for e in np.unique(top):    # experts in index order, each on the tokens routed to it
        tok, slot = np.nonzero(top == e)
        gate_w, up_w, down_w = w.expert(i, int(e))
        xs = h[tok]
        inner = rnd(ops.act(s.act, ops.linear(xs, gate_w, None, rnd), rnd) * ops.linear(xs, up_w, None, rnd), inplace=True)
        y = ops.linear(inner, down_w, None, rnd) * weight[tok, slot][:, None]
        slots[tok, slot] = y if s.family == "mixtral" else rnd(y, inplace=True)
    out = rnd(slots.sum(axis=1), inplace=True)
    yield Output(f"{m}.experts", out)
    yield Output(m, out)
    return out
