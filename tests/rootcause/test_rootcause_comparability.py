"""Dumps of two different models or inputs must not produce a confident root cause."""
import json
from pathlib import Path

import pytest

from synth import Config, generate_pair

CONFIDENT = 0.56  # "likely" and above on the credence scale


def mixed_pair(tmp_path, train_cfg, rollout_cfg):
    train, _ = generate_pair(tmp_path / "a", train_cfg, train_layout="hf", rollout_layout="vllm")
    _, rollout = generate_pair(tmp_path / "b", rollout_cfg, train_layout="hf", rollout_layout="vllm")
    return train, rollout


def assert_not_a_finding(doc):
    assert doc["verdict"] == "inconclusive" or not doc["root_causes"], (
        doc["verdict"], [(c["category"], c["train_module"], c["confidence"]) for c in doc["root_causes"]])
    assert not [c for c in doc["root_causes"] if c["confidence"] >= CONFIDENT]
    assert doc["notes"], "the report must say why the dumps cannot be compared"
    assert any("compar" in n or "differ" in n for n in doc["notes"])


def test_different_tokens_are_inconclusive(tmp_path, analyze_pair):
    train, rollout = mixed_pair(tmp_path, Config(layers=4, hidden=32), Config(layers=4, hidden=32, seed=7))
    doc = analyze_pair(train, rollout).doc
    assert doc["verdict"] == "inconclusive"
    assert doc["root_causes"] == []
    assert doc["comparability"]["comparable"] is False
    assert any("token" in n for n in doc["notes"])
    assert_not_a_finding(doc)


def test_different_depth_and_width_is_not_a_finding(tmp_path, analyze_pair):
    train, rollout = mixed_pair(tmp_path, Config(layers=4, hidden=32), Config(layers=2, hidden=64))
    assert_not_a_finding(analyze_pair(train, rollout).doc)


def test_different_depth_is_not_a_finding(tmp_path, analyze_pair):
    train, rollout = mixed_pair(tmp_path, Config(layers=4, hidden=32), Config(layers=3, hidden=32))
    assert_not_a_finding(analyze_pair(train, rollout).doc)


def test_api_level_dumps_compare_nothing_and_are_never_an_all_clear(tmp_path):
    """An L1 (API-level) msprobe dump against an L0 one: nothing maps, so nothing is compared:
    inconclusive, said first on the console, and --fail-on-finding fails."""
    import subprocess
    import sys
    data = Path(__file__).resolve().parents[1] / "data" / "msprobe"
    script = Path(__file__).resolve().parents[2] / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
    proc = subprocess.run([sys.executable, str(script), "--train", str(data / "llama_L1_statistics"), "--rollout",
                           str(data / "llama_L0_statistics"), "--out-dir", str(tmp_path / "o"), "--fail-on-finding"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("nothing was compared (") and lines[0].endswith("this is not an all-clear")
    assert "L0" in lines[0] and "none beyond tolerance" not in proc.stdout
    page = (tmp_path / "o" / "report.html").read_text(encoding="utf-8")
    assert "Nothing was compared" in page.split("<svg")[0]
    rep = json.loads((tmp_path / "o" / "output_5_root_cause_report.json").read_text())
    assert rep["verdict"] == "inconclusive"
    assert any("nothing was compared" in r and "L0" in r for r in rep["comparability"]["reasons"])
