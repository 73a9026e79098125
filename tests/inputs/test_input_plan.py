"""The input plan is decided from facts about the files, without loading a dump; pipeline stages
and tensor-parallel ranks are told apart by their content."""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from dumpcompare.cli import main as compare_main
from dumpcompare.errors import InputError
from dumpcompare.loaders.inputs import Found, Tokens, plan_inputs
from dumpcompare.unshard import rank_relation
from synth import Config, init_weights, parse_fault, run_side, write_dump

ARGS = {"train": "T", "rollout": "R"}
NONE = {"train": None, "rollout": None}
PROMPT = Tokens(8, 60.0, 2.0, 0)


def _f(side, step, rank, tokens):
    return Found(Path(f"/{side}/step{step}/rank{rank}/dump.json"), None if step is None else str(step),
                 None if rank is None else str(rank), tokens)


def _plan(train, rollout, pins=NONE, ranks=NONE):
    return plan_inputs(ARGS, pins, ranks, {"train": tuple(train), "rollout": tuple(rollout)})


def test_tp_ranks_of_one_step_are_kept_together():
    plan = _plan([_f("t", None, None, PROMPT)], [_f("r", 0, 0, PROMPT), _f("r", 0, 1, PROMPT)])
    assert [f.rank for f in plan.rollout.steps[0].files] == ["0", "1"]
    assert plan.rollout.rank_reason == "2 ranks of one step, merged by their content"
    assert (plan.tokens.how, plan.tokens.verified) == ("count/max/min", False)


def test_a_generation_one_token_short_is_joined_and_marked_unverified():
    # The trainer scores prompt + 3 response tokens; the engine fed the prompt, then 2 decode tokens
    # (the last sampled token is returned, never fed back).
    train = [_f("t", 0, 0, Tokens(11, 61.0, 2.0, 0))]
    rollout = [_f("r", 0, 0, PROMPT), _f("r", 1, 0, Tokens(1, 61.0, 61.0, 8)),
               _f("r", 2, 0, Tokens(1, 5.0, 5.0, 9)), _f("r", 3, 0, Tokens(4, 9.0, 3.0, 0))]
    plan = _plan(train, rollout)
    assert [s.step for s in plan.rollout.steps] == ["0", "1", "2"]
    assert "last sampled token" in plan.rollout.step_reason
    assert plan.tokens == plan.tokens.__class__("count/max/min, last token not fed", False,
                                                plan.tokens.train, plan.tokens.rollout)


def test_an_exact_generation_wins_over_the_one_token_short_run():
    train = [_f("t", 0, 0, Tokens(10, 61.0, 2.0, 0))]
    rollout = [_f("r", 0, 0, PROMPT), _f("r", 1, 0, Tokens(1, 61.0, 61.0, 8)), _f("r", 2, 0, Tokens(1, 5.0, 5.0, 9))]
    assert [s.step for s in _plan(train, rollout).rollout.steps] == ["0", "1", "2"]


def test_equal_md5_of_the_ids_verifies_the_tokens():
    t = replace(PROMPT, digest="ab12")
    plan = _plan([_f("t", None, None, t)], [_f("r", None, None, t)])
    assert (plan.tokens.how, plan.tokens.verified) == ("md5", True)


def test_data_parallel_ranks_keep_the_one_that_saw_the_other_sides_tokens():
    other = Tokens(8, 40.0, 1.0, 0)
    plan = _plan([_f("t", 0, 0, other), _f("t", 0, 1, PROMPT)], [_f("r", None, None, PROMPT)])
    assert [f.rank for f in plan.train.steps[0].files] == ["1"]
    assert "data parallel" in plan.train.notes[0]


def test_data_parallel_ranks_without_a_match_are_refused_with_what_was_found():
    with pytest.raises(InputError, match=r"saw different tokens.*rank 0.*rank 1.*--train-rank"):
        _plan([_f("t", 0, 0, Tokens(8, 40.0, 1.0)), _f("t", 0, 1, Tokens(5, 9.0, 1.0))],
              [_f("r", None, None, PROMPT)])


