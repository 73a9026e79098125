"""Injected faults (statistics mode): the first divergence and the rank-1/2 modules each must give."""
import json
from types import SimpleNamespace

import pytest

from dumpcompare.analysis import ModuleVerdict, PointVerdict, _first_divergence
from dumpcompare.compare import Result

from compare.test_compare_support import run_cli, synth_dirs, synth_run  # noqa: F401
from synth import faults as F

L1 = "model.layers.1."
QKV1 = [L1 + "self_attn.q_proj", L1 + "self_attn.k_proj", L1 + "self_attn.v_proj"]
GATE_UP1 = [L1 + "mlp.gate_proj", L1 + "mlp.up_proj"]
NOISE = (F.KernelNoise("train"), F.KernelNoise("rollout", seed=1))

# (id, scenario, train modules of the first divergence, its status, its rank)
CASES = [
    ("corrupt_rollout_gate", dict(faults=(F.CorruptWeight("rollout", "gate", 1),)),
     GATE_UP1, "parameter_mismatch", 1),
    ("corrupt_train_gate", dict(faults=(F.CorruptWeight("train", "gate", 1),)),
     GATE_UP1, "parameter_mismatch", 1),
    ("corrupt_train_down", dict(faults=(F.CorruptWeight("train", "down", 1),)),
     [L1 + "mlp.down_proj"], "parameter_mismatch", 1),
    ("corrupt_train_q", dict(faults=(F.CorruptWeight("train", "q", 1),)),
     QKV1, "parameter_mismatch", 1),
    ("corrupt_rollout_v", dict(faults=(F.CorruptWeight("rollout", "v", 1),)),
     QKV1, "parameter_mismatch", 1),
    ("corrupt_rollout_o", dict(faults=(F.CorruptWeight("rollout", "o", 1),)),
     [L1 + "self_attn.o_proj"], "parameter_mismatch", 1),
    ("corrupt_rollout_post_norm", dict(faults=(F.CorruptWeight("rollout", "post_norm", 1),)),
     [L1 + "post_attention_layernorm"], "parameter_mismatch", 1),
    ("corrupt_rollout_gate_with_noise", dict(faults=(F.CorruptWeight("rollout", "gate", 1),) + NOISE),
     GATE_UP1, "parameter_mismatch", 1),
    ("norm_eps_rollout_layer1", dict(faults=(F.NormEps("rollout", 1e-2, layer=1),)),
     [L1 + "input_layernorm"], "origin", 1),
    ("activation_rollout_gelu", dict(faults=(F.Activation("rollout", "gelu_tanh"),)),
     ["model.layers.0.mlp.act_fn"], "origin", 1),
    ("activation_train_relu", dict(faults=(F.Activation("train", "relu"),)),
     ["model.layers.0.mlp.act_fn"], "origin", 1),
    ("permute_qkv_rollout", dict(faults=(F.PermuteQKV("rollout", 1),)), QKV1, "origin", 1),
    ("missing_act_rollout", dict(faults=(F.MissingActivation("rollout", 1),)),
     [L1 + "mlp.down_proj"], "propagated", 2),
    ("missing_act_train", dict(faults=(F.MissingActivation("train", 1),)),
     [L1 + "mlp.down_proj"], "propagated", 2),
    ("extra_op_rollout", dict(faults=(F.ExtraOp("rollout", 1),)),
     [L1 + "mlp.down_proj"], "propagated", 2),
    ("rope_theta_rollout", dict(faults=(F.RopeTheta("rollout", 500000.0),)),
     ["model.layers.0.self_attn.o_proj"], "propagated", 2),
    ("megatron_corrupt_rollout_down", dict(train="megatron", faults=(F.CorruptWeight("rollout", "down", 1),)),
     ["decoder.layers.1.mlp.linear_fc2"], "parameter_mismatch", 1),
    ("megatron_corrupt_train_down", dict(train="megatron", faults=(F.CorruptWeight("train", "down", 1),)),
     ["decoder.layers.1.mlp.linear_fc2"], "parameter_mismatch", 1),
    ("megatron_local_corrupt_rollout_down",
     dict(train="megatron_local", faults=(F.CorruptWeight("rollout", "down", 1),)),
     ["decoder.layers.1.mlp.linear_fc2"], "parameter_mismatch", 1),
    ("megatron_norm_eps_rollout", dict(train="megatron", faults=(F.NormEps("rollout", 1e-2, layer=1),)),
     ["decoder.layers.1.self_attention.linear_qkv"], "origin", 1),
    ("megatron_permute_qkv_rollout", dict(train="megatron", faults=(F.PermuteQKV("rollout", 1),)),
     ["decoder.layers.1.self_attention.core_attention"], "propagated", 2),
    ("fsdp_sglang_corrupt_rollout_gate",
     dict(train="hf_fsdp", rollout="sglang", faults=(F.CorruptWeight("rollout", "gate", 1),)),
     GATE_UP1, "parameter_mismatch", 1),
]


