"""Real msprobe dumps of three micro-batches: calls are folded and graded one by one."""
import json
from pathlib import Path

import pytest

from rootcause.cli import main as rootcause_main

DATA = Path(__file__).resolve().parent.parent / "data" / "msprobe" / "llama_L0_statistics_3calls"


def _run(tmp_path, rollout):
    out = tmp_path / rollout
    assert rootcause_main(["--train", str(DATA / "clean"), "--rollout", str(DATA / rollout),
                           "--out-dir", str(out), "--quiet"]) == 0
    return {n: json.loads((out / f"output_{n}.json").read_text())
            for n in ("1_key_mapping", "3_value_compare", "5_root_cause_report")}


@pytest.mark.parametrize("rollout, counts, first", [
    ("perturbed", {"mismatch": 3}, 0),              # wrong in every call
    ("updated", {"match": 2, "mismatch": 1}, 2),    # changed after call 1
])
def test_a_weight_that_differs_in_some_calls_is_found_with_those_calls(tmp_path, rollout, counts, first):
    docs = _run(tmp_path, rollout)
    assert all(docs["1_key_mapping"]["sources"][s]["folded_calls"] for s in ("train", "rollout"))
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["rollout_module"], rc["layer"]) == (
        "parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj", 1)
    assert rc["evidence"]["diverged_calls"]["L1.down.weight"]["first_diverged"] == first
    r = next(x for x in docs["3_value_compare"]["results"] if x["point"] == "L1.down.weight" and x["pair"] is None)
    assert r["calls"]["counts"] == counts and r["calls"]["first_diverged"] == first


def test_the_same_dump_against_itself_matches_in_every_call(tmp_path):
    out = tmp_path / "same"
    assert rootcause_main(["--train", str(DATA / "clean"), "--rollout", str(DATA / "clean"),
                           "--out-dir", str(out), "--quiet"]) == 0
    doc = json.loads((out / "output_3_value_compare.json").read_text())
    assert all(r["calls"]["counts"] == {"match": 3} for r in doc["results"] if r["calls"])
    assert sum(1 for r in doc["results"] if r["calls"]) > 20
