"""The readers of what the dumpers write, on the committed real-vLLM corpus: tokens.json, the
log-prob JSONL of both sides, and msprobe's tree in the layout each case records."""
import json
from pathlib import Path

import pytest

from dumping import logprob_jsonl, token_ids
from dumping.cli import InputError

CORPUS = Path(__file__).resolve().parents[1] / "data" / "real_vllm"
CASES = sorted(p for p in CORPUS.iterdir() if (p / "case.json").is_file())


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_written_files_have_their_documented_shape(case):
    doc = json.loads((case / "case.json").read_text())
    prompt, response = token_ids.read_tokens(case / "tokens.json")
    assert len(prompt) == doc["prompt_len"] and len(response) == doc["forward_calls"]
    for side in ("rollout", "train"):
        (rec,) = _records(case / f"{side}_logprobs.jsonl")
        assert rec["id"] == "seq0" and rec["token_ids"] == response and rec["prompt_ids"] == prompt
        assert len(rec["logprobs"]) == len(response) and all(v <= 0 for v in rec["logprobs"])
        assert rec["logprobs_mode"] == "processed_logprobs"
    (roll,) = _records(case / "rollout_logprobs.jsonl")
    for tok, lp, top in zip(response, roll["logprobs"], roll["top_logprobs"]):
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True) and lp <= values[0] + 1e-6
        if doc["temperature"] == 0:  # greedy: the sampled token is the most likely one (or tied with it)
            assert lp == values[0]
    steps = sorted((case / "rollout").glob("step*"))
    assert len(steps) == doc["rollout"]["steps"]
    ranks = sorted(p.name for p in steps[0].iterdir())
    assert ranks == [f"rank{r}" for r in range(doc["rollout"]["tp"])]
    assert [p.name for p in (case / "train").glob("step*/*")] == ["rank0"]


def _clean(case):
    return json.loads((case / "case.json").read_text())["fault"] is None


@pytest.mark.parametrize("case", [c for c in CASES if _clean(c)], ids=lambda p: p.name)
def test_clean_pairs_give_the_same_log_probs(case):
    # Same weights and tokens: the trainer's recomputed log-probs are vLLM's up to kernel rounding
    # (fp32: the same PyTorch CPU ops in another order; bf16: one rounding per op).
    doc = json.loads((case / "case.json").read_text())
    (roll,), (train,) = _records(case / "rollout_logprobs.jsonl"), _records(case / "train_logprobs.jsonl")
    tol = 1e-3 if doc["dtype"]["rollout"] == "fp32" else 0.2
    assert max(abs(a - b) for a, b in zip(roll["logprobs"], train["logprobs"])) < tol


def test_prompt_ids_are_taken_as_users_hold_them(tmp_path):
    assert token_ids.parse_prompt_ids("[1, 2]") == [[1, 2]]
    assert token_ids.parse_prompt_ids("[[1], [2, 3]]") == [[1], [2, 3]]
    f = tmp_path / "tokens.json"
    token_ids.write_tokens(f, [4, 5], [6])
    assert token_ids.parse_prompt_ids(str(f)) == [[4, 5]]
    assert token_ids.read_tokens(f) == ([4, 5], [6])
    with pytest.raises(InputError, match="not valid JSON"):
        token_ids.parse_prompt_ids("[1,")


def test_a_record_needs_one_log_prob_per_token():
    with pytest.raises(ValueError, match="2 token ids but 1 log-probs"):
        logprob_jsonl.record("s", [1, 2], [-0.5])
    rec = logprob_jsonl.record("s", [1], [-0.5], dtype=None, temperature=1.0)
    assert rec == {"id": "s", "token_ids": [1], "logprobs": [-0.5], "temperature": 1.0}


@pytest.mark.parametrize("case", [c for c in CASES if json.loads((c / "case.json").read_text())["mode"] == "statistics"],
                         ids=lambda p: p.name)
def test_statistics_dumps_hold_mean_and_norm(case):
    # msprobe 26.2 drops Mean and Norm under "precision": "high"; the dumpers' config must not set it.
    for side in ("train", "rollout"):
        data = json.loads(next((case / side).glob("step0/rank0/dump.json")).read_text())["data"]
        stats = [t for entry in data.values() for t in entry.get("output") or []
                 if isinstance(t, dict) and t.get("dtype") in ("torch.float32", "torch.bfloat16", "torch.float16")]
        assert stats and all(t["Mean"] is not None and t["Norm"] is not None for t in stats)
