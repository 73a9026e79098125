"""PyTorch re-creations of SGLang's module trees (Llama, Qwen2, Qwen3), tensor-parallel over gloo.

SGLang names its layers like vLLM (both descend from the same code) but calls them differently,
and those calls are what msprobe records: every model, layer and attention forward takes a
``forward_batch``; attention is ``RadixAttention(q, k, v, forward_batch)``; the logits processor
runs inside the model's forward as ``logits_processor(input_ids, hidden_states, lm_head,
forward_batch)``, keeps the last position of a prefill (every position of a decode step),
all-gathers the vocabulary shards so that every rank holds the logits, casts them to float32 and
returns a ``LogitsProcessorOutput``.  Behaviour follows SGLang 0.4.10 (python/sglang/srt/models/
llama.py, qwen2.py, qwen3.py; srt/layers/radix_attention.py, logits_processor.py,
rotary_embedding.py; srt/managers/schedule_batch.py), checked against SGLang's source (see
README.md "What SGLang does"): one rotary module per rope setting shared by every layer
(``get_rope``'s process-wide cache, as in vLLM), the ``model`` module dumped (a plain
``nn.Module`` called through ``__call__``), int64 input ids, Qwen3's q_norm/k_norm on
``[tokens * heads, head_dim]``.  The shared layers (linear, embedding, norms, rotary) are
vllm_like's, which SGLang's layers match in name and behaviour for these models.

Public API:
    build(hf_config, dtype=torch.float32, family="llama", **options)   as vllm_like.build
    model.load_weights(hf_state_dict)
    model(input_ids, positions, forward_batch) -> LogitsProcessorOutput   one engine forward
    ForwardBatch(forward_mode)          "extend" (prefill) or "decode"
    generate(model, prompt_ids, new_tokens, step_scope=None) -> list[int]  as vllm_like.generate
    FAMILIES
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from . import dist, vllm_like as V


class ForwardBatch:
    """srt/model_executor/forward_batch_info.py ForwardBatch, reduced to the forward mode."""

    def __init__(self, forward_mode):
        self.forward_mode = forward_mode


@dataclasses.dataclass
class LogitsProcessorOutput:
    """srt/layers/logits_processor.py LogitsProcessorOutput, a dataclass: msprobe records every field,
    so a generation step without log-probs shows the logits and the others as null."""

    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None
    next_token_logprobs: torch.Tensor | None = None
    next_token_top_logprobs_val: list | None = None
    next_token_top_logprobs_idx: list | None = None
    next_token_token_ids_logprobs_val: list | None = None
    next_token_token_ids_logprobs_idx: list | None = None
    input_token_logprobs: torch.Tensor | None = None
    input_top_logprobs_val: list | None = None
    input_top_logprobs_idx: list | None = None
    input_token_ids_logprobs_val: list | None = None
    input_token_ids_logprobs_idx: list | None = None


class LogitsProcessor(nn.Module):
    """srt/layers/logits_processor.py LogitsProcessor: prune to the sampled rows, head shard,
    all-gather over TP ranks (every rank gets the logits), drop the padded vocabulary columns,
    cast to float32 (``_get_logits``: the output is float32 whatever the model dtype), final soft
    cap."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.soft_cap = getattr(config, "final_logit_softcapping", None)

    def forward(self, input_ids, hidden_states, lm_head, logits_metadata):
        if logits_metadata.forward_mode == "extend":
            hidden_states = hidden_states[-1:]  # one sequence: its last position
        logits = torch.nn.functional.linear(hidden_states.to(lm_head.weight.dtype), lm_head.weight)
        logits = dist.all_gather_last_dim(logits)[..., :self.config.vocab_size].float()
        if self.soft_cap:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return LogitsProcessorOutput(next_token_logits=logits)


class RadixAttention(V.Attention):
    """srt/layers/radix_attention.py RadixAttention: ``attn(q, k, v, forward_batch)``; the KV cache
    is the one sequence's (the radix tree and token pool reduced to a list)."""

    def forward(self, q, k, v, forward_batch, save_kv_cache=True):
        return super().forward(q, k, v)


def _as(cls, base, doc):
    """Give a generated class the name of the SGLang class it stands for (msprobe records it)."""
    cls.__name__ = cls.__qualname__ = base.__name__
    cls.__doc__ = f"srt/models (SGLang 0.4.10) {base.__name__}: {doc}"
    return cls


