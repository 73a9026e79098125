"""Mapping across engines (output_2) and the shape of every output, on synthetic dumps."""
import csv
import json
import re

import pytest
import yaml

from compare.test_compare_support import (OUTPUT_FILES, OUTPUT_JSON, ROOT, run_cli,  # noqa: F401
                                          synth_dirs, synth_run)
from synth import faults as F

LAYERS = (0, 1)
NOISE = (F.KernelNoise("train"), F.KernelNoise("rollout", seed=1))


def leaves(out, point, side, pair=None):
    """(module path, leaf) holding ``point`` on ``side`` in the comparison plan."""
    comp = next(c for c in out.d2["comparisons"] if c["point"] == point and c["pair"] == pair)
    return [(x["module"], x["leaf"]) for x in comp[side]]


# -- HF train vs vLLM rollout ------------------------------------------------------------------

def test_hf_vs_vllm_every_train_module_is_mapped_or_one_sided_with_reason(synth_run):
    out = synth_run()
    s = out.summary
    assert s["train_modules"] == s["mapped_train_modules"] + s["train_only"]
    assert s["rollout_modules"] == s["mapped_rollout_modules"] + s["rollout_only"]
    assert s["train_only_unexpected"] == s["rollout_only_unexpected"] == 0
    assert all(o["reason"] for o in out.d2["one_sided"])
    mapped = {m for p in out.d2["pairs"] for m in p["train_modules"]}
    one_sided = {o["module"] for o in out.d2["one_sided"] if o["side"] == "train"}
    forward = {r["path"] for r in out.d1["train"] if r["direction"] == "forward"}
    assert forward == mapped | one_sided and not mapped & one_sided
    assert one_sided == {"model.rotary_emb"}
    assert out.d1["train_unexplained"] == [] and out.d1["rollout_unexplained"] == []


