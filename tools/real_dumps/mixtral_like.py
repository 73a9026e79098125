"""vLLM's Mixtral tree on top of vllm_like.py's Llama classes (TP=1).

vLLM (model_executor/models/mixtral.py) keeps Mixtral's MoE block under the checkpoint's old name
``block_sparse_moe`` (transformers 5.x calls it ``mlp``): ``gate`` is a GateLinear giving the
router logits (v0.32), ``experts`` a MoERunner (v0.32: what FusedMoEFactory returns) called with
them, whose never-called ``routed_experts`` FusedMoE holds the weights (softmax top-k, always
renormalised, ``w13_weight`` [E, 2I, H] = [w1 (gate); w3 (up)] per expert, ``w2_weight`` [E, H, I]);
the runner reduces its own result.
Attention, norms, embedding and logits are Llama's.

Public API:
    build(hf_config, dtype=torch.float32) -> MixtralForCausalLM
    model.load_weights(hf_state_dict)  transformers 5.x names (stacked experts) -> vLLM's
    the rest as vllm_like.LlamaForCausalLM (forward, compute_logits, reset_cache, generate)
"""
from __future__ import annotations

import torch
from torch import nn

from .vllm_like import (FusedMoE, GateLinear, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, MoERunner,
                        first_norm)


class MixtralAttention(LlamaAttention):
    """mixtral.py MixtralAttention: Llama's (qkv_proj, rotary_emb, attn, o_proj)."""


class MixtralMoE(nn.Module):
    """mixtral.py (v0.32) MixtralMoE: gate (GateLinear, called by the block) -> experts
    (MoERunner without a gate, ``experts(hidden_states, router_logits)`` positionally, the real
    router logits; renormalize; expert weights in its never-called ``routed_experts``)."""

    def __init__(self, cfg, opts):
        super().__init__()
        self.gate = GateLinear(cfg.hidden_size, cfg.num_local_experts, False, opts["dtype"])
        self.experts = MoERunner(FusedMoE(cfg.num_local_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                                          cfg.intermediate_size, False, True, opts["dtype"]))

    def forward(self, hidden_states):
        router_logits, _ = self.gate(hidden_states)
        return self.experts(hidden_states, router_logits)


class MixtralDecoderLayer(LlamaDecoderLayer):
    """mixtral.py MixtralDecoderLayer: Llama's layer with the MoE block as ``block_sparse_moe``."""

    attention_cls = MixtralAttention

    def __init__(self, cfg, layer_idx, opts):
        super().__init__(cfg, layer_idx, opts)
        self.block_sparse_moe = self._modules.pop("mlp")

    def _mlp(self, cfg, opts):
        return MixtralMoE(cfg, opts)

    def forward(self, positions, hidden_states, residual):
        hidden_states, residual = first_norm(self.input_layernorm, hidden_states, residual)
        hidden_states = self.self_attn(positions=positions, hidden_states=hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.block_sparse_moe(hidden_states), residual


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    model_cls = MixtralModel

    def _rename(self, name):
        for theirs, ours in ((".mlp.gate.", ".block_sparse_moe.gate."),
                             (".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.routed_experts.w13_weight"),
                             (".mlp.experts.down_proj", ".block_sparse_moe.experts.routed_experts.w2_weight")):
            name = name.replace(theirs, ours)
        return name


def build(hf_config, dtype=torch.float32) -> MixtralForCausalLM:
    """vLLM's Mixtral for ``hf_config`` (a MixtralConfig) in ``dtype``, on one rank."""
    return MixtralForCausalLM(hf_config, {"dtype": dtype, "eps": hf_config.rms_norm_eps}).eval()
