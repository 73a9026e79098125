"""HF transformers (5.x) Llama, plain (``hf``) or under FSDP1 (``hf_fsdp``).

Module tree, call signatures and output objects follow ``modeling_llama.py`` as dumped by
msprobe (see msprobe_samples/llama_L0_statistics): eager attention, RoPE and the attention
kernel are functions, ``act_fn`` returns ``act(gate)`` only and LlamaMLP multiplies by ``up``.

FSDP1 wraps the causal LM and every decoder layer: ``_fsdp_wrapped_module.`` appears at the root
and inside each layer, and each layer's ``FullyShardedDataParallel`` wrapper is itself dumped.
Options (``hf_fsdp`` only):

* ``checkpoint``: torch ``checkpoint_wrapper`` inside each FSDP unit adds
  ``_checkpoint_wrapped_module.`` and a ``CheckpointWrapper`` entry;
* ``use_orig_params`` (default True): when False, FSDP replaces the modules' parameters by one
  ``_flat_param`` on each wrapped unit, so leaf modules dump ``"parameters": {}``.

The FSDP side is called the way verl's actor calls it (``input_ids``, ``position_ids``,
``use_cache=False``) and its root ``LlamaForCausalLM`` entry outputs a CausalLMOutputWithPast.
"""
import numpy as np

from .common import Side, causal_mask, extra_op

ACT_CLASSES = {"silu": "SiLUActivation", "gelu_tanh": "GELUTanh", "relu": "ReLU"}
FSDP = "_fsdp_wrapped_module"
CKPT = "_checkpoint_wrapped_module"
BF16_MIN = -3.3895313892515355e38
F32_MIN = float(np.finfo(np.float32).min)


def _flat(*weights) -> np.ndarray:
    return np.concatenate([w.ravel() for w in weights])


