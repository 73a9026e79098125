"""Repeated calls of every module (micro-batches) are folded into one plan and compared call by call."""
import json
from dataclasses import replace

import pytest

from rootcause.cli import main as rootcause_main
from synth import Config, faults as F, init_weights, run_side, write_dump
from synth.calls import as_calls

CFG = Config(layers=3, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=8)
CALLS = 4


def _passes(layout, faults_at=None, n=CALLS, grad=False):
    """``n`` forward passes on different tokens; ``faults_at`` maps a pass index to its faults."""
    w = init_weights(CFG)
    return as_calls([run_side(replace(CFG, seed=10 + i), layout, (faults_at or {}).get(i, ()), grad=grad, weights=w)
                     for i in range(n)])


def _run(tmp_path, train, rollout, *extra):
    write_dump(tmp_path / "train", train)
    write_dump(tmp_path / "rollout", rollout)
    out = tmp_path / "out"
    assert rootcause_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                           "--out-dir", str(out), "--quiet", *extra]) == 0
    return {n: json.loads((out / f"output_{n}.json").read_text())
            for n in ("1_key_mapping", "3_value_compare", "5_root_cause_report")}


def _result(docs, point):
    return next(r for r in docs["3_value_compare"]["results"] if r["point"] == point and r["pair"] is None)


def test_clean_micro_batches_fold_and_every_call_matches(tmp_path):
    docs = _run(tmp_path, _passes("hf", grad=True), _passes("vllm"))
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"
    assert all(docs["1_key_mapping"]["sources"][s]["folded_calls"] for s in ("train", "rollout"))
    rows = docs["1_key_mapping"]["train"]
    assert not any(r["call"] for r in rows) and {r["calls"] for r in rows if r["kind"] == "module"} == {CALLS}
    r = _result(docs, "L1.q+L1.k+L1.v")
    assert r["calls"]["compared"] == CALLS and r["calls"]["counts"] == {"match": CALLS}


def test_a_fault_in_one_call_is_found_and_located_in_that_call(tmp_path):
    rollout = _passes("vllm", faults_at={2: (F.CorruptWeight("rollout", "down", 1),)})
    docs = _run(tmp_path, _passes("hf", grad=True), rollout)
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["rollout_module"], rc["layer"]) == (
        "parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj", 1)
    assert rc["evidence"]["diverged_calls"]["L1.down.weight"] == {"compared": CALLS, "first_diverged": 2,
                                                                  "diverged": 1}
    r = _result(docs, "L1.down.weight")
    assert r["status"] == "mismatch"
    assert r["calls"]["first_diverged"] == 2 and r["calls"]["reported"] == 2
    assert r["calls"]["counts"] == {"match": CALLS - 1, "mismatch": 1}


def test_folded_counts_equal_the_call_by_call_comparison(tmp_path):
    train = _passes("hf", grad=True)
    rollout = _passes("vllm", faults_at={1: (F.KernelNoise("rollout", 0.05),), 3: (F.NormEps("rollout", 1e-1, 1),)})
    folded = _run(tmp_path / "a", train, rollout)
    apart = _run(tmp_path / "b", _passes("hf", grad=True), _passes(
        "vllm", faults_at={1: (F.KernelNoise("rollout", 0.05),), 3: (F.NormEps("rollout", 1e-1, 1),)}),
        "--no-fold-calls")
    assert not apart["1_key_mapping"]["sources"]["rollout"]["folded_calls"]
    per_call = {r["point"]: r["status"] for r in apart["3_value_compare"]["results"] if r["pair"] is None}
    checked = 0
    for r in folded["3_value_compare"]["results"]:
        if r["pair"] is not None or not r["calls"] or r["status"] in ("structural", "incomparable"):
            continue
        points = [r["point"]] + ["+".join(f"{p}@{n}" for p in r["point"].split("+")) for n in range(1, CALLS)]
        if not all(p in per_call for p in points):
            continue
        statuses = [per_call[p] for p in points]
        assert r["calls"]["counts"] == {s: statuses.count(s) for s in set(statuses)}, r["point"]
        checked += 1
    assert checked > 20
    assert folded["5_root_cause_report"]["verdict"] == apart["5_root_cause_report"]["verdict"]


def test_unequal_call_counts_compare_the_common_calls(tmp_path):
    docs = _run(tmp_path, _passes("hf", grad=True, n=3), _passes("vllm", n=2))
    r = _result(docs, "L1.q+L1.k+L1.v")
    assert (r["calls"]["train"], r["calls"]["rollout"], r["calls"]["compared"]) == (3, 2, 2)
    assert any("the first 2 are compared" in n for n in r["notes"])
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"


def test_one_rollout_call_against_folded_train_calls_grades_that_call(tmp_path):
    rollout = _passes("vllm", faults_at={0: (F.CorruptWeight("rollout", "down", 1),)}, n=1)
    docs = _run(tmp_path, _passes("hf", grad=True, n=3), rollout)
    r = _result(docs, "L1.down.weight")
    assert r["status"] == "mismatch"
    assert (r["calls"]["compared"], r["calls"]["counts"], r["calls"]["first_diverged"]) == (1, {"mismatch": 1}, 0)
