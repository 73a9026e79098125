"""Log-prob files against tensor dumps (issue 24): with both, output_5 ``logprobs.consistency``
says whether each side's file holds what its dumped logits give, testing the temperature and
``logprobs_mode`` explanation before it says the two are not the same forward; and output_5
``logprobs.noise`` is the run's one verdict on noise.

The dumps are a real vLLM / transformers tensor pair of the corpus (fp32, greedy, a stale v_proj on
the rollout). The temperature case is injected here from the committed trainer logits, read with the
compare skill's safe tensor reader: a trainer file at T = 0.6 is log_softmax(logits / 0.6) at each
response token's row, as RL trainers compute it; the rollout file keeps vLLM's default raw_logprobs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dumpcompare import tensorio

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "data" / "real_vllm" / "llama_stale_v_proj_tensor_onestep"
OTHER = REPO / "tests" / "data" / "real_vllm" / "llama_clean_tensor_onestep"
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
TRAIN_LOGITS = CASE / "train" / "step0" / "rank0" / "dump_tensor_data" / "Module.lm_head.Linear.forward.0.output.0.pt"
T = 0.6


def _run(out: Path, rollout: Path, train: Path, *extra) -> tuple[str, dict]:
    argv = [sys.executable, str(SCRIPT), "--train", str(CASE / "train"), "--rollout", str(CASE / "rollout"),
            "--out-dir", str(out), "--rollout-logprobs", str(rollout), "--train-logprobs", str(train), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads((out / "output_5_root_cause_report.json").read_text(encoding="utf-8"))


def _record(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8").splitlines()[0])


def _trainer_at_temperature(tmp: Path, stated: float) -> tuple[Path, Path]:
    """(rollout file as vLLM returns it by default, trainer file at T), both stating the temperature
    ``stated``."""
    tokens = json.loads((CASE / "tokens.json").read_text(encoding="utf-8"))
    p, resp = len(tokens["prompt_ids"]), tokens["response_ids"]
    z = tensorio.load_tensor(TRAIN_LOGITS).reshape(-1, 256).astype(np.float64) / T
    rows = z[p - 1:p - 1 + len(resp)]
    top = rows.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True)))[:, 0]
    train = {**_record(CASE / "train_logprobs.jsonl"), "temperature": stated,
             "logprobs": (rows[np.arange(len(resp)), resp] - lse).tolist()}
    rollout = {**_record(CASE / "rollout_logprobs.jsonl"), "temperature": stated, "logprobs_mode": "raw_logprobs"}
    (tmp / "r.jsonl").write_text(json.dumps(rollout) + "\n")
    (tmp / "t.jsonl").write_text(json.dumps(train) + "\n")
    return tmp / "r.jsonl", tmp / "t.jsonl"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("consistency")
    out = {"committed": _run(root / "committed", CASE / "rollout_logprobs.jsonl", CASE / "train_logprobs.jsonl"),
           "other_generation": _run(root / "other", OTHER / "rollout_logprobs.jsonl", OTHER / "train_logprobs.jsonl")}
    (root / "t_stated").mkdir()
    out["temperature_stated"] = _run(root / "stated", *_trainer_at_temperature(root / "t_stated", T))
    (root / "t_unstated").mkdir()
    unstated = _trainer_at_temperature(root / "t_unstated", 1.0)
    out["temperature_unstated"] = _run(root / "unstated", *unstated)
    out["temperature_given"] = _run(root / "given", *unstated, "--logprob-temperature", str(T))
    return out


def test_the_files_of_the_dumped_run_are_the_same_forward(runs):
    stdout, doc = runs["committed"]
    c = doc["logprobs"]["consistency"]
    assert c["verdict"] == "same_forward" and c["tokens"] == 3
    assert {s: v["fits"] for s, v in c["sides"].items()} == {"rollout": "raw", "train": "raw"}
    assert max(v["max_abs_diff"]["raw"] for v in c["sides"].values()) <= 1e-6
    assert "log-prob files vs dumped logits: the same forward" in stdout


def test_a_trainer_dividing_by_the_stated_temperature_is_the_same_forward(runs):
    _, doc = runs["temperature_stated"]
    c = doc["logprobs"]["consistency"]
    assert c["verdict"] == "same_forward" and c["temperature"] == T
    assert c["sides"]["train"]["fits"] == "temperature" == c["sides"]["train"]["expected"]
    assert c["sides"]["rollout"]["fits"] == "raw"          # vLLM's default raw_logprobs: before temperature
    assert c["sides"]["train"]["max_abs_diff"]["raw"] > 100 * c["tolerance"]   # raw alone would have said no


def test_an_unstated_temperature_is_not_explained_until_it_is_given(runs):
    stdout, doc = runs["temperature_unstated"]
    c = doc["logprobs"]["consistency"]
    assert c["verdict"] == "not_same_forward" and c["temperature"] is None
    assert "--logprob-temperature" in c["reason"] and "not the same forward" in stdout
    _, doc = runs["temperature_given"]
    c = doc["logprobs"]["consistency"]
    assert c["verdict"] == "same_forward" and c["sides"]["train"]["fits"] == "temperature"
    assert c["sides"]["train"]["expected"] == "raw" and "it states" in c["reason"]


def test_files_of_another_generation_are_not_the_same_forward(runs):
    _, doc = runs["other_generation"]
    c = doc["logprobs"]["consistency"]
    assert c["verdict"] == "not_same_forward" and "not the same generation" in c["reason"]


def test_one_noise_verdict_per_run_from_the_files_when_given(runs):
    stdout, doc = runs["committed"]
    noise = doc["logprobs"]["noise"]
    assert noise["source"] == "logprob_files" and noise["verdict"] == doc["logprob_triage"]["verdict"]
    assert noise["verdict"] == "likely_bug"            # the case's fault: a stale v_proj on the rollout
    assert noise["analytic_bound"]["max"] == doc["logits"]["clean_level_max"]
    assert "first_position_past_clean_level" not in doc["logprobs"]["dumps"]
    line = next(ln for ln in stdout.splitlines() if ln.startswith("log-probs: "))
    assert "judged on the log-prob files: past the fp32 noise band" in line and "clean level" not in line
