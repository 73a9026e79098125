"""Tensor mode (.npy and .pt tensor files): same findings as statistics mode, plus tensor metrics."""
import json

import numpy as np
import pytest

from compare.test_compare_support import run_cli, synth_dirs, synth_run  # noqa: F401
from synth import faults as F

GATE_UP1 = ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
FC2 = ["decoder.layers.1.mlp.linear_fc2"]
METRICS = {"cosine", "rel_l2", "max_abs", "max_rel", "frac_within_tol", "first_token_past_tol"}


def assert_same_findings(tensor, stats):
    assert tensor.d3["mode"] == "tensor" and stats.d3["mode"] == "statistics"
    keep = ("pair", "train_modules", "rollout_modules", "status", "layer")
    assert {k: tensor.first[k] for k in keep} == {k: stats.first[k] for k in keep}
    assert [(m["train_modules"], m["status"]) for m in tensor.ranked(best=2)] == \
        [(m["train_modules"], m["status"]) for m in stats.ranked(best=2)]


@pytest.mark.parametrize("fmt", ["npy", "pt"])
def test_hf_vs_vllm_gate_fault_in_tensor_mode(synth_run, fmt):
    fault = (F.CorruptWeight("rollout", "gate", 1),)
    out = synth_run(faults=fault, task="tensor", tensor_format=fmt)
    assert_same_findings(out, synth_run(faults=fault))
    assert out.first["train_modules"] == GATE_UP1 and out.first["status"] == "parameter_mismatch"
    assert all(r["mode"] == "tensor" and set(r["tensor_metrics"]) >= METRICS for r in out.d3["results"])
    bad = out.result("L1.gate+L1.up")
    m = bad["tensor_metrics"]
    assert bad["status"] == "mismatch" and m["rel_l2"] == bad["error"] > bad["tolerance"]
    assert m["cosine"] < 0.99 and m["frac_within_tol"] < 1 and m["first_token_past_tol"] == 0
    assert m["multiset_equal"] is False
    good = out.result("L0.gate+L0.up")
    assert good["status"] == "match" and good["tensor_metrics"]["first_token_past_tol"] is None


@pytest.mark.parametrize("fmt", ["npy", "pt"])
def test_megatron_vs_vllm_down_fault_in_tensor_mode(synth_run, fmt):
    fault = (F.CorruptWeight("rollout", "down", 1),)
    out = synth_run(train="megatron", faults=fault, task="tensor", tensor_format=fmt)
    assert_same_findings(out, synth_run(train="megatron", faults=fault))
    assert (out.first["train_modules"], out.first["status"]) == (FC2, "parameter_mismatch")
    assert out.first["rollout_modules"] == ["model.layers.1.mlp.down_proj"]
    assert out.result("L1.down.weight")["tensor_metrics"]["rel_l2"] > 0.1


def test_clean_pair_with_kernel_noise_matches_everywhere_in_tensor_mode(synth_run):
    out = synth_run(faults=(F.KernelNoise("train"), F.KernelNoise("rollout", seed=1)), task="tensor")
    assert out.first["pair"] is None
    assert {r["status"] for r in out.d3["results"]} == {"match"}
    assert all(r["tensor_metrics"]["cosine"] > 0.9999 for r in out.d3["results"])


def test_layouts_are_aligned_not_reported(synth_run):
    out = synth_run(task="tensor")
    r = out.result("L1.attn_norm_out")
    assert r["train"]["shapes"] == [[1, 8, 64]] and r["rollout"]["shapes"] == [[8, 64]]
    assert r["status"] == "match" and r["reason"] is None
    meg = synth_run(train="megatron", task="tensor")
    r = meg.result("L1.mlp_out")
    assert r["train"]["shapes"] == [[8, 1, 64]] and r["status"] == "match"


def test_permuted_fused_weight_is_a_parameter_mismatch_in_tensor_mode(synth_run):
    out = synth_run(faults=(F.PermuteQKV("rollout", 1),), task="tensor")
    v = out.verdict(["model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj",
                     "model.layers.1.self_attn.v_proj"])
    assert (v["status"], v["module_priority_rank"]) == ("parameter_mismatch", 1)
    w = out.result("L1.q.weight+L1.k.weight+L1.v.weight")
    assert w["status"] == "mismatch" and w["tensor_metrics"]["multiset_equal"] is True


def test_megatron_grouped_qkv_is_regrouped_against_hf_parts(synth_run):
    out = synth_run(train="megatron", rollout="hf", task="tensor")
    for point in ("L1.q+L1.k+L1.v", "L1.q.weight+L1.k.weight+L1.v.weight"):
        r = out.result(point)
        assert r["kind"] == "composite" and r["status"] == "match"
        assert "parts regrouped to the Megatron per-group qkv layout (head_dim=16, 2 query groups)" in r["notes"]
    assert out.first["pair"] is None