def _sglang_attention(base):
    class Attn(base):
        def __init__(self, cfg, layer_idx, opts, bias=False):
            super().__init__(cfg, layer_idx, opts, bias)
            a = self.attn
            self.attn = RadixAttention(a.num_heads, a.head_size, a.scale, a.num_kv_heads,
                                       a.sliding_window, a.logits_soft_cap)

        def _qk_norm(self, q, k):
            # qwen3.py _apply_qk_norm: the norms get every head as a row, [tokens * heads, head_dim]
            # (vLLM keeps [tokens, heads, head_dim])
            if not hasattr(self, "q_norm"):
                return q, k
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
            return q, k

        def forward(self, positions, hidden_states, forward_batch):
            qkv, _ = self.qkv_proj(hidden_states)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = self._qk_norm(q, k)
            q, k = self.rotary_emb(positions, q, k)
            attn_output = self.attn(q, k, v, forward_batch)
            output, _ = self.o_proj(attn_output)
            return output
    return _as(Attn, base, "self_attn(positions, hidden, forward_batch).")


def _sglang_layer(base, attention_cls):
    class Layer(base):
        def forward(self, positions, hidden_states, forward_batch, residual):
            hidden_states, residual = V.first_norm(self.input_layernorm, hidden_states, residual)
            hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states,
                                           forward_batch=forward_batch)
            hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
            hidden_states = self.mlp(hidden_states)
            return hidden_states, residual
    Layer.attention_cls = attention_cls
    return _as(Layer, base, "layer(positions, hidden, forward_batch, residual).")


def _sglang_model(base, layer_cls):
    class Model(base):
        def forward(self, input_ids, positions, forward_batch):
            hidden_states, residual = self._embed(input_ids), None
            for layer in self.layers:
                hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
            hidden_states, _ = self.norm(hidden_states, residual)
            return hidden_states
    Model.layer_cls = layer_cls
    # SGLang's LlamaModel/Qwen2Model/Qwen3Model are plain nn.Modules that the CausalLM calls through
    # __call__, so msprobe's hook runs (vllm_like's bypass is vLLM's @support_torch_compile)
    Model.hooked = True
    return _as(Model, base, "model(input_ids, positions, forward_batch).")


def _sglang_causal_lm(base, model_cls):
    class CausalLM(base):
        def __init__(self, cfg, opts):
            super().__init__(cfg, opts)
            self.logits_processor = LogitsProcessor(cfg)

        def forward(self, input_ids, positions, forward_batch):
            hidden_states = self.model(input_ids, positions, forward_batch)
            return self.logits_processor(input_ids, hidden_states, self.lm_head, forward_batch)
    CausalLM.model_cls = model_cls
    return _as(CausalLM, base, "forward returns the logits processor's output (logits on every rank).")


def _family(causal, model, layer, attention):
    attn = _sglang_attention(attention)
    lay = _sglang_layer(layer, attn)
    mod = _sglang_model(model, lay)
    return _sglang_causal_lm(causal, mod)


FAMILIES = {
    "llama": _family(V.LlamaForCausalLM, V.LlamaModel, V.LlamaDecoderLayer, V.LlamaAttention),
    "qwen2": _family(V.Qwen2ForCausalLM, V.Qwen2Model, V.Qwen2DecoderLayer, V.Qwen2Attention),
    "qwen3": _family(V.Qwen3ForCausalLM, V.Qwen3Model, V.Qwen3DecoderLayer, V.Qwen3Attention),
}
FAMILIES["mistral"] = FAMILIES["llama"]


def build(hf_config, dtype=torch.float32, family="llama", **options) -> nn.Module:
    """The family's SGLang CausalLM for this process's TP rank; one rotary module per rope setting
    (SGLang's get_rope caches it process-wide, as vLLM's does: vllm_like.get_rope)."""
    opts = {"dtype": dtype, "eps": options.pop("norm_eps", None) or hf_config.rms_norm_eps, **options}
    return FAMILIES[family](hf_config, opts)


@torch.no_grad()
def generate(model, prompt_ids, new_tokens, step_scope=None) -> list[int]:
    model.reset_cache()
    # schedule_batch.py builds the prefill's input_ids as int64; a decode step's are the sampled
    # ids (greedy argmax: int64)
    ids = torch.as_tensor(prompt_ids, dtype=torch.long)
    positions = torch.arange(ids.shape[0])
    out, mode = [], "extend"
    for i in range(new_tokens):
        with (step_scope(i) if step_scope is not None else contextlib.nullcontext()):
            logits = model(ids, positions, ForwardBatch(mode)).next_token_logits
        tok = dist.broadcast_int(int(logits[-1].float().argmax()))
        out.append(tok)
        ids, positions, mode = torch.tensor([tok]), positions[-1:] + 1, "decode"
    return out