class _HF:
    """One forward pass of LlamaForCausalLM, optionally FSDP-wrapped."""

    def __init__(self, s: Side, fsdp: bool):
        self.s = s
        self.fsdp = fsdp
        self.checkpoint = fsdp and s.options.get("checkpoint", False)
        self.orig_params = not fsdp or s.options.get("use_orig_params", True)

    def params(self, **weights) -> dict:
        return weights if self.orig_params else {}

    def flat_param(self, *weights) -> dict:
        return {} if self.orig_params else {"_flat_param": _flat(*weights)}

    def linear(self, path: str, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        with self.s.rec.module(path, "Linear", args=[x], params=self.params(weight=w)) as m:
            return m.returns(self.s.k.linear(x, w))

    def norm(self, path: str, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        with self.s.rec.module(path, "LlamaRMSNorm", args=[x], params=self.params(weight=w)) as m:
            return m.returns(self.s.k.rms_norm(x, w, eps))

    def run(self) -> None:
        s, w = self.s, self.s.plan.weights
        root = f"{FSDP}." if self.fsdp else ""
        ids, pos = s.ids[None], s.positions[None]
        kwargs = {"input_ids": ids, "attention_mask": None, "position_ids": pos, "use_cache": False}
        with s.rec.module(FSDP, "LlamaForCausalLM", kwargs=kwargs, enabled=self.fsdp,
                          params=self.flat_param(w.embed, w.final_norm, w.lm_head)) as top:
            hidden = self.model(f"{root}model")
            with s.k.bf16_scope(s.plan.lm_head_bf16):
                logits = self.linear(f"{root}lm_head", hidden, w.lm_head)
            top.returns({"loss": None, "logits": logits, "cache": None, "hidden_states": None,
                         "attentions": None})

    def model(self, path: str) -> np.ndarray:
        s, w = self.s, self.s.plan.weights
        ids, pos = s.ids[None], s.positions[None]
        if self.fsdp:
            kwargs = {"input_ids": ids, "attention_mask": None, "position_ids": pos, "cache": None,
                      "inputs_embeds": None, "use_cache": False}
        else:
            kwargs = {"input_ids": ids, "attention_mask": None, "position_ids": None, "cache": None,
                      "inputs_embeds": None, "use_cache": None}
        with s.rec.module(path, "LlamaModel", kwargs=kwargs) as m:
            with s.rec.module(f"{path}.embed_tokens", "Embedding", args=[ids],
                              params=self.params(weight=w.embed)) as e:
                x = e.returns(s.k.embed(ids, w.embed))
            with s.rec.module(f"{path}.rotary_emb", "LlamaRotaryEmbedding", args=[x],
                              kwargs={"position_ids": pos}) as r:
                cos, sin = s.k.rope_cos_sin(s.angles())
                r.returns((s.rec.const(cos[None]), s.rec.const(sin[None])))
            mask = s.rec.const(causal_mask(s.cfg.seq_len, BF16_MIN if s.k.bf16 else F32_MIN))
            layer_kwargs = {"attention_mask": mask,
                            "position_embeddings": (s.rec.const(cos[None]), s.rec.const(sin[None])),
                            "position_ids": pos, "cache": None, "use_cache": not self.fsdp}
            for i in range(s.cfg.layers):
                x = self.layer(f"{path}.layers.{i}", i, x, layer_kwargs, (cos, sin))
            x = self.norm(f"{path}.norm", x, w.final_norm, s.plan.eps(None))
            return m.returns({"last_hidden_state": x, "cache": None, "hidden_states": None,
                              "attentions": None})["last_hidden_state"]

    def layer(self, path: str, i: int, x, kwargs: dict, rope) -> np.ndarray:
        s, lw = self.s, self.s.plan.weights.layers[i]
        inner = f"{path}.{FSDP}" if self.fsdp else path
        body = f"{inner}.{CKPT}" if self.checkpoint else inner
        flat = self.flat_param(lw.q, lw.k, lw.v, lw.o, lw.gate, lw.up, lw.down,
                               lw.input_norm, lw.post_norm)
        rec = s.rec
        with rec.module(path, "FullyShardedDataParallel", args=[x], kwargs=kwargs, enabled=self.fsdp) as fw, \
                rec.module(inner, "CheckpointWrapper", args=[x], kwargs=kwargs,
                           enabled=self.checkpoint) as cw, \
                rec.module(body, "LlamaDecoderLayer", args=[x], kwargs=kwargs, params=flat) as dl:
            h = self.norm(f"{body}.input_layernorm", x, lw.input_norm, s.plan.eps(i))
            attn_kwargs = {"hidden_states": h, "attention_mask": kwargs["attention_mask"],
                           "position_ids": kwargs["position_ids"], "cache": None,
                           "use_cache": kwargs["use_cache"],
                           "position_embeddings": kwargs["position_embeddings"]}
            with rec.module(f"{body}.self_attn", "LlamaAttention", kwargs=attn_kwargs) as at:
                a = at.returns(self.attention(f"{body}.self_attn", lw, h, rope))[0]
            x = s.k.add(x, a)
            h = self.norm(f"{body}.post_attention_layernorm", x, lw.post_norm, s.plan.eps(i))
            with rec.module(f"{body}.mlp", "LlamaMLP", args=[h]) as mm:
                y = mm.returns(self.mlp(f"{body}.mlp", i, h))
            x = s.k.add(x, y)
            for call in (dl, cw, fw):
                call.returns(x)
        return x

    def attention(self, path: str, lw, h, rope):
        """q/k/v/o projections around the functional RoPE and eager attention; (out, probs)."""
        s, cfg = self.s, self.s.cfg
        t, hd = cfg.seq_len, cfg.head_dim
        q = self.linear(f"{path}.q_proj", h, lw.q)
        k = self.linear(f"{path}.k_proj", h, lw.k)
        v = self.linear(f"{path}.v_proj", h, lw.v)
        cos, sin = rope
        qr = s.k.rope(q.reshape(t, cfg.heads, hd), cos, sin)
        kr = s.k.rope(k.reshape(t, cfg.kv_heads, hd), cos, sin)
        o, probs = s.k.attention(qr, kr, v.reshape(t, cfg.kv_heads, hd))
        return self.linear(f"{path}.o_proj", o[None], lw.o), probs[None]

    def mlp(self, path: str, i: int, h) -> np.ndarray:
        """down(act_fn(gate(h)) * up(h)); without an activation the act_fn module is absent."""
        s, lw = self.s, self.s.plan.weights.layers[i]
        gate = self.linear(f"{path}.gate_proj", h, lw.gate)
        act = s.plan.acts[i]
        if act is not None:
            with s.rec.module(f"{path}.act_fn", ACT_CLASSES[act], args=[gate]) as m:
                gate = m.returns(s.k.act(act, gate))
        up = self.linear(f"{path}.up_proj", h, lw.up)
        hidden = extra_op(s, i, path, s.k.mul(gate, up))
        return self.linear(f"{path}.down_proj", hidden, lw.down)


def run_hf(s: Side) -> None:
    """Plain HF LlamaForCausalLM (the root passed to msprobe, so not dumped itself)."""
    _HF(s, fsdp=False).run()


def run_hf_fsdp(s: Side) -> None:
    """FSDP1-wrapped HF LlamaForCausalLM; options ``checkpoint`` and ``use_orig_params``."""
    _HF(s, fsdp=True).run()
