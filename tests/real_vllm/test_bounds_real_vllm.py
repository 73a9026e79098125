"""Real vLLM pairs without --model (issue 23): the engine's calls hold one token fewer than the
trainer's forward (the last sampled token is never fed back), so statistics are held to the
bounds they prove (compare/bounds.py, references/generation_bounds.md).

A clean pair: every bound holds, consistent but not verified: never an all-clear, never a root
cause, and the console names what would decide it. Faulty pairs where a stale weight moves its
module's output past a bound: the broken bound is the first divergence, at the injected module.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
CASES = REPO / "tests" / "data" / "real_vllm"


def _run(name: str, out: Path):
    case = CASES / name
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", str(case / "train"), "--rollout",
                           str(case / "rollout"), "--out-dir", str(out), "--fail-on-finding"],
                          capture_output=True, text=True, timeout=300)
    docs = {n: json.loads((out / f"output_{n}.json").read_text(encoding="utf-8"))
            for n in ("3_value_compare", "4_module_analysis", "5_root_cause_report")}
    return proc, docs, json.loads((case / "case.json").read_text(encoding="utf-8"))["expected"]


def test_a_clean_generation_is_consistent_not_verified(tmp_path):
    proc, docs, expected = _run("llama_clean_stats_onestep", tmp_path)
    assert expected["verdict"] == "clean"
    assert proc.returncode == 1, proc.stderr          # not an all-clear
    acts = docs["4_module_analysis"]["comparability"]["activations"]
    assert acts["compared"] == 0 and acts["bounded"] > 0
    assert docs["4_module_analysis"]["comparability"]["comparable"]
    doc5 = docs["5_root_cause_report"]
    assert doc5["verdict"] == "inconclusive" and not doc5["root_causes"]
    bounded = [r for r in docs["3_value_compare"]["results"] if r["status"] == "bounded"]
    assert bounded and all(r["bounds"]["broken"] is None and r["skip"] is None for r in bounded)
    lines = proc.stdout.splitlines()
    assert "consistent, not verified" in lines[0]
    assert any("--model <checkpoint> --token-ids <ids>" in line and "tensor mode" in line for line in lines)


@pytest.mark.parametrize("name", ["llama_stale_o_proj_stats_onestep", "llama_stale_train_input_norm_stats_onestep"])
def test_a_stale_weight_breaks_a_bound_at_its_module(tmp_path, name):
    proc, docs, expected = _run(name, tmp_path)
    assert proc.returncode == 1, proc.stderr
    doc5 = docs["5_root_cause_report"]
    assert doc5["verdict"] == expected["verdict"] == "root_cause_found"
    top = doc5["root_causes"][0]
    assert (top["train_module"], top["rollout_module"], top["layer"]) == (
        expected["train_modules"][0], expected["rollout_modules"][0], expected["layer"])
    # The module's output breaks a bound: a call's Max or Min beyond the trainer's, named.
    first = docs["4_module_analysis"]["first_divergence"]
    assert first["train_modules"] == expected["train_modules"]
    pair = next(m for m in docs["4_module_analysis"]["modules"] if m["pid"] == first["pair"])
    results = {r["cid"]: r for r in docs["3_value_compare"]["results"]}
    out = results[pair["points"]["out"][0]["cid"]]
    assert out["status"] == "mismatch" and out["bounds"]["broken"] in ("max", "min")
    assert out["bounds"]["key"] in _call_keys(out["rollout"]) and "bound broken" in out["reason"]


def _call_keys(side: dict) -> list[str]:
    """Every call's key a result's side read: a folded record holds ``calls[i]`` calls from its key on."""
    out = []
    for key, n in zip(side["keys"], side.get("calls") or [1] * len(side["keys"])):
        base, first = key.rsplit(".", 1)
        out += [f"{base}.{int(first) + i}" for i in range(n)]
    return out


def test_a_stale_norm_weight_is_a_parameter_issue(tmp_path):
    # The norm weight is dumped on both sides: that it differs is proven, whatever the bounds.
    _, docs, expected = _run("llama_stale_train_input_norm_stats_onestep", tmp_path)
    assert docs["5_root_cause_report"]["root_causes"][0]["category"] == expected["category"]
