"""Attention-side cases for the replay tests (tools/make_replay_cases.py registers them).

A wrong attention scale on either side, and a wrong rope_theta on the transformers side, where
RoPE is computed inline (the model-level rotary_emb's cos/sin, applied inside the attention
forward); and a clean Gemma 2 pair, whose attention has every value the replay fits (scale from
query_pre_attn_scalar, logit soft cap, a sliding window on layer 0). Half precision on both
sides keeps each pair under 1.5 MB; the faults stay above the engine noise (case.json
``measured``).

Public API:
    CASES                                  the cases, in generation order
    train_model(model, fault) -> model     the transformers model with the fault applied
    rollout_model(model, fault) -> model   the vLLM-structured model with the fault applied
"""
from __future__ import annotations

from .cases import Case, fault

_BF16 = {"train": "bf16", "rollout": "bf16"}
# theta 1e6 against 1e4 moves 8 positions' rotations by a few percent of the output: above fp16's
# engine noise, not bf16's.
_FP16 = {"train": "fp16", "rollout": "fp16"}
WRONG_SCALE = 1.0          # instead of head_dim**-0.5 = 0.25
WRONG_THETA = 1e6          # instead of the config's 1e4
_AT = "model.layers.0.self_attn"

CASES = [
    Case("llama_tensor_attn_scale_train", task="tensor", dtype=_BF16, fault=fault(
        "train", "attn_scale", _AT, "train: every attention scales its scores by 1.0 instead of "
        "head_dim**-0.5", value=WRONG_SCALE)),
    Case("llama_tensor_attn_scale_rollout", task="tensor", dtype=_BF16, fault=fault(
        "rollout", "attn_scale", _AT, "rollout: every Attention scales its scores by 1.0 instead of "
        "head_dim**-0.5", value=WRONG_SCALE)),
    Case("llama_tensor_rope_theta_train", task="tensor", dtype=_FP16, fault=fault(
        "train", "rope_theta", _AT, "train: rotary_emb built with rope_theta 1e6 instead of the "
        "config's 1e4 (RoPE inline in transformers' attention)", value=WRONG_THETA)),
    Case("gemma2_tensor_clean", family="gemma2", task="tensor", dtype=_BF16),
]


def train_model(model, fault_):
    """Apply an attention fault to a transformers model: every attention's ``scaling``, or the
    model-level rotary table (inv_freq) recomputed with another theta."""
    import torch

    if fault_["kind"] == "attn_scale":
        for layer in model.model.layers:
            layer.self_attn.scaling = fault_["value"]
    else:
        rot = model.model.rotary_emb
        dim = 2 * rot.inv_freq.shape[0]
        inv = 1.0 / (fault_["value"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        rot.inv_freq.copy_(inv)
        rot.original_inv_freq.copy_(inv)
    return model


def rollout_model(model, fault_):
    """Apply an attention fault to a vllm_like model (every Attention's ``scale``)."""
    for layer in model.model.layers:
        layer.self_attn.attn.scale = fault_["value"]
    return model