def test_hf_vs_vllm_fused_modules_pair_as_composites(synth_run):
    out = synth_run()
    for n in LAYERS:
        p = f"model.layers.{n}."
        qkv = out.verdict([p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"])
        assert (qkv["kind"], qkv["role"], qkv["rollout_modules"]) == \
            ("composite", "qkv", [p + "self_attn.qkv_proj"])
        gu = out.verdict([p + "mlp.gate_proj", p + "mlp.up_proj"])
        assert (gu["kind"], gu["role"], gu["rollout_modules"]) == \
            ("composite", "gate_up", [p + "mlp.gate_up_proj"])
        for point in (f"L{n}.q+L{n}.k+L{n}.v", f"L{n}.gate+L{n}.up",
                      f"L{n}.q.weight+L{n}.k.weight+L{n}.v.weight"):
            assert out.result(point)["kind"] == "composite"
    assert out.summary["pairs_by_kind"]["composite"] == 2 * len(LAYERS)


def test_hf_vs_vllm_parts_are_also_compared_through_consumer_inputs(synth_run):
    out = synth_run()
    assert leaves(out, "L1.q", "train") == [("model.layers.1.self_attn.q_proj", "output.0")]
    assert leaves(out, "L1.q", "rollout") == [("model.layers.1.self_attn.rotary_emb", "input_args.1")]
    assert leaves(out, "L1.k", "rollout") == [("model.layers.1.self_attn.rotary_emb", "input_args.2")]
    assert leaves(out, "L1.v", "rollout") == [("model.layers.1.self_attn.attn", "input_args.2")]


def test_hf_vs_vllm_by_design_pairs_compare_only_equal_quantities(synth_run):
    out = synth_run()
    for n in LAYERS:
        act = out.verdict([f"model.layers.{n}.mlp.act_fn"])
        assert act["kind"] == "by_design_difference" and "silu(gate)*up" in act["note"]
        layer = out.verdict([f"model.layers.{n}"])
        assert layer["kind"] == "by_design_difference" and "(mlp delta, residual)" in layer["note"]
        # silu(gate)*up is HF down_proj's input; HF act_fn's silu(gate) is compared with nothing.
        assert leaves(out, f"L{n}.act_out", "train") == [(f"model.layers.{n}.mlp.down_proj", "input_args.0")]
        assert leaves(out, f"L{n}.act_out", "rollout") == [(f"model.layers.{n}.mlp.act_fn", "output.0")]
        assert f"L{n}.act_gate" in out.d2["unmatched_points"]["train"]
    # The full stream after a layer is the HF layer output and the next fused add+norm's residual.
    assert leaves(out, "L0.resid_out", "train") == [("model.layers.0", "output.0")]
    assert leaves(out, "L0.resid_out", "rollout") == [("model.layers.1.input_layernorm", "output.1")]
    assert leaves(out, "L1.resid_out", "rollout") == [("model.norm", "output.1")]
    assert not any(re.fullmatch(r"L[1-9]\d*\.resid_in", c["point"]) for c in out.d2["comparisons"])
    lm = out.verdict(["lm_head"], ["logits_processor"])
    assert lm["kind"] == "cross_role" and out.result("M.logits")["status"] == "match"


@pytest.mark.parametrize("faults", [(), NOISE], ids=["clean", "kernel_noise"])
def test_hf_vs_vllm_by_design_pairs_never_mismatch_on_a_clean_pair(synth_run, faults):
    out = synth_run(faults=faults)
    special = [m for m in out.d4["modules"] if m["kind"] in ("by_design_difference", "cross_role")]
    assert len(special) >= 2 * len(LAYERS) + 1
    assert all(m["output_status"] not in ("mismatch", "nonfinite") for m in special)
    assert all(m["status"] == "clean" for m in out.d4["modules"])
    assert out.first["pair"] is None


def test_hf_vs_vllm_rollout_one_sided_modules_are_expected_with_neighbours(synth_run):
    out = synth_run()
    qkv_pid = out.verdict(["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                           "model.layers.1.self_attn.v_proj"])["pid"]
    o_pid = out.verdict(["model.layers.1.self_attn.o_proj"])["pid"]
    for module in ("model.layers.1.self_attn.rotary_emb", "model.layers.1.self_attn.attn"):
        o = out.one_sided("rollout", module)
        assert o["expected"] and not o["activation_like"]
        assert (o["before_pair"], o["after_pair"]) == (qkv_pid, o_pid)


# -- other layouts -------------------------------------------------------------------------------

def test_megatron_te_vs_vllm_mapping(synth_run):
    out = synth_run(train="megatron")
    assert out.d1["sources"]["train"]["family"] == "megatron"
    qkv = out.verdict(["decoder.layers.1.self_attention.linear_qkv"])
    assert qkv["rollout_modules"] == ["model.layers.1.self_attn.qkv_proj"]
    assert qkv["kind"] == "by_design_difference" and "includes the preceding norm" in qkv["note"]
    fc1 = out.verdict(["decoder.layers.1.mlp.linear_fc1"])
    assert fc1["rollout_modules"] == ["model.layers.1.mlp.gate_up_proj"]
    assert fc1["kind"] == "by_design_difference"
    fc2 = out.verdict(["decoder.layers.1.mlp.linear_fc2"])
    assert fc2["rollout_modules"] == ["model.layers.1.mlp.down_proj"] and fc2["kind"] == "one_to_one"
    assert out.verdict(["decoder.layers.1.self_attention.core_attention"])["rollout_modules"] == \
        ["model.layers.1.self_attn.attn"]
    # Fused outputs in different layouts: compared directly, order-free in statistics mode.
    r = out.result("L1.q+L1.k+L1.v")
    assert r["kind"] == "direct" and r["status"] == "match"
    comp = next(c for c in out.d2["comparisons"] if c["point"] == "L1.q+L1.k+L1.v" and c["pair"] is None)
    assert comp["train_layout"] == "megatron_grouped_qkv" and comp["rollout_layout"] is None
    # TE's layer_norm_weight inside linear_qkv is compared with vLLM's input_layernorm weight.
    assert leaves(out, "L1.input_norm.weight", "train") == \
        [("decoder.layers.1.self_attention.linear_qkv", "parameters.layer_norm_weight")]
    assert out.result("L1.input_norm.weight")["status"] == "match"
    norm = out.verdict(["decoder.layers.1.input_layernorm"])
    assert (norm["status"], norm["module_priority_rank"]) == ("structural", 4)
    act = out.one_sided("rollout", "model.layers.1.mlp.act_fn")
    assert act["expected"] and "Megatron computes the activation" in act["reason"]
    assert out.summary["train_only_unexpected"] == out.summary["rollout_only_unexpected"] == 0
    assert out.first["pair"] is None


def test_megatron_local_spec_pairs_linear_qkv_one_to_one(synth_run):
    out = synth_run(train="megatron_local")
    qkv = out.verdict(["decoder.layers.1.self_attention.linear_qkv"])
    assert qkv["kind"] == "one_to_one" and qkv["status"] == "clean"
    assert out.verdict(["decoder.layers.1.input_layernorm"])["status"] == "clean"


def test_megatron_ddp_float16module_prefix_is_stripped(synth_run):
    plain = synth_run(train="megatron")
    wrapped = synth_run(train="megatron", train_options={"prefix": "module.module."})
    assert [p["train_modules"] for p in wrapped.d2["pairs"]] == \
        [p["train_modules"] for p in plain.d2["pairs"]]
    extra = {o["class"] for o in wrapped.d2["one_sided"]} - {o["class"] for o in plain.d2["one_sided"]}
    assert extra == {"Float16Module", "GPTModel"}
    assert all(o["expected"] for o in wrapped.d2["one_sided"])


def test_fsdp_train_vs_sglang_rollout(synth_run):
    out = synth_run(train="hf_fsdp", rollout="sglang", train_options={"checkpoint": True})
    assert out.d1["sources"]["rollout"]["family"] == "sglang"
    assert not any("_wrapped_module" in r["path"] for r in out.d1["train"])
    assert out.summary["train_only_unexpected"] == out.summary["rollout_only_unexpected"] == 0
    assert out.one_sided("rollout", "model.layers.1.self_attn.attn")["class"] == "RadixAttention"
    assert out.summary["pairs_by_kind"]["composite"] == 2 * len(LAYERS)
    assert out.first["pair"] is None


def test_same_engine_pairs_everything_one_to_one(synth_run):
    out = synth_run(rollout="hf")
    s = out.summary
    assert s["pairs_by_kind"] == {"one_to_one": s["train_modules"]} and s["rollout_only"] == 0


# -- output files --------------------------------------------------------------------------------

def test_all_outputs_written_with_schema_version_and_partial(synth_run):
    out = synth_run()
    for name in OUTPUT_FILES:
        assert (out.dir / name).is_file(), name
    for name in OUTPUT_JSON:
        doc = json.loads((out.dir / name).read_text(encoding="utf-8"))
        # output_4 2.2 adds its vocabulary, output_3 2.2 its unpaired parameters and 2.3 experts borrowed
        # from the other side's dump; the others are at 2.1.
        version = {"output_3": "2.3", "output_4": "2.2"}.get(name[:8], "2.1")
        assert list(doc)[0] == "schema_version" and doc["schema_version"] == version
        assert doc["partial"] is False
    assert not list(out.dir.glob(".*.tmp"))


def test_output_2_summary_keys(synth_run):
    s = synth_run().summary
    required = {"train_modules", "rollout_modules", "mapped_train_modules", "mapped_rollout_modules",
                "train_only", "rollout_only"}
    assert required <= set(s) and all(isinstance(s[k], int) for k in required)
    assert {"pairs", "pairs_by_kind", "comparisons", "train_coverage", "train_only_unexpected",
            "rollout_only_unexpected", "backward_entries", "parameters_grad_entries", "api_entries"} <= set(s)


def test_documented_keys_are_present(synth_run):
    out = synth_run(faults=(F.CorruptWeight("rollout", "gate", 1),))
    d4 = out.d4
    assert set(d4) >= {"partial", "comparability", "first_divergence", "summary", "modules", "one_sided"}
    assert set(d4["first_divergence"]) == {"pair", "train_modules", "rollout_modules", "status", "layer",
                                           "point", "cid", "diverged_inputs"}
    m = d4["modules"][0]
    assert set(m) >= {"pid", "kind", "train_modules", "rollout_modules", "layer", "block", "role",
                      "train_order", "input_status", "input_status_source", "parameter_status",
                      "output_status", "input_error", "parameter_error", "output_error", "amplification",
                      "dtype_boundary", "status", "module_priority_rank", "rank_reason", "is_container",
                      "explained_by", "unexplained_input_points", "points", "note"}
    for io in ("in", "param", "out"):
        for pv in m["points"][io]:
            assert set(pv) == {"point", "cid", "status", "error", "margin"}
    statuses = {"clean", "origin", "parameter_mismatch", "propagated", "structural", "bounded", "incomparable"}
    assert {v["status"] for v in d4["modules"]} <= statuses
    assert {v["module_priority_rank"] for v in d4["modules"]} <= {1, 2, 3, 4, 5}
    r = out.d3["results"][0]
    assert set(r) == {"cid", "point", "kind", "axis", "mode", "status", "error", "tolerance",
                      "strict_tolerance", "train", "rollout", "stat_errors", "tensor_metrics", "reason",
                      "notes", "dtype_differs", "pair", "calls", "param_equality", "logprob", "reference", "skip",
                      "bounds"}
    assert set(out.d1["train"][0]) == {"index", "key", "kind", "direction", "path", "raw_path", "class",
                                       "call", "calls", "layer", "block", "role", "family", "fused_parts",
                                       "is_wrapper", "explained", "ports"}
    with open(out.dir / "output_2_mapping.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(out.d2["pairs"]) + len(out.d2["one_sided"])
    assert (out.dir / "output_4_module_analysis.md").read_text().startswith("# Module analysis")


# -- naming profiles -----------------------------------------------------------------------------

def _doc_example_yaml() -> str:
    text = (ROOT / "dump-module-mapping-value-compare" / "references" / "naming_profiles.md").read_text()
    section = text.split("## Worked example", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


CHATGLM_NAMES = [
    ("Module.model.layers.", "Module.transformer.encoder.layers."),
    (".self_attn.qkv_proj.", ".self_attention.query_key_value."),
    (".self_attn.o_proj.", ".self_attention.dense."),
    (".self_attn.", ".self_attention."),
    (".mlp.gate_up_proj.", ".mlp.dense_h_to_4h."),
    (".mlp.down_proj.", ".mlp.dense_4h_to_h."),
    ("Module.model.embed_tokens.", "Module.transformer.embedding."),
    ("Module.model.norm.", "Module.transformer.encoder.final_layernorm."),
    ("Module.model.", "Module.transformer."),
]


def _rename_keys(dump_dir, pairs):
    path = dump_dir / "dump.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    renamed = {}
    for key, value in doc["data"].items():
        for old, new in pairs:
            key = key.replace(old, new)
        renamed[key] = value
    doc["data"] = renamed
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")


def test_naming_file_worked_example_maps_a_new_family(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(layers=2, faults=(F.CorruptWeight("rollout", "down", 1),))
    glm = tmp_path / "rollout"
    glm.mkdir()
    (glm / "dump.json").write_bytes((rollout / "dump.json").read_bytes())
    _rename_keys(glm, CHATGLM_NAMES)
    plain = run_cli(train, glm, tmp_path / "plain")
    assert any(".mlp.dense_4h_to_h." in k for k in plain.d1["rollout_unexplained"])
    assert plain.first["train_modules"] != ["model.layers.1.mlp.down_proj"]
    naming = tmp_path / "chatglm.yaml"
    naming.write_text(_doc_example_yaml(), encoding="utf-8")
    out = run_cli(train, glm, tmp_path / "named", "--naming", naming)
    assert out.d1["rollout_unexplained"] == []
    assert out.summary["train_only_unexpected"] == out.summary["rollout_only_unexpected"] == 0
    assert out.first["train_modules"] == ["model.layers.1.mlp.down_proj"]
    assert out.first["rollout_modules"] == ["transformer.encoder.layers.1.mlp.dense_4h_to_h"]
    assert out.first["status"] == "parameter_mismatch"
    gu = out.verdict(["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"])
    assert gu["kind"] == "composite"
    assert gu["rollout_modules"] == ["transformer.encoder.layers.0.mlp.dense_h_to_4h"]


def test_hf_phi3_activation_fn_is_paired_with_vllm_act_fn(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(layers=2)
    phi3 = tmp_path / "train"
    phi3.mkdir()
    (phi3 / "dump.json").write_bytes((train / "dump.json").read_bytes())
    _rename_keys(phi3, [(".mlp.act_fn.", ".mlp.activation_fn.")])
    out = run_cli(phi3, rollout, tmp_path / "out")
    assert out.summary["train_only_unexpected"] == out.summary["rollout_only_unexpected"] == 0
    assert out.verdict(["model.layers.1.mlp.activation_fn"])["kind"] == "by_design_difference"


def test_skill_md_frontmatter_and_references_exist():
    skill = ROOT / "dump-module-mapping-value-compare"
    text = (skill / "SKILL.md").read_text(encoding="utf-8")
    front = yaml.safe_load(text.split("---", 2)[1])
    assert front["name"] == "dump-module-mapping-value-compare"
    assert 0 < len(front["description"]) <= 1024
    for ref in set(re.findall(r"references/[a-z_]+\.md", text)):
        assert (skill / ref).is_file(), ref


def test_dumps_of_different_models_are_flagged_not_comparable(synth_dirs, tmp_path):
    _, train3, _ = synth_dirs(layers=3)
    _, _, rollout2 = synth_dirs(layers=2)
    out = run_cli(train3, rollout2, tmp_path)
    comp = out.d4["comparability"]
    assert comp["comparable"] is False
    assert any("different numbers of layers (train 3, rollout 2)" in r for r in comp["reasons"])
    assert "may not be comparable" in (out.dir / "output_4_module_analysis.md").read_text()
