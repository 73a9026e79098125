"""dump_vllm.py with several prompts, on a stand-in engine (no vLLM, no torch, no msprobe): one
request per generate call, each between its own start_dump/stop_dump, and the per-sequence
output layout (seq<i>/tokens.json, seq<i>/rollout_logprobs.jsonl, sequences.json with the msprobe
steps of each sequence)."""
import json
import sys
import types
from types import SimpleNamespace

import pytest

import dump_vllm
from dumping import token_ids


class FakeEngine:
    """Records the calls dump_vllm makes; answers like vllm.LLM for a TP group of ``tp`` workers."""

    def __init__(self, tp=1, per_call=False):
        self.calls, self.tp, self.per_call, self.running = [], tp, per_call, False
        self.forwards = 0

    def collective_rpc(self, method, args=()):
        self.calls.append((method, tuple(args)))
        if method == "start_dump":
            assert not self.running, "a dump already running"
            self.running, self.forwards = True, 0
            return [None] * self.tp
        assert method == "stop_dump" and self.running
        self.running = False
        return [self.forwards if self.per_call else 1] * self.tp

    def generate(self, prompts, params, use_tqdm=False):
        assert self.running, "generate outside a dump"
        assert len(prompts) == 1, "a dump must never hold two requests"
        prompt = prompts[0]["prompt_token_ids"]
        self.calls.append(("generate", tuple(prompt)))
        response = [(t + 1) % 256 for t in prompt[-1:] * params.max_tokens]
        self.forwards = params.max_tokens
        lp = [{t: SimpleNamespace(logprob=-0.5, rank=1), 3: SimpleNamespace(logprob=-2.0, rank=2)} for t in response]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=response, logprobs=lp)])]


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    mod.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


def _args(tmp_path, prompts, *extra):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 256}))
    return dump_vllm.build_parser().parse_args(
        ["--model", str(model), "--prompt-ids", json.dumps(prompts), "--max-tokens", "3",
         "--out", str(tmp_path / "out"), *extra])


def test_several_prompts_are_accepted_and_checked_each(tmp_path):
    args = _args(tmp_path, [[5, 6], [7, 8, 9]])
    assert dump_vllm.check(args) == [[5, 6], [7, 8, 9]]


@pytest.mark.parametrize("per_call, tp", [(False, 1), (True, 2)])
def test_one_request_per_dump_and_one_folder_per_sequence(tmp_path, fake_vllm, per_call, tp):
    prompts = [[5, 6], [7, 8, 9], [10]]
    args = _args(tmp_path, prompts, *(["--per-call"] if per_call else []))
    llm = FakeEngine(tp=tp, per_call=per_call)
    seqs = dump_vllm.dump_all(llm, args, dump_vllm.check(args))

    # start, one generate, stop -- for each prompt in order, never two prompts in one dump
    kinds = [c[0] for c in llm.calls]
    assert kinds == ["start_dump", "generate", "stop_dump"] * len(prompts)
    assert [c[1] for c in llm.calls if c[0] == "generate"] == [tuple(p) for p in prompts]
    config = {c[1][0] for c in llm.calls if c[0] == "start_dump"}
    assert len(config) == 1 and config.pop().endswith("msprobe_rollout.json")

    out = tmp_path / "out"
    for i, prompt in enumerate(prompts):
        got_prompt, response = token_ids.read_tokens(out / f"seq{i}" / "tokens.json")
        assert got_prompt == prompt and len(response) == 3
        rec = [json.loads(line) for line in (out / f"seq{i}" / "rollout_logprobs.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rec] == [f"seq{i}"] and rec[0]["token_ids"] == response
    every = [json.loads(line) for line in (out / "rollout_logprobs.jsonl").read_text().splitlines()]
    assert [r["id"] for r in every] == ["seq0", "seq1", "seq2"]

    doc = json.loads((out / "sequences.json").read_text())
    assert doc["rollout"] == "rollout" and doc["per_call"] is per_call and doc["sequences"] == seqs
    steps = [s["steps"] for s in seqs]
    assert steps == ([[0, 1, 2], [3, 4, 5], [6, 7, 8]] if per_call else [[0], [1], [2]])
    assert [(s["prompt_tokens"], s["response_tokens"]) for s in seqs] == [(2, 3), (3, 3), (1, 3)]


def test_one_prompt_keeps_the_single_sequence_layout(tmp_path, fake_vllm):
    args = _args(tmp_path, [5, 6])
    llm = FakeEngine()
    response, rec = dump_vllm.dump(llm, args, dump_vllm.check(args)[0])
    out = tmp_path / "out"
    assert token_ids.read_tokens(out / "tokens.json") == ([5, 6], response)
    assert rec["id"] == "seq0" and not (out / "sequences.json").exists() and not (out / "seq0").exists()


def test_an_earlier_sequence_folder_is_not_overwritten(tmp_path):
    args = _args(tmp_path, [[5], [6]])
    (tmp_path / "out" / "seq1").mkdir(parents=True)
    (tmp_path / "out" / "seq1" / "tokens.json").write_text("{}")
    with pytest.raises(dump_vllm.cli.InputError, match="seq1"):
        dump_vllm.check(args)


def test_step_ranges():
    assert dump_vllm.step_ranges([1, 1]) == [[0], [1]]
    assert dump_vllm.step_ranges([2, 0, 3]) == [[0, 1], [], [2, 3, 4]]
