"""Real msprobe dumps of three micro-batches: calls are folded and graded one by one."""
import json
import shutil
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
    # a copy: the same folder on both sides is refused before the compare step
    shutil.copytree(DATA / "clean", tmp_path / "copy")
    assert rootcause_main(["--train", str(DATA / "clean"), "--rollout", str(tmp_path / "copy"),
                           "--out-dir", str(out), "--quiet"]) == 0
    doc = json.loads((out / "output_3_value_compare.json").read_text())
    assert all(r["calls"]["counts"] == {"match": 3} for r in doc["results"] if r["calls"])
    assert sum(1 for r in doc["results"] if r["calls"]) > 20


def test_calls_kept_apart_are_held_by_their_own_call_of_the_container(tmp_path):
    # With --no-fold-calls each call of a module is its own pair: a call-k child is held by the
    # container's call k (written right after it), and its window starts inside that call.
    from dumpcompare.cli import main as compare_main

    out = tmp_path / "apart"
    assert compare_main(["--train", str(DATA / "clean"), "--rollout", str(DATA / "clean"), "--out-dir", str(out),
                         "--quiet", "--no-fold-calls"]) == 0
    doc1 = json.loads((out / "output_1_key_mapping.json").read_text())
    doc4 = json.loads((out / "output_4_module_analysis.json").read_text())
    call = {r["path"] + "#" + str(r["index"]): r["call"] for r in doc1["train"]}
    call_of = {m["pid"]: call[m["train_modules"][0] + "#" + str(m["train_order"])] for m in doc4["modules"]}
    held = [m for m in doc4["modules"] if m["containers"]]
    assert {call_of[m["pid"]] for m in held} == {0, 1, 2}
    for m in held:
        assert {call_of[c] for c in m["containers"]} == {call_of[m["pid"]]}, m["train_modules"]
    down = [m for m in doc4["modules"] if m["train_modules"] == ["model.layers.1.mlp.down_proj"]]
    assert len(down) == 3
    for m in down:
        prev = next(x for x in doc4["modules"] if x["pid"] == m["previous_aligned"])
        assert (prev["layer"], call_of[prev["pid"]]) == (1, call_of[m["pid"]])
        assert prev["train_modules"][0].startswith("model.layers.1.mlp.")