def test_megatron_grouped_qkv_with_drift_reports_the_drift_not_the_layout(synth_run):
    # Issue 14: the groups come from the head size, not from a search that the drift defeats.
    noise = 1e-3
    out = synth_run(train="megatron", rollout="hf", task="tensor", faults=(F.KernelNoise("train", noise),))
    r = out.result("L1.q+L1.k+L1.v")
    # Noise of 1e-3 per op, compounded over a few ops: far below the ~1.0 a wrong layout gives.
    assert r["status"] == "mismatch" and 1e-4 < r["error"] < 2e-2
    assert r["tensor_metrics"]["cosine"] > 0.999
    assert "parts regrouped to the Megatron per-group qkv layout (head_dim=16, 2 query groups)" in r["notes"]


def test_qkv_split_follows_the_head_size():
    from dumpcompare.compare.layout import qkv_split, regroup_qkv
    # 8 q heads, 2 k/v heads of 4: the part sizes give the groups, or the q heads per k head do.
    assert qkv_split(48, 32, 8, 4, None) == (32, 8, 2)
    assert qkv_split(48, None, None, 4, 4) == (32, 8, 2)
    assert qkv_split(48, 32, 8, None, 4) is None          # head size unknown: no guess
    assert qkv_split(48, 32, 8, 5, None) is None          # head size that does not divide the rows
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(32, 3)), rng.normal(size=(8, 3)), rng.normal(size=(8, 3))
    grouped = np.concatenate([q[:16], k[:4], v[:4], q[16:], k[4:], v[4:]])
    drifted = grouped * (1 + 1e-3 * rng.normal(size=grouped.shape))
    regrouped = regroup_qkv(np.concatenate([q, k, v]), 0, qkv_split(48, 32, 8, 4, None))
    assert np.array_equal(regrouped, grouped)
    assert np.linalg.norm(regrouped - drifted) / np.linalg.norm(drifted) < 1e-2


def test_padded_vocab_is_structural_in_statistics_and_trimmed_in_tensor_mode(synth_run):
    kw = dict(layers=2, config={"vocab": 100}, rollout_options={"pad_vocab": True})   # 100 -> 128 rows
    stats = synth_run(**kw)
    r = stats.result("M.embed.weight")
    assert r["train"]["shapes"] == [[100, 64]] and r["rollout"]["shapes"] == [[128, 64]]
    assert r["status"] == "structural" and r["reason"].startswith("padded_vocab:")
    assert stats.first["pair"] is None
    tensor = synth_run(task="tensor", **kw)
    r = tensor.result("M.embed.weight")
    assert r["status"] == "match" and "padded vocabulary rows trimmed before comparing" in r["notes"]
    assert tensor.first["pair"] is None


def test_megatron_padded_logits_are_a_padded_vocab_structural(synth_run):
    out = synth_run(train="megatron", layers=2, config={"vocab": 100},
                    train_options={"pad_vocab": True}, rollout_options={"pad_vocab": True})
    r = out.result("M.logits")
    assert r["status"] == "structural" and r["reason"].startswith("padded_vocab:")