@pytest.mark.parametrize("scenario, modules, status, rank", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fault_gives_expected_first_divergence_and_single_top_candidate(synth_run, scenario, modules,
                                                                       status, rank):
    out = synth_run(**scenario)
    fd = out.first
    assert (fd["train_modules"], fd["status"]) == (modules, status)
    v = out.verdict(modules)
    assert v["module_priority_rank"] == rank
    top = out.ranked(best=2)
    assert [m["pid"] for m in top] == [v["pid"]], [(m["train_modules"], m["status"]) for m in top]
    before = [m for m in out.d4["modules"] if m["train_order"] < v["train_order"] and not m["is_container"]]
    assert all(m["status"] in ("clean", "structural") for m in before)


def test_permuted_qkv_rows_show_in_parts_not_in_fused_statistics(synth_run):
    out = synth_run(faults=(F.PermuteQKV("rollout", 1),))
    assert out.result("L1.q+L1.k+L1.v")["status"] == "match"
    assert out.result("L1.q.weight+L1.k.weight+L1.v.weight")["status"] == "match"
    assert out.first["point"] in ("L1.q", "L1.k")
    assert "mismatch" in (out.result("L1.q")["status"], out.result("L1.k")["status"])
    v = out.verdict(QKV1)
    assert (v["input_status"], v["parameter_status"], v["output_status"]) == ("match", "match", "mismatch")


def test_missing_activation_lists_the_lone_act_fn_as_unexpected_activation(synth_run):
    out = synth_run(faults=(F.MissingActivation("rollout", 1),))
    act = out.one_sided("train", L1 + "mlp.act_fn")
    assert act["expected"] is False and act["activation_like"] is True
    down = out.verdict([L1 + "mlp.down_proj"])
    assert down["input_status"] == "mismatch" and "between the two aligned modules" in down["rank_reason"]
    out = synth_run(faults=(F.MissingActivation("train", 1),))
    act = out.one_sided("rollout", L1 + "mlp.act_fn")
    assert act["expected"] is False and act["activation_like"] is True


def test_extra_op_is_an_unexpected_one_sided_module_between_the_aligned_neighbours(synth_run):
    out = synth_run(faults=(F.ExtraOp("rollout", 1),))
    extra = out.one_sided("rollout", L1 + "mlp.extra_op")
    assert extra["expected"] is False and extra["activation_like"] is False
    assert extra["before_pair"] == out.verdict([L1 + "mlp.act_fn"])["pid"]
    assert extra["after_pair"] == out.verdict([L1 + "mlp.down_proj"])["pid"]
    # Only the pair-own comparison of down_proj's input shows the inserted op.
    assert out.result("L1.act_out")["status"] == "match"
    own = out.result("L1.act_out", pair=extra["after_pair"])
    assert own["status"] == "mismatch"


def test_train_side_extra_op_is_not_blamed_on_act_fn(synth_run):
    out = synth_run(faults=(F.ExtraOp("train", 1),))
    extra = out.one_sided("train", L1 + "mlp.extra_op")
    assert extra["expected"] is False
    assert out.verdict([L1 + "mlp.act_fn"])["module_priority_rank"] >= 2


def test_half_precision_lm_head_is_a_rank2_precision_boundary(synth_run):
    out = synth_run(faults=(F.HalfPrecision("rollout", "lm_head"),))
    assert out.first["pair"] is None
    v = out.verdict(["lm_head"], ["logits_processor"])
    assert (v["kind"], v["status"], v["module_priority_rank"]) == ("cross_role", "origin", 2)
    assert v["dtype_boundary"] is True and v["output_status"] == "drift"
    assert [m["pid"] for m in out.ranked(best=2)] == [v["pid"]]
    r = out.result("M.logits")
    assert r["dtype_differs"] and r["status"] == "drift" and r["tolerance"] > r["strict_tolerance"]


def test_half_precision_everywhere_stays_within_bf16_tolerance(synth_run):
    out = synth_run(faults=(F.HalfPrecision("rollout", "all"),))
    assert out.first["pair"] is None
    assert {r["status"] for r in out.d3["results"]} <= {"match", "drift"}
    assert not [m for m in out.d4["modules"] if m["module_priority_rank"] == 1]
    embed = out.verdict(["model.embed_tokens"])
    assert (embed["status"], embed["module_priority_rank"], embed["dtype_boundary"]) == ("origin", 2, True)


def test_rope_theta_points_between_qkv_and_o_proj_where_rotary_emb_sits(synth_run):
    out = synth_run(faults=(F.RopeTheta("rollout", 500000.0),))
    o = out.verdict(["model.layers.0.self_attn.o_proj"])
    rot = out.one_sided("rollout", "model.layers.0.self_attn.rotary_emb")
    assert rot["expected"] and rot["after_pair"] == o["pid"]
    # The first divergent pair is o_proj; its input (the attention output) already differs.
    assert out.first["train_modules"] == ["model.layers.0.self_attn.o_proj"]
    assert out.first["point"] == "L0.attn_out" and out.first["diverged_inputs"] == ["L0.attn_core_out"]


def test_megatron_permuted_qkv_shows_at_core_attention_inputs(synth_run):
    out = synth_run(train="megatron", faults=(F.PermuteQKV("rollout", 1),))
    assert out.result("L1.q+L1.k+L1.v")["status"] == "match"
    core = out.verdict(["decoder.layers.1.self_attention.core_attention"])
    bad = {p["point"] for p in core["points"]["in"] if p["status"] == "mismatch"}
    assert {"L1.q_rot", "L1.k_rot"} <= bad


def test_embedding_scale_hidden_by_the_norm_has_a_single_candidate(synth_run):
    # With seed 0 the synthetic corruption of the embedding is an exact x1.5 scaling, which
    # RMSNorm removes: the divergence reappears only at the first residual add.
    out = synth_run(faults=(F.CorruptWeight("rollout", "embed"),))
    assert out.first["train_modules"] == ["model.embed_tokens"]
    assert [m["train_modules"] for m in out.ranked(best=2)] == [["model.embed_tokens"]]


def test_nan_on_one_side_is_nonfinite_origin(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(layers=2)
    bad = tmp_path / "rollout"
    bad.mkdir()
    doc = json.loads((rollout / "dump.json").read_text(encoding="utf-8"))
    key = next(k for k in doc["data"] if k.startswith("Module.model.layers.1.mlp.down_proj."))
    doc["data"][key]["output"][0]["Max"] = float("nan")
    (bad / "dump.json").write_text(json.dumps(doc), encoding="utf-8")   # bare NaN, as msprobe writes
    out = run_cli(train, bad, tmp_path / "out")
    r = out.result("L1.mlp_out")
    assert (r["status"], r["error"], r["reason"]) == ("nonfinite", "Infinity", "NaN/Inf on one side only")
    assert r["rollout"]["stats"]["max"] == "NaN"
    v = out.verdict([L1 + "mlp.down_proj"])
    assert (v["output_status"], v["status"], v["module_priority_rank"]) == ("nonfinite", "origin", 1)
    assert out.first["train_modules"] == [L1 + "mlp.down_proj"]



def _result(cid, point, status, train_key, error):
    side = {"modules": [], "keys": [train_key], "leaves": [], "dtypes": [], "shapes": [], "merges": []}
    return Result(cid, point, "direct", "features", "statistics", status, error, 0.01, 0.01, side, dict(side))


def _verdict(pid, order, ins, outs, out_status):
    pts = {"in": [PointVerdict(p, c, st, e) for p, c, st, e in ins], "param": [],
           "out": [PointVerdict(p, c, st, e) for p, c, st, e in outs]}
    return ModuleVerdict(pid, "one_to_one", [f"m{pid}"], [f"m{pid}"], None, "embedding", "embed", order,
                         "mismatch", "compared", "none", out_status, None, None, None, None, False,
                         "propagated", 3, "", points=pts)


@pytest.mark.parametrize("order", ["input_first", "output_first"])
def test_first_divergence_point_is_an_output_of_the_first_divergent_pair(order):
    # Issue 14: the token ids (the embedding's input) and the embeddings (its output) diverge and
    # sit in the same train entry. The first divergence is the embedding pair; its point must be
    # the output that makes it a divergence, whatever order the results come in.
    tokens = _result("C1", "M.tokens", "mismatch", "embed.forward.0", 1.0)
    hidden = _result("C2", "L0.resid_in", "mismatch", "embed.forward.0", 0.5)
    later = _result("C3", "L0.attn_norm_out", "mismatch", "norm.forward.0", 0.5)
    results = [tokens, hidden, later] if order == "input_first" else [hidden, tokens, later]
    train = [SimpleNamespace(key="embed.forward.0"), SimpleNamespace(key="norm.forward.0")]
    embed = _verdict("P0", 0, [("M.tokens", "C1", "mismatch", 1.0)], [("L0.resid_in", "C2", "mismatch", 0.5)],
                     "mismatch")
    norm = _verdict("P1", 1, [("L0.resid_in", "C2", "mismatch", 0.5)],
                    [("L0.attn_norm_out", "C3", "mismatch", 0.5)], "mismatch")
    first = _first_divergence([norm, embed], results, train)
    assert (first["pair"], first["point"], first["cid"]) == ("P0", "L0.resid_in", "C2")
    assert first["diverged_inputs"] == ["M.tokens"]
