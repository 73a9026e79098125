"""Naming profiles for Mixtral and DeepSeek-style MoE: the module names of transformers 5.x
(MixtralForCausalLM, DeepseekV3ForCausalLM, read from the installed library) and of vLLM
(mixtral.py, deepseek_v2.py) pair by name, with no module left unexplained.

Mixtral is also covered by a real pair (tests/data/real/mixtral_tp1_*, tests/real); DeepSeek's MLA
has no re-creation here, so its layer is built from entries carrying the real names.
"""
from __future__ import annotations

import json

from dumpcompare.mapping import build_plan
from dumpcompare.naming import Namer, load_profiles, name_side
from dumpcompare.records import FORWARD, Dump, Entry, Leaf
from real.corpus_check import CORPUS, run_pair

H, QL, KVL, ROPE, HEADS, QK, V, E, MOE_I = 64, 32, 16, 8, 4, 16, 16, 4, 32

# (path, class, output features, parameter shapes) of one MoE layer, in execution order.
_HF_DEEPSEEK = [
    ("model.layers.1.input_layernorm", "DeepseekV3RMSNorm", H, {"weight": (H,)}),
    ("model.layers.1.self_attn.q_a_proj", "Linear", QL, {"weight": (QL, H)}),
    ("model.layers.1.self_attn.q_a_layernorm", "DeepseekV3RMSNorm", QL, {"weight": (QL,)}),
    ("model.layers.1.self_attn.q_b_proj", "Linear", HEADS * QK, {"weight": (HEADS * QK, QL)}),
    ("model.layers.1.self_attn.kv_a_proj_with_mqa", "Linear", KVL + ROPE, {"weight": (KVL + ROPE, H)}),
    ("model.layers.1.self_attn.kv_a_layernorm", "DeepseekV3RMSNorm", KVL, {"weight": (KVL,)}),
    ("model.layers.1.self_attn.kv_b_proj", "Linear", HEADS * (QK - ROPE + V), {"weight": (HEADS * (QK - ROPE + V), KVL)}),
    ("model.layers.1.self_attn.o_proj", "Linear", H, {"weight": (H, HEADS * V)}),
    ("model.layers.1.self_attn", "DeepseekV3Attention", H, {}),
    ("model.layers.1.post_attention_layernorm", "DeepseekV3RMSNorm", H, {"weight": (H,)}),
    ("model.layers.1.mlp.gate", "DeepseekV3TopkRouter", E, {"weight": (E, H)}),
    ("model.layers.1.mlp.experts.act_fn", "SiLUActivation", MOE_I, {}),
    ("model.layers.1.mlp.experts", "DeepseekV3Experts", H, {"gate_up_proj": (E, 2 * MOE_I, H), "down_proj": (E, H, MOE_I)}),
    ("model.layers.1.mlp.shared_experts.gate_proj", "Linear", MOE_I, {"weight": (MOE_I, H)}),
    ("model.layers.1.mlp.shared_experts.act_fn", "SiLUActivation", MOE_I, {}),
    ("model.layers.1.mlp.shared_experts.up_proj", "Linear", MOE_I, {"weight": (MOE_I, H)}),
    ("model.layers.1.mlp.shared_experts.down_proj", "Linear", H, {"weight": (H, MOE_I)}),
    ("model.layers.1.mlp.shared_experts", "DeepseekV3MLP", H, {}),
    ("model.layers.1.mlp", "DeepseekV3MoE", H, {}),
    ("model.layers.1", "DeepseekV3DecoderLayer", H, {}),
]
_VLLM_DEEPSEEK = [
    ("model.layers.1.input_layernorm", "RMSNorm", H, {"weight": (H,)}),
    ("model.layers.1.self_attn.fused_qkv_a_proj", "MergedColumnParallelLinear", QL + KVL + ROPE,
     {"weight": (QL + KVL + ROPE, H)}),
    ("model.layers.1.self_attn.q_a_layernorm", "RMSNorm", QL, {"weight": (QL,)}),
    ("model.layers.1.self_attn.q_b_proj", "ColumnParallelLinear", HEADS * QK, {"weight": (HEADS * QK, QL)}),
    ("model.layers.1.self_attn.kv_a_layernorm", "RMSNorm", KVL, {"weight": (KVL,)}),
    ("model.layers.1.self_attn.rotary_emb", "DeepseekScalingRotaryEmbedding", ROPE, {}),
    ("model.layers.1.self_attn.kv_b_proj", "ColumnParallelLinear", HEADS * (QK - ROPE + V),
     {"weight": (HEADS * (QK - ROPE + V), KVL)}),
    ("model.layers.1.self_attn.mla_attn", "MultiHeadLatentAttentionWrapper", HEADS * V, {}),
    ("model.layers.1.self_attn.o_proj", "RowParallelLinear", H, {"weight": (H, HEADS * V)}),
    ("model.layers.1.self_attn", "DeepseekV2MLAAttention", H, {}),
    ("model.layers.1.post_attention_layernorm", "RMSNorm", H, {"weight": (H,)}),
    ("model.layers.1.mlp.gate", "ReplicatedLinear", E, {"weight": (E, H), "e_score_correction_bias": (E,)}),
    ("model.layers.1.mlp.shared_experts.gate_up_proj", "MergedColumnParallelLinear", 2 * MOE_I,
     {"weight": (2 * MOE_I, H)}),
    ("model.layers.1.mlp.shared_experts.act_fn", "SiluAndMul", MOE_I, {}),
    ("model.layers.1.mlp.shared_experts.down_proj", "RowParallelLinear", H, {"weight": (H, MOE_I)}),
    ("model.layers.1.mlp.shared_experts", "DeepseekV2MLP", H, {}),
    ("model.layers.1.mlp.experts", "SharedFusedMoE", H, {"w13_weight": (E, 2 * MOE_I, H), "w2_weight": (E, H, MOE_I)}),
    ("model.layers.1.mlp", "DeepseekV2MoE", H, {}),
    ("model.layers.1", "DeepseekV2DecoderLayer", H, {}),
]