def _halve_rollout_down_weight(rollout, dest):
    """Copy a tensor-mode rollout dump, keeping only the first half of layer 1's down_proj rows."""
    doc = json.loads((rollout / "dump.json").read_text(encoding="utf-8"))
    key = next(k for k in doc["data"] if k.startswith("Module.model.layers.1.mlp.down_proj."))
    leaf = doc["data"][key]["parameters"]["weight"]
    data = dest / "dump_tensor_data"
    data.mkdir(parents=True)
    for f in (rollout / "dump_tensor_data").iterdir():
        (data / f.name).write_bytes(f.read_bytes())
    half = np.load(data / leaf["data_name"])
    half = half[: half.shape[0] // 2]
    np.save(data / leaf["data_name"], half)
    leaf.update(shape=list(half.shape), Max=float(half.max()), Min=float(half.min()),
                Mean=float(half.mean()), Norm=float(np.linalg.norm(half)))
    (dest / "dump.json").write_text(json.dumps(doc), encoding="utf-8")


def test_tp_shard_is_structural_in_statistics_mode(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(task="tensor")
    _halve_rollout_down_weight(rollout, tmp_path / "rollout")
    out = run_cli(train, tmp_path / "rollout", tmp_path / "out", "--statistics-only")
    r = out.result("L1.down.weight")
    assert r["status"] == "structural" and r["reason"].startswith("tp_shard: one side holds 1/2")
    v = out.verdict(["model.layers.1.mlp.down_proj"])
    assert v["parameter_status"] == "structural" and v["status"] == "clean"


def test_tp_shard_is_structural_in_tensor_mode(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(task="tensor")
    _halve_rollout_down_weight(rollout, tmp_path / "rollout")
    out = run_cli(train, tmp_path / "rollout", tmp_path / "out")
    r = out.result("L1.down.weight")
    assert r["status"] == "structural" and r["reason"].startswith("tp_shard")


def test_statistics_only_ignores_tensor_files(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(faults=(F.CorruptWeight("rollout", "gate", 1),), task="tensor")
    out = run_cli(train, rollout, tmp_path, "--statistics-only")
    assert out.d3["mode"] == "statistics" and all(r["tensor_metrics"] is None for r in out.d3["results"])
    assert out.first["train_modules"] == GATE_UP1


def test_unsafe_or_missing_tensor_file_degrades_that_leaf_to_statistics(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(task="tensor")
    doc = json.loads((rollout / "dump.json").read_text(encoding="utf-8"))
    assert doc["dump_data_dir"].startswith("/") and not (rollout / doc["dump_data_dir"]).exists()
    key = next(k for k in doc["data"] if k.startswith("Module.model.layers.1.mlp.down_proj."))
    doc["data"][key]["parameters"]["weight"]["data_name"] = "../../../../etc/passwd"
    key0 = next(k for k in doc["data"] if k.startswith("Module.model.layers.0.mlp.down_proj."))
    doc["data"][key0]["parameters"]["weight"]["data_name"] = "no_such_file.npy"
    bad = tmp_path / "rollout"
    (bad / "dump_tensor_data").mkdir(parents=True)
    (bad / "dump.json").write_text(json.dumps(doc), encoding="utf-8")
    for f in (rollout / "dump_tensor_data").iterdir():
        (bad / "dump_tensor_data" / f.name).write_bytes(f.read_bytes())
    out = run_cli(train, bad, tmp_path / "out")
    for point, words in (("L1.down.weight", "'..' refused"), ("L0.down.weight", "not found")):
        r = out.result(point)
        assert r["mode"] == "statistics" and r["status"] == "match"
        assert any(n.startswith("tensor unavailable, statistics used instead") and words in n
                   for n in r["notes"])
    assert out.d3["mode"] == "tensor" and out.result("L1.mlp_out")["mode"] == "tensor"


def test_tensor_folder_symlinked_outside_the_dump_is_refused(synth_dirs, tmp_path):
    _, train, rollout = synth_dirs(task="tensor")
    linked = tmp_path / "rollout"
    linked.mkdir()
    (linked / "dump.json").write_bytes((rollout / "dump.json").read_bytes())
    (linked / "dump_tensor_data").symlink_to(rollout / "dump_tensor_data")
    out = run_cli(train, linked, tmp_path / "out")
    assert out.d3["mode"] == "statistics"
    assert all(any("leads outside the dump folder" in n for n in r["notes"]) for r in out.d3["results"])
    assert out.first["pair"] is None


def test_megatron_vs_vllm_fused_qkv_matches_in_tensor_mode(synth_run):
    out = synth_run(train="megatron", task="tensor")
    for point in ("L1.q+L1.k+L1.v", "L1.q.weight+L1.k.weight+L1.v.weight"):
        assert out.result(point)["status"] == "match"


def test_permuted_megatron_qkv_is_not_excused_as_layout(synth_run):
    out = synth_run(train="megatron_local", rollout="hf", faults=(F.PermuteQKV("train", 1),), task="tensor")
    assert out.result("L1.q.weight+L1.k.weight+L1.v.weight")["status"] == "mismatch"
    assert out.first["train_modules"] == ["decoder.layers.1.self_attention.linear_qkv"]


def test_tensor_metrics_of_a_single_bad_token(tmp_path):
    from dumpcompare.compare import tensors as T
    t = np.random.default_rng(0).standard_normal((6, 16))
    r = t.copy()
    r[3, 5] += 1.0
    acc = T.Metrics(rtol=1e-4, atol=1e-5)
    acc.add(t, r)
    m = acc.result()
    assert m["first_token_past_tol"] == 3 and m["frac_within_tol"] == pytest.approx(1 - 1 / 96)
    assert m["max_abs"] == pytest.approx(1.0) and 0 < m["rel_l2"] < 0.2 and m["cosine"] < 1


def test_megatron_grouped_qkv_without_head_size_is_incomparable_not_guessed(tmp_path):
    import synth
    train, rollout = synth.generate_pair(tmp_path / "d", synth.Config(layers=2), train_layout="megatron",
                                         rollout_layout="vllm", task="tensor")
    dump = train / "dump.json"
    doc = json.loads(dump.read_text(encoding="utf-8"))
    doc["data"] = {k: v for k, v in doc["data"].items() if ".core_attention." not in k}
    dump.write_text(json.dumps(doc), encoding="utf-8")
    r = run_cli(train, rollout, tmp_path / "out").result("L1.q+L1.k+L1.v")
    assert r["status"] == "incomparable" and r["error"] is None
    assert r["reason"].startswith("megatron_grouped_qkv: cannot regroup qkv, the dump does not show the head size")
