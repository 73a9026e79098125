"""Log-probs, always (issue 23 item 2): the per-token log-probs of the sampled tokens computed from
real vLLM and trainer tensor dumps (the engine's sampled logits rows lined up with the trainer's)
reproduce what vLLM returned and what the trainer recomputed, and every run prints one log-prob
line or why there is none.

The corpus cases run greedy (temperature 0, ``logprobs_mode`` processed_logprobs, which at
temperature 0 are the raw log-probs) in float32 on both sides: the pipeline's float64 log-softmax
of the dumped float32 logits stays within 1e-6 of the float32 log-probs the engines returned.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "real_vllm"
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
TENSOR_CASES = ("llama_clean_tensor_onestep", "llama_stale_v_proj_tensor_onestep",
                "llama_stale_post_norm_tensor_percall")
STATISTICS_CASE = "llama_clean_stats_onestep"
# float32 log-probs on both sides (case.json dtype): what separates our float64 log-softmax of the
# dumped logits from the engine's own float32 one.
TOLERANCE = 1e-6


def _run(case: str, out: Path, *extra) -> tuple[str, dict, dict]:
    """Run the root-cause command as a user does: (stdout, output_3, output_5)."""
    argv = [sys.executable, str(SCRIPT), "--train", str(CORPUS / case / "train"),
            "--rollout", str(CORPUS / case / "rollout"), "--out-dir", str(out), *map(str, extra)]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    read = lambda name: json.loads((out / name).read_text(encoding="utf-8"))  # noqa: E731
    return proc.stdout, read("output_3_value_compare.json"), read("output_5_root_cause_report.json")


def _files(case: str) -> tuple[str, str]:
    return ("--rollout-logprobs", CORPUS / case / "rollout_logprobs.jsonl",
            "--train-logprobs", CORPUS / case / "train_logprobs.jsonl")


def _returned(case: str, side: str) -> dict:
    return json.loads((CORPUS / case / f"{side}_logprobs.jsonl").read_text(encoding="utf-8").splitlines()[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each tensor case as a user runs it (the ids from the trainer's embedding input), one with the
    ids given as tokens.json and the log-prob files, and a statistics case with the files."""
    root = tmp_path_factory.mktemp("logprobs")
    out = {c: _run(c, root / c) for c in TENSOR_CASES}
    first = TENSOR_CASES[1]
    out["with_files"] = _run(first, root / "with_files", "--token-ids", CORPUS / first / "tokens.json",
                             *_files(first))
    out["statistics"] = _run(STATISTICS_CASE, root / "statistics")
    out["statistics_with_files"] = _run(STATISTICS_CASE, root / "statistics_files", *_files(STATISTICS_CASE))
    return out


def _logits_result(output_3: dict) -> dict:
    return next(r for r in output_3["results"] if r["point"] == "M.logits" and r["pair"] is None)


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_dumped_logits_reproduce_the_log_probs_each_engine_returned(runs, case):
    _, output_3, output_5 = runs[case]
    tokens = _logits_result(output_3)["logprob"]["tokens"]
    rollout, train = _returned(case, "rollout"), _returned(case, "train")
    prompt = len(rollout["prompt_ids"])
    # one record per response token, at the row before it: the last prompt position, then each decode call's
    assert [t["position"] for t in tokens] == list(range(prompt - 1, prompt - 1 + len(rollout["token_ids"])))
    assert [t["token_id"] for t in tokens] == rollout["token_ids"] == train["token_ids"]
    assert np.abs(np.array([t["rollout"] for t in tokens]) - rollout["logprobs"]).max() <= TOLERANCE
    assert np.abs(np.array([t["train"] for t in tokens]) - train["logprobs"]).max() <= TOLERANCE
    # output_5 publishes the same tokens with the metrics of the one metrics module
    assert output_5["logprobs"]["dumps"]["tokens"] == tokens
    delta = np.array([t["train"] - t["rollout"] for t in tokens])
    m = output_5["logprobs"]["dumps"]["metrics"]
    assert m["log_prob_abs_diff_max"] == pytest.approx(np.abs(delta).max(), abs=1e-15)
    assert m["kl"] == pytest.approx((-delta).mean(), abs=1e-15)
    assert m["k3_kl"] == pytest.approx((np.exp(delta) - 1 - delta).mean(), abs=1e-15)
    assert m["rollout_is_max"] == pytest.approx(np.exp(delta).max(), rel=1e-12)
    # the case's own measurement of the largest per-token difference (case.json)
    measured = json.loads((CORPUS / case / "case.json").read_text(encoding="utf-8"))["measured"]
    assert m["log_prob_abs_diff_max"] == pytest.approx(measured["logprob_max_abs_delta"], abs=1e-5)


def test_given_ids_and_the_files_agree_with_the_dumps(runs):
    _, output_3, output_5 = runs["with_files"]
    dumps, files = output_5["logprobs"]["dumps"], output_5["logprobs"]["files"]
    assert [t["token_id"] for t in dumps["tokens"]] == [t["token_id"] for t in files["tokens"]]
    assert [t["position"] for t in dumps["tokens"]] == [t["position"] for t in files["tokens"]]
    assert np.abs(np.array([t["delta"] for t in dumps["tokens"]])
                  - [t["delta"] for t in files["tokens"]]).max() <= 2 * TOLERANCE
    assert _logits_result(output_3)["status"] == "mismatch"        # the stale v_proj reaches the logits


def _log_prob_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith("log-probs: ")]


@pytest.mark.parametrize("kind", ["llama_clean_tensor_onestep", "with_files", "statistics", "statistics_with_files"])
def test_every_run_prints_one_log_prob_line_or_why_there_is_none(runs, kind):
    from rootcause import answer
    stdout, _, output_5 = runs[kind]
    lines = _log_prob_lines(stdout)
    assert len(lines) == 1, stdout
    line = lines[0]
    found = [n for n in answer.FIELD_NAMES if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", line)]
    assert not found, found
    dumps = output_5["logprobs"]["dumps"]
    if kind.startswith("statistics"):
        assert dumps["tokens"] is None and "statistics mode holds no per-token values" in line
    else:
        n = len(dumps["tokens"])
        assert f"{n} response tokens lined up from the dumped logits" in line
        assert f"max |delta| {dumps['metrics']['log_prob_abs_diff_max']:.3g}" in line
    if kind.endswith("with_files"):
        assert f"{output_5['logprobs']['files']['tokens_total']} response tokens from the log-prob files" in line
    else:
        assert output_5["logprobs"]["files"]["tokens"] is None
    if kind == "statistics":
        assert line.endswith("pass --rollout-logprobs/--train-logprobs or dump in tensor mode")


@pytest.mark.parametrize("case", TENSOR_CASES)
def test_without_files_the_dumped_tokens_get_the_one_noise_verdict(runs, case):
    """One noise model: the dumped tokens are judged against the measured band (the analytic
    clean level is carried as a note); three tokens decide only when their count rules noise out."""
    stdout, output_3, output_5 = runs[case]
    noise = output_5["logprobs"]["noise"]
    fault = json.loads((CORPUS / case / "case.json").read_text(encoding="utf-8")).get("fault")
    assert noise["source"] == "dumped_logits" and noise["precision"] == "fp32" and noise["tokens"] == 3
    assert noise["verdict"] == ("likely_bug" if fault else "undetermined"), noise["reason"]
    assert noise["analytic_bound"]["median"] == output_3["logprob"]["clean_level_median"]
    line = _log_prob_lines(stdout)[0]
    assert "judged on the dumped logits" in line and "rounding" not in line