def test_a_pinned_range_is_a_chain_and_a_missing_step_is_named():
    rollout = [_f("r", k, 0, PROMPT) for k in range(4)]
    plan = _plan([_f("t", None, None, PROMPT)], rollout, pins={"train": None, "rollout": "1-2"})
    assert [s.step for s in plan.rollout.steps] == ["1", "2"]
    with pytest.raises(InputError, match="no dump.json matches --rollout-step '7'"):
        _plan([_f("t", None, None, PROMPT)], rollout, pins={"train": None, "rollout": "7"})


def test_plan_is_plain_json():
    plan = _plan([_f("t", None, None, PROMPT)], [_f("r", 0, 0, PROMPT), _f("r", 0, 1, PROMPT)])
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["sides"]["rollout"]["steps"][0]["files"][1] == {"rank": "1", "path": "/r/step0/rank1/dump.json"}


def test_rank_relation_tells_tensor_parallel_from_pipeline_stages():
    a, b = frozenset({"emb", "layers.0.x", "layers.1.x"}), frozenset({"layers.0.x", "layers.1.x", "head"})
    assert rank_relation([a, a], [{0, 1}, {0, 1}], [True, True], "X").kind == "tensor_parallel"
    pp = rank_relation([a, b], [{0, 1}, {0, 1}], [True, False], "X")
    assert (pp.kind, pp.stages, pp.offsets) == ("pipeline", ((0,), (1,)), (0, 2))
    ptp = rank_relation([a, a, b, b], [{0, 1}] * 4, [True, True, False, False], "X")
    assert (ptp.kind, ptp.stages, ptp.offsets) == ("pipeline+tensor_parallel", ((0, 1), (2, 3)), (0, 2))
    glob = rank_relation([a, b], [{0, 1}, {2, 3}], [True, False], "X")
    assert glob.offsets == (0, 0)          # stages already numbered globally
    with pytest.raises(InputError, match="not pipeline stages"):
        rank_relation([a, b], [{0, 1}, {0, 1}], [False, True], "X")
    with pytest.raises(InputError, match="not pipeline stages"):      # each fed the tokens: two whole models
        rank_relation([a, b], [{0, 1}, {0, 1}], [True, True], "X")
    with pytest.raises(InputError, match="not pipeline stages"):      # a rank with no layers (L1 dump)
        rank_relation([a, frozenset()], [{0, 1}, set()], [True, False], "X")


CFG = Config(layers=4, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64)
_LAYER = re.compile(r"layers\.(\d+)\.")


def _stage(entries, keep, shift):
    out = []
    for e in entries:
        m = _LAYER.search(e.key)
        if not keep(e.key, int(m.group(1)) if m else None):
            continue
        if m and shift:
            e = replace(e, key=e.key.replace(m.group(0), f"layers.{int(m.group(1)) - shift}.", 1))
        out.append(e)
    return out


def test_megatron_pipeline_stages_numbered_from_zero_are_joined(tmp_path):
    w = init_weights(CFG)
    train = run_side(CFG, "megatron", (), weights=w)
    write_dump(tmp_path / "train" / "step0" / "rank0",
               _stage(train, lambda k, n: n in (0, 1) or "embedding" in k or "rotary" in k, 0))
    write_dump(tmp_path / "train" / "step0" / "rank1",
               _stage(train, lambda k, n: n in (2, 3) or "final_layernorm" in k or "output_layer" in k or "rotary" in k, 2))
    write_dump(tmp_path / "rollout" / "step0" / "rank0",
               run_side(CFG, "vllm", (parse_fault("corrupt:rollout:down:3:0.5"),), weights=w))
    out = tmp_path / "out"
    assert compare_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                         "--out-dir", str(out), "--quiet"]) == 0
    src = json.loads((out / "output_1_key_mapping.json").read_text())["sources"]["train"]
    assert src["rank_layout"] == {"kind": "pipeline", "stages": [[0], [1]], "layer_offsets": [0, 2]}
    first = json.loads((out / "output_4_module_analysis.json").read_text())["first_divergence"]
    assert first["train_modules"] == ["decoder.layers.3.mlp.linear_fc2"]
