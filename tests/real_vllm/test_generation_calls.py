"""A generation judged as vLLM ran it (issue 23 item 1): the trainer's one forward over prompt +
response against the engine's prefill and decode calls, each call on its own rows. A weight that
changes at decode call k (a sync landing mid-generation) is found at its module from call k; a
clean generation is clean although the two dumps never compare with each other."""
import json
import subprocess
import sys

import pytest

from real_vllm.vllm_corpus import CORPUS, REPO, case_doc

SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"


def _run(name, out):
    doc = case_doc(name)
    case = CORPUS / name
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", str(case / "train"), "--rollout",
                           str(case / "rollout"), "--out-dir", str(out), "--model",
                           str(CORPUS / "_models" / doc["family"]), "--token-ids", str(case / "tokens.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads((out / "output_5_root_cause_report.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["llama_sync_mid_down_proj_stats_onestep", "llama_sync_mid_k_proj_stats_percall"])
def test_a_sync_mid_generation_is_found_from_its_call(name, tmp_path):
    expected = case_doc(name)["expected"]
    console, doc = _run(name, tmp_path)
    rc = doc["root_causes"][0]
    assert (rc["category"], rc["side"]) == (expected["category"], expected["side"])
    assert rc["train_module"] == expected["train_modules"][0]
    ev = rc["evidence"]
    assert ev["first_call"] == expected["from_call"] and ev["calls"] == case_doc(name)["forward_calls"]
    assert "per call" in ev["departure"]["how"]
    assert f"from forward call {expected['from_call']} of {ev['calls']} on (decode call {expected['from_call']}; " \
        in console.splitlines()[1]


def test_a_clean_generation_matches_the_reference_on_every_call(tmp_path):
    _console, doc = _run("llama_clean_stats_onestep", tmp_path)
    assert doc["verdict"] == "no_credible_divergence" and not doc["root_causes"]
    assert any("match the reference forward" in n for n in doc["notes"])
    rf = doc["reference_forward"]
    assert rf["tokens"]["rollout"]["ids"] == rf["tokens"]["train"]["ids"][:-1]
    assert [c["tokens"] for c in rf["tokens"]["rollout"]["calls"]] == [8, 1, 1, 1, 1, 1]


def test_prepacked_weights_are_not_visible_and_a_run_of_calls_says_its_length(tmp_path):
    """vLLM CPU's empty [0] linear weights are 'not visible' (no_statistics), never a size conflict; a
    size conflict against a folded run of decode calls lists the run's length with its one shape."""
    _run("llama_sync_mid_down_proj_stats_onestep", tmp_path)
    doc = json.loads((tmp_path / "output_3_value_compare.json").read_text(encoding="utf-8"))
    empty = [r for r in doc["results"] if r["rollout"]["shapes"] == [[0]]]
    assert empty and all(r["skip"]["code"] == "no_statistics" and "not visible" in r["skip"]["reason"]
                         for r in empty)
    conflicts = [r["skip"]["reason"] for r in doc["results"] if (r["skip"] or {}).get("code") == "shape_conflict"]
    assert conflicts and all("x 6 calls" in c for c in conflicts), conflicts
