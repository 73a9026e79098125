"""Tiny transformers configs and checkpoints, one per model family, chosen so that each family's
features are visible in a few tokens.

Public API:
    FAMILIES                          family -> (transformers config class, model class, config kwargs)
    hf_config(family) -> PretrainedConfig
    hf_model(family, dtype=torch.float32) -> PreTrainedModel   eval mode, deterministic weights
        (seeded init, norm weights and biases drawn around their defaults so a wrong norm or bias
        shows)
    prompt(family, n=8, seed=42) -> list[int]  deterministic prompt token ids
"""
from __future__ import annotations

import torch

_BASE = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
             tie_word_embeddings=False, attn_implementation="eager")

# vocab 300 pads to 320 in vLLM (TP=2: 160 rows per rank, 20 of them padding on rank 1); one KV
# head with TP=2 is replicated on both ranks.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    # sliding window 4 < the 8-12 tokens of every case
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}),
    # window 4 on layer 0, soft caps small enough to be reached by the scores and logits
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4,
                "attn_logit_softcapping": 1.0, "final_logit_softcapping": 2.0,
                "tie_word_embeddings": True, "num_key_value_heads": 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # 4 experts, 2 per token: with 8+ tokens every expert is routed to
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "norm_topk_prob": True}),
}


def hf_config(family):
    import transformers

    cfg_name, _, extra = FAMILIES[family]
    return getattr(transformers, cfg_name)(**{**_BASE, **extra})


def hf_model(family, dtype=torch.float32):
    import transformers

    cfg = hf_config(family)
    torch.manual_seed(1000 + sorted(FAMILIES).index(family))
    model = getattr(transformers, FAMILIES[family][1])(cfg).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # ones (zeros for Gemma's 1+w) would hide a norm fault
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):  # Qwen2's q/k/v biases are large in released checkpoints
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:  # std 0.02 weights give activations of 1e-3; 0.1 keeps values O(1) through 2 layers
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model.to(dtype)


def prompt(family, n=8, seed=42):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, hf_config(family).vocab_size, (n,), generator=gen).tolist()
