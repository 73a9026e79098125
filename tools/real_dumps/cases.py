"""The corpus: one ``Case`` per train/rollout pair, and what each pair is expected to show.

Public API:
    Case                    dataclass: name, family, task, summary_mode, dtype {train, rollout},
                            rollout_tp, new_tokens (1 = prefill only), prompt_len, prompt_seed, rollout_opts,
                            train_layout (hf, fsdp1, fsdp2), rollout_engine (vllm, sglang),
                            fault (None or a dict, see ``fault``)
    case.mode               "statistics", "tensor" or "md5"
    fault(side, kind, target, detail, rank=None, **extra) -> dict   the injected fault
    CASES                   name -> Case, in generation order
    describe(case, measured) -> dict   the case.json document (schema 1)
    CLEAN_EXPECTED                     ``expected`` of a clean pair
    check_signal(name, fault, measured) raise unless the fault is MIN_RATIO x above the noise
    measure(case, scratch) -> dict     signal of the fault at its module and the engine noise, from
                                       the prefill outputs the sides captured

``expected`` is derived from the injected fault (which module, which category its kind belongs
to) and checked against the activations: the faulty module's output must differ from the same
side's clean run by more than ``MIN_RATIO`` times the largest train-vs-rollout difference of the
clean runs at the modules both engines compute identically.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MIN_RATIO = 10.0

# Outputs that mean the same tensor in transformers and in vLLM for these families (same shape
# after flattening the batch); used to measure the engine noise of a clean pair.
_ALIGNED_SUFFIXES = ("embed_tokens", "input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm", "self_attn",
                     "o_proj", "mlp", "down_proj", "model.norm")

# Outputs whose boundary differs by design in a family: transformers' Gemma 2 embedding module
# multiplies by sqrt(hidden) inside, vLLM's model multiplies after the embedding module.
_BOUNDARY_DIFFERS = {"gemma2": ("embed_tokens",)}

# fault kind -> (category, whether the dumps show the side)
_KINDS = {
    "stale_weight": ("parameter_or_checkpoint_issue", False),
    "wrong_shard": ("parameter_or_checkpoint_issue", False),
    "norm_eps": ("in_module_impl_difference", False),
    "act_swap": ("in_module_impl_difference", False),
    "extra_op": ("missing_or_extra_op_between_aligned_boundary", True),
    "dtype": ("in_module_impl_difference", True),
    "routing": ("in_module_impl_difference", False),
    "attn_scale": ("in_module_impl_difference", False),
    "rope_theta": ("in_module_impl_difference", False),
}


def fault(side, kind, target, detail, rank=None, **extra):
    return {"side": side, "kind": kind, "target": target, "rank": rank, "detail": detail, **extra}


@dataclass
class Case:
    name: str
    family: str = "llama"
    task: str = "statistics"
    summary_mode: str = "statistics"
    dtype: dict = field(default_factory=lambda: {"train": "fp32", "rollout": "fp32"})
    rollout_tp: int = 1
    new_tokens: int = 1
    prompt_len: int = 8
    prompt_seed: int = 42
    rollout_opts: dict = field(default_factory=dict)
    train_layout: str = "hf"
    rollout_engine: str = "vllm"
    fault: dict | None = None

    @property
    def mode(self):
        return "md5" if self.summary_mode == "md5" else self.task


def hf_modules(family, rollout_module):
    """The transformers modules a vLLM module stands for (fused projections unfused, except in
    Phi-3, whose transformers model is fused too)."""
    if family == "phi3" and rollout_module.endswith(("qkv_proj", "gate_up_proj")):
        return [rollout_module]
    if rollout_module.endswith("qkv_proj"):
        base = rollout_module[:-len("qkv_proj")]
        return [base + p for p in ("q_proj", "k_proj", "v_proj")]
    if rollout_module.endswith("gate_up_proj"):
        base = rollout_module[:-len("gate_up_proj")]
        return [base + "gate_proj", base + "up_proj"]
    if rollout_module == "logits_processor":
        return ["lm_head"]
    return [rollout_module]


def vllm_module(family, train_module):
    """The vLLM module a transformers module is part of (the inverse of ``hf_modules``)."""
    if family != "phi3":
        for part, fused in (("q_proj", "qkv_proj"), ("k_proj", "qkv_proj"), ("v_proj", "qkv_proj"),
                            ("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj")):
            if train_module.endswith("." + part):
                return train_module[:-len(part)] + fused
    return "logits_processor" if train_module == "lm_head" else train_module


def _layer(module):
    parts = module.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else None


CLEAN_EXPECTED = {"verdict": "clean", "category": None, "side": None, "train_modules": None,
                  "rollout_modules": None, "layer": None}


def check_signal(name, fault, measured):
    """Raise unless the fault moves its module by ``MIN_RATIO`` times the engine noise."""
    if measured["ratio"] < MIN_RATIO:
        raise ValueError(f"{name}: the fault moves {fault['target']} by only {measured['ratio']:.1f}x "
                         f"the engine noise; make it larger")


def _expected(case, measured):
    f = case.fault
    if f is None:
        return dict(CLEAN_EXPECTED)
    check_signal(case.name, f, measured)
    category, side_shown = _KINDS[f["kind"]]
    if f["kind"] == "extra_op":
        train, rollout = None, [f["target"]]
        if f["side"] == "train":
            train, rollout = rollout, None
    elif f["side"] == "rollout":
        train, rollout = hf_modules(case.family, f["target"]), [f["target"]]
    else:
        rollout = [vllm_module(case.family, f["target"])]
        train = hf_modules(case.family, rollout[0]) if rollout[0] != f["target"] else [f["target"]]
    return {"verdict": "root_cause_found", "category": category, "side": f["side"] if side_shown else None,
            "train_modules": train, "rollout_modules": rollout, "layer": _layer(f["target"])}


def _rel(a, b):
    import torch

    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    n = min(a.shape[0], b.shape[0])  # the prefill rows (the train side holds the whole sequence)
    a, b = a[:n], b[:n]
    return float(torch.linalg.norm(a - b) / max(float(torch.linalg.norm(b)), 1e-30))


def measure(case, scratch):
    import torch

    scratch = Path(scratch)
    train = torch.load(scratch / "train.pt")
    rollout = torch.load(scratch / "rollout_rank0.pt")
    noise, where = 0.0, None
    for name, t in train["clean"].items():
        r = rollout["clean"].get(name)
        if r is None or not name.endswith(_ALIGNED_SUFFIXES) or name.endswith(
                _BOUNDARY_DIFFERS.get(case.family, ())):
            continue
        if t.shape[-1] != r.shape[-1]:
            continue
        e = _rel(r, t)
        if e >= noise:
            noise, where = e, name
    out = {"noise": noise, "noise_module": where}
    f = case.fault
    if f is None:
        return out
    caps = train if f["side"] == "train" else torch.load(scratch / f"rollout_rank{f.get('rank') or 0}.pt")
    at = f.get("measure_at", f["target"])
    signal = _rel(caps["faulty"][at], caps["clean"][at])
    return {**out, "module": at, "rank": f.get("rank"), "rel_error": signal,
            "ratio": signal / noise if noise else float("inf")}


def describe(case, measured):
    f = case.fault
    public_fault = None if f is None else {k: f[k] for k in ("side", "kind", "target", "rank", "detail")}
    return {
        "schema": 1, "case": case.name, "family": case.family, "mode": case.mode, "dtype": case.dtype,
        "train": {"engine": "transformers", "tp": 1, "layout": case.train_layout,
                  "notes": "one forward of prompt + sampled tokens (all but the last)" + (
                      "; 2 FSDP ranks, rank 0 holds the rollout's sequence, rank 1 another"
                      if case.train_layout != "hf" else "")},
        "rollout": {"engine": f"{case.rollout_engine}_like", "tp": case.rollout_tp, "steps": case.new_tokens,
                    "notes": "prefill step0, then one step per decoded token" if case.new_tokens > 1
                    else "prefill only (step0)"},
        "fault": public_fault,
        "expected": _expected(case, measured),
        "measured": measured,
    }


# ----------------------------------------------------------------------------- the corpus
_BF16 = {"train": "bf16", "rollout": "bf16"}
_FUSED = {"rms_kernel": "fused"}  # vLLM's CUDA RMSNorm rounds once; transformers rounds twice
_STALE_DOWN = fault("rollout", "stale_weight", "model.layers.1.mlp.down_proj",
                    "rollout kept layer 1 down_proj.weight of the previous step (weight sync missed it)",
                    param="model.layers.1.mlp.down_proj.weight")
_WRONG_SHARD = fault("rollout", "wrong_shard", "model.layers.1.mlp.gate_up_proj",
                     "rank 1 loaded rank 0's gate rows into its gate_up_proj shard", rank=1,
                     shard_id=0, from_rank=0)


def _cases():
    c = [
        Case("llama_tp1_fp32_clean"),
        Case("llama_tp1_fp32_stale_rollout", fault=_STALE_DOWN),
        Case("llama_tp1_fp32_stale_train", fault=fault(
            "train", "stale_weight", "model.layers.0.self_attn.o_proj",
            "train side restored layer 0 o_proj.weight from an older checkpoint",
            param="model.layers.0.self_attn.o_proj.weight")),
        Case("llama_tp2_fp32_clean", rollout_tp=2),
        Case("llama_tp2_fp32_wrong_shard", rollout_tp=2, fault=_WRONG_SHARD),
        Case("llama_gen_fp32_clean", new_tokens=4),
        Case("llama_gen_tp2_fp32_stale_rollout", new_tokens=4, rollout_tp=2, fault=_STALE_DOWN),
        Case("llama_tp1_bf16_clean", dtype=_BF16, rollout_opts=_FUSED),
        Case("llama_tp1_bf16_stale_rollout", dtype=_BF16, rollout_opts=_FUSED, fault=_STALE_DOWN),
        Case("llama_gen_tp2_bf16_clean", dtype=_BF16, rollout_opts=_FUSED, new_tokens=4, rollout_tp=2),
        Case("llama_tp1_fp32_norm_eps", fault=fault(
            "rollout", "norm_eps", "model.layers.0.input_layernorm",
            "rollout built every RMSNorm with eps 1e-2 instead of the config's 1e-6", value=1e-2)),
        Case("llama_tp1_fp32_act_swap", fault=fault(
            "rollout", "act_swap", "model.layers.0.mlp.act_fn",
            "rollout act_fn computes gelu(tanh) instead of silu", value="gelu")),
        Case("llama_tp1_fp32_extra_op", fault=fault(
            "rollout", "extra_op", "model.layers.1.mlp.activation",
            "rollout applies one more SiLU module between act_fn and down_proj in layer 1", layer=1,
            measure_at="model.layers.1.mlp.down_proj")),
        Case("llama_tp1_fp32_lm_head_bf16", fault=fault(
            "rollout", "dtype", "logits_processor",
            "rollout keeps lm_head in bf16 (logits computed in bf16) while the rest is fp32", value="bf16")),
        Case("llama_tp1_tensor_clean", task="tensor"),
        Case("llama_tp1_tensor_stale_rollout", task="tensor", fault=_STALE_DOWN),
        Case("llama_tp2_tensor_clean", task="tensor", rollout_tp=2),
        Case("llama_tp2_tensor_wrong_shard", task="tensor", rollout_tp=2, fault=_WRONG_SHARD),
        Case("llama_gen_tensor_clean", task="tensor", new_tokens=2),
        Case("llama_tp1_md5_clean", summary_mode="md5"),
        Case("llama_tp1_md5_stale_rollout", summary_mode="md5", fault=_STALE_DOWN),
    ]
    c += _other_families()
    return {x.name: x for x in c}


def _stale(side, target, param, detail, **kw):
    return fault(side, "stale_weight", target, detail, param=param, **kw)


def _other_families():
    return [
        Case("qwen2_tp1_fp32_clean", family="qwen2"),
        Case("qwen2_tp2_fp32_stale_qkv_bias", family="qwen2", rollout_tp=2, fault=_stale(
            "rollout", "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.k_proj.bias",
            "rollout kept layer 0 k_proj.bias (in qkv_proj) of the previous step")),
        Case("qwen3_tp1_bf16_clean", family="qwen3", dtype=_BF16, rollout_opts=_FUSED),
        Case("qwen3_tp1_fp32_stale_k_norm", family="qwen3", fault=_stale(
            "rollout", "model.layers.1.self_attn.k_norm", "model.layers.1.self_attn.k_norm.weight",
            "rollout kept layer 1 k_norm.weight of the previous step")),
        Case("mistral_gen_fp32_clean", family="mistral", new_tokens=5),
        Case("mistral_gen_fp32_stale_rollout", family="mistral", new_tokens=5, fault=_STALE_DOWN),
        Case("gemma2_tp1_fp32_clean", family="gemma2"),
        Case("gemma2_gen_bf16_clean", family="gemma2", new_tokens=4, dtype=_BF16),
        Case("gemma2_tp1_fp32_stale_pre_ff_norm", family="gemma2", fault=_stale(
            "rollout", "model.layers.0.pre_feedforward_layernorm",
            "model.layers.0.pre_feedforward_layernorm.weight",
            "rollout kept layer 0 pre_feedforward_layernorm.weight of the previous step")),
        Case("phi3_tp1_fp32_clean", family="phi3"),
        Case("phi3_tp2_fp32_stale_qkv", family="phi3", rollout_tp=2, fault=_stale(
            "rollout", "model.layers.1.self_attn.qkv_proj", "model.layers.1.self_attn.qkv_proj.weight",
            "rollout kept layer 1 qkv_proj.weight (fused in the checkpoint) of the previous step")),
        Case("qwen3_moe_tp1_fp32_clean", family="qwen3_moe"),
        Case("qwen3_moe_tp2_bf16_clean", family="qwen3_moe", rollout_tp=2, dtype=_BF16, rollout_opts=_FUSED),
        Case("qwen3_moe_tp2_fp32_stale_experts", family="qwen3_moe", rollout_tp=2, fault=_stale(
            "rollout", "model.layers.1.mlp.experts", "model.layers.1.mlp.experts.down_proj",
            "rollout kept layer 1 experts' down weights (FusedMoE w2_weight) of the previous step")),
        Case("sglang_llama_tp1_fp32_clean", rollout_engine="sglang"),
        Case("sglang_llama_tp2_fp32_clean", rollout_engine="sglang", rollout_tp=2),
        Case("sglang_llama_gen_fp32_stale_rollout", rollout_engine="sglang", new_tokens=4, fault=_STALE_DOWN),
        Case("sglang_qwen3_tp1_bf16_clean", family="qwen3", rollout_engine="sglang", dtype=_BF16,
             rollout_opts=_FUSED),
        Case("llama_fsdp1_fp32_clean", train_layout="fsdp1"),
        Case("llama_fsdp1_fp32_stale_rollout", train_layout="fsdp1", fault=_STALE_DOWN),
        Case("llama_fsdp2_bf16_clean", train_layout="fsdp2", dtype=_BF16, rollout_opts=_FUSED),
        Case("llama_fsdp2_fp32_stale_train", train_layout="fsdp2", fault=_stale(
            "train", "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.o_proj.weight",
            "train side restored layer 0 o_proj.weight from an older checkpoint")),
    ]


CASES = _cases()
