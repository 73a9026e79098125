"""Tensor-parallel rank merging (the default for the ranks of one step): shards are gathered before comparing."""
import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from dumpcompare.cli import main as compare_main
from rootcause.cli import main as rootcause_main
from synth import Config, init_weights, run_side, write_dump
from synth.tp import shard_entries

CFG = Config(layers=3, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64)
CFG4 = Config(layers=3, hidden=32, intermediate=64, heads=4, kv_heads=4, head_dim=8, vocab=64)


def _write_side(root, layout, tp, task, faults=(), partial=False, corrupt_rank=None, grad=False, cfg=CFG):
    entries = run_side(cfg, layout, faults, grad=grad, weights=init_weights(cfg))
    ranks = shard_entries(entries, cfg, tp, partial=partial) if tp > 1 else [entries]
    if corrupt_rank is not None:
        for e in ranks[corrupt_rank]:
            if "layers.1.mlp.gate_up_proj" in e.key:
                w = e.parameters["weight"]
                w.data = w.data * 1.5
    for r, es in enumerate(ranks):
        write_dump(root / "step0" / f"rank{r}", es, task=task)
    return root


def _run(tmp_path, rollout_tp, task="statistics", train_tp=1, train_layout="hf", cfg=CFG, **kw):
    train = _write_side(tmp_path / "train", train_layout, train_tp, task, grad=train_layout == "hf", cfg=cfg)
    rollout = _write_side(tmp_path / "rollout", "vllm", rollout_tp, task, cfg=cfg, **kw)
    out = tmp_path / "out"
    argv = ["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out), "--quiet"]
    assert rootcause_main(argv) == 0
    docs = {n: json.loads((out / f"output_{n}.json").read_text()) for n in
            ("1_key_mapping", "3_value_compare", "4_module_analysis", "5_root_cause_report")}
    return docs


def _result(docs, point):
    return next(r for r in docs["3_value_compare"]["results"] if r["point"] == point and r["pair"] is None)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_tp1_vs_tp2_clean_pair_has_no_divergence(tmp_path, task):
    docs = _run(tmp_path, 2, task)
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"
    assert docs["4_module_analysis"]["first_divergence"]["pair"] is None
    notes = docs["1_key_mapping"]["sources"]["rollout"]["notes"]
    assert any(n.startswith("merged 2 tensor-parallel ranks") for n in notes)
    # Fused column-parallel outputs are gathered per part, row-parallel inputs concatenated.
    for point in ("L1.q+L1.k+L1.v", "L1.gate+L1.up", "L1.act_out", "L1.attn_core_out",
                  "L1.down.weight", "M.embed.weight"):
        assert _result(docs, point)["status"] == "match", point
    # The rule used for each leaf is recorded with the comparison.
    assert _result(docs, "L1.down.weight")["rollout"]["merges"] == ["concat:1"]
    assert _result(docs, "L1.attn_core_out")["train"]["merges"] == [None]
    if task == "tensor":
        assert _result(docs, "L1.q+L1.k+L1.v")["tensor_metrics"]["cosine"] > 0.999999


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_fault_in_one_shard_is_found_at_the_fused_module(tmp_path, task):
    docs = _run(tmp_path, 2, task, corrupt_rank=1)
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["layer"], rc["rollout_module"]) == (
        "parameter_or_checkpoint_issue", 1, "model.layers.1.mlp.gate_up_proj")


def test_partial_sums_are_not_combined_from_statistics(tmp_path):
    docs = _run(tmp_path, 2, "statistics", partial=True)
    r = _result(docs, "L1.attn_out")
    assert r["status"] == "incomparable" and "partial sums" in r["reason"]
    assert docs["5_root_cause_report"]["root_causes"] == []


def test_partial_sums_are_summed_from_tensors(tmp_path):
    docs = _run(tmp_path, 2, "tensor", partial=True)
    assert _result(docs, "L1.attn_out")["status"] == "match"
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"


def test_tp2_vs_tp4_statistics(tmp_path):
    docs = _run(tmp_path, 4, "statistics", train_tp=2, train_layout="vllm", cfg=CFG4)
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"
    assert _result(docs, "L1.q+L1.k+L1.v")["status"] == "match"


def test_tp_ranks_of_one_step_merge_by_default(tmp_path):
    rollout = _write_side(tmp_path / "rollout", "vllm", 2, "statistics")
    train = _write_side(tmp_path / "train", "hf", 1, "statistics")
    out = tmp_path / "o"
    assert compare_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out), "--quiet"]) == 0
    src = json.loads((out / "output_1_key_mapping.json").read_text())["sources"]
    assert src["rollout"]["rank_layout"]["kind"] == "tensor_parallel" and src["rollout"]["ranks"] == ["0", "1"]
    assert json.loads((out / "output_4_module_analysis.json").read_text())["first_divergence"]["pair"] is None


def test_ranks_that_saw_different_tokens_need_a_choice(tmp_path, capsys):
    rollout = _write_side(tmp_path / "rollout", "vllm", 2, "statistics")
    other = _write_side(tmp_path / "other", "vllm", 1, "statistics", cfg=replace(CFG, seq_len=5))
    shutil.copy(other / "step0" / "rank0" / "dump.json", rollout / "step0" / "rank1" / "dump.json")
    train = _write_side(tmp_path / "train", "hf", 1, "statistics", cfg=replace(CFG, seq_len=3))
    code = compare_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "saw different tokens" in err and "rank 1" in err and "--rollout-rank" in err
    assert not (tmp_path / "o").exists()


def test_shards_rebuild_the_unsharded_tensor():
    entries = run_side(CFG, "vllm", (), weights=init_weights(CFG))
    ranks = shard_entries(entries, CFG, 2)
    key = next(e.key for e in entries if "layers.0.mlp.down_proj" in e.key)
    full = next(e for e in entries if e.key == key)
    parts = [next(e for e in r if e.key == key) for r in ranks]
    np.testing.assert_array_equal(np.concatenate([p.parameters["weight"].data for p in parts], 1),
                                  full.parameters["weight"].data)