def _leaf(name, shape):
    return Leaf(name, "torch.float32", shape, 1.0, -1.0, 0.0, 1.0)


def _dump(modules):
    entries = []
    for i, (path, cls, out, params) in enumerate(modules):
        # the MLA kernel takes (q, latent, rotary key part); every other module one input
        n_in = 3 if path.endswith("mla_attn") else 1
        leaves = [_leaf(f"input_args.{k}", (8, H)) for k in range(n_in)] + [_leaf("output.0", (8, out))]
        leaves += [_leaf(f"parameters.{p}", shape) for p, shape in params.items()]
        entries.append(Entry(f"Module.{path}.{cls}.forward.0", i, "module", path, cls, FORWARD, 0, leaves, n_in))
    return Dump(None, None, "msprobe", "statistics", "L0", "pytorch", None, entries)


def _plan():
    namer = Namer(load_profiles())
    (ft, train), (fr, rollout) = (name_side(_dump(_HF_DEEPSEEK), "train", namer),
                                  name_side(_dump(_VLLM_DEEPSEEK), "rollout", namer))
    return build_plan(train, rollout, namer), train, rollout, (ft, fr)


def test_deepseek_layer_pairs_by_name_with_nothing_unexplained():
    plan, train, rollout, families = _plan()
    assert families == ("hf", "vllm")
    pairs = {(tuple(train[i].path.rsplit("layers.1.", 1)[-1] for i in p.train),
              tuple(rollout[i].path.rsplit("layers.1.", 1)[-1] for i in p.rollout)): (p.kind, p.role) for p in plan.pairs}
    assert pairs[(("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"), ("self_attn.fused_qkv_a_proj",))] == (
        "composite", "qkv_a")
    assert pairs[(("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"),
                  ("mlp.shared_experts.gate_up_proj",))] == ("composite", "shared_gate_up")
    for name, role in (("self_attn.q_a_layernorm", "q_a_norm"), ("self_attn.q_b_proj", "q_b"),
                       ("self_attn.kv_a_layernorm", "kv_a_norm"), ("self_attn.kv_b_proj", "kv_b"),
                       ("self_attn.o_proj", "o"), ("mlp.gate", "router"), ("mlp.experts", "experts"),
                       ("mlp.shared_experts.down_proj", "shared_down"), ("mlp.shared_experts", "shared_mlp"),
                       ("mlp", "mlp")):
        assert pairs[((name,), (name,))][1] == role, name
    assert pairs[(("mlp.shared_experts.act_fn",), ("mlp.shared_experts.act_fn",))][0] == "by_design_difference"
    unexplained = [(o.side, (train if o.side == "train" else rollout)[o.rec].path) for o in plan.one_sided
                   if not o.expected]
    assert unexplained == []
    # the MLA kernel's inputs are the latent points, not a standard attention's k and v
    mla = next(r for r in rollout if r.path.endswith("mla_attn"))
    assert {p.point for p in mla.ports if p.io == "in"} == {"L1.q_rot", "L1.kv_latent_normed", "L1.k_pe_rot"}


def test_deepseek_points_meet_where_both_engines_compute_them():
    plan, _, _, _ = _plan()
    compared = {c.point for c in plan.comparisons if c.pair is None}
    assert {"L1.q_a+L1.kv_a", "L1.q_a_normed", "L1.q", "L1.kv_latent_normed", "L1.kv",
            "L1.shared_gate+L1.shared_up", "L1.shared_out", "L1.experts_out", "L1.router_logits",
            "L1.experts.gate_up.weight", "L1.experts.down.weight"} <= compared


def test_mixtral_moe_block_pairs_by_name(tmp_path):
    """vLLM's block_sparse_moe is the mlp role: without the rule it would pair only by values."""
    name = "mixtral_tp1_fp32_clean"
    code, _, report = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0 and report["verdict"] == "no_credible_divergence"
    doc = json.loads((tmp_path / "output_2_mapping.json").read_text(encoding="utf-8"))
    # 21: vLLM's MixtralModel is never dumped (@support_torch_compile), so transformers' model is one-sided
    assert doc["summary"]["pairs_by_alignment"] == {"names": 21}
    blocks = {(p["train_modules"][0], p["rollout_modules"][0]): (p["role"], p["aligned_by"])
              for p in doc["pairs"] if p["role"] in ("mlp", "router", "experts")}
    for layer in (0, 1):
        base = f"model.layers.{layer}"
        assert blocks[(f"{base}.mlp", f"{base}.block_sparse_moe")] == ("mlp", "names")
        assert blocks[(f"{base}.mlp.gate", f"{base}.block_sparse_moe.gate")] == ("router", "names")
        assert blocks[(f"{base}.mlp.experts", f"{base}.block_sparse_moe.experts")] == ("experts", "names")
    assert all(o["expected"] for o in doc["one_sided"])
