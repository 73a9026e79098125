"""A rollout dumped as a prefill call plus decode calls is stitched along the tokens."""
import json

import pytest

from rootcause.cli import main as rootcause_main
from synth import Config, faults as F, init_weights, run_side, write_dump
from synth.decode import split_prefill_decode

CFG = Config(layers=3, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=8)
PREFILL = 5


def _run(tmp_path, task, rollout_faults=(), train_cfg=CFG):
    w = init_weights(CFG)
    write_dump(tmp_path / "train", run_side(train_cfg, "hf", (), grad=True, weights=init_weights(train_cfg)),
               task=task)
    full = run_side(CFG, "vllm", rollout_faults, weights=w)
    write_dump(tmp_path / "rollout", split_prefill_decode(full, CFG.seq_len, PREFILL), task=task)
    out = tmp_path / "out"
    assert rootcause_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                           "--out-dir", str(out), "--quiet"]) == 0
    return {n: json.loads((out / f"output_{n}.json").read_text())
            for n in ("2_mapping", "3_value_compare", "5_root_cause_report")}


def _result(docs, point):
    return next(r for r in docs["3_value_compare"]["results"] if r["point"] == point and r["pair"] is None)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_prefill_and_decode_calls_match_one_full_forward(tmp_path, task):
    docs = _run(tmp_path, task)
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"
    r = _result(docs, "L1.q+L1.k+L1.v")
    # every call is read: one record per call, or (statistics) the prefill and a folded run of the decode calls
    calls = r["rollout"].get("calls") or [1] * len(r["rollout"]["keys"])
    assert r["status"] == "match" and sum(calls) == 1 + CFG.seq_len - PREFILL
    assert any("stitched along the tokens" in n for n in r["notes"])
    later = [o for o in docs["2_mapping"]["one_sided"] if o["side"] == "rollout" and ".forward.1" in o["key"]]
    assert later and all(o["expected"] for o in later)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_fault_is_found_through_stitched_calls(tmp_path, task):
    docs = _run(tmp_path, task, rollout_faults=(F.CorruptWeight("rollout", "down", 1),))
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["rollout_module"], rc["layer"]) == (
        "parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj", 1)


def test_train_on_the_prompt_only_is_compared_with_the_prefill(tmp_path):
    from dataclasses import replace
    docs = _run(tmp_path, "statistics", train_cfg=replace(CFG, seq_len=PREFILL))
    r = _result(docs, "L1.attn_norm_out")
    assert r["status"] == "match" and any("first call" in n for n in r["notes"])


def _write_steps(root, entries, task):
    """Each call in its own step folder as call 0, as msprobe writes one step per execute_model."""
    by_call = {}
    for e in entries:
        n = int(e.key.rsplit(".", 1)[1])
        e.key = e.key.rsplit(".", 1)[0] + ".0"
        e.parent = e.parent.rsplit(".", 1)[0] + ".0" if e.parent else None
        by_call.setdefault(n, []).append(e)
    for n, es in by_call.items():
        write_dump(root / f"step{n}" / "rank0", es, task=task)


def _run_steps(tmp_path, task, rollout_faults=(), extra=(), fed=CFG.seq_len):
    """``fed``: tokens the engine was fed (one less than the trainer's when the last sampled token
    is never fed back)."""
    w = init_weights(CFG)
    write_dump(tmp_path / "train", run_side(CFG, "hf", (), grad=True, weights=w), task=task)
    full = run_side(CFG, "vllm", rollout_faults, weights=w)
    calls = split_prefill_decode(full, CFG.seq_len, PREFILL)
    last = fed - PREFILL        # the last call the engine made
    _write_steps(tmp_path / "rollout", [e for e in calls if int(e.key.rsplit(".", 1)[1]) <= last], task)
    out = tmp_path / "out"
    assert rootcause_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                           "--out-dir", str(out), "--quiet", *extra]) == 0
    return {n: json.loads((out / f"output_{n}.json").read_text())
            for n in ("1_key_mapping", "2_mapping", "3_value_compare", "5_root_cause_report")}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_decode_steps_in_their_own_step_folders_are_joined(tmp_path, task):
    docs = _run_steps(tmp_path, task)
    notes = docs["1_key_mapping"]["sources"]["rollout"]["notes"]
    steps = [str(n) for n in range(1 + CFG.seq_len - PREFILL)]
    assert any(n.startswith(f"rollout steps {', '.join(steps)} joined") for n in notes)
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"
    r = _result(docs, "L1.q+L1.k+L1.v")
    assert r["status"] == "match" and len(r["rollout"]["keys"]) == len(steps)


def test_a_fault_is_found_through_joined_decode_steps(tmp_path):
    docs = _run_steps(tmp_path, "statistics", rollout_faults=(F.CorruptWeight("rollout", "down", 1),))
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["rollout_module"]) == ("parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj")


def test_a_step_range_can_be_pinned(tmp_path):
    last = CFG.seq_len - PREFILL
    docs = _run_steps(tmp_path, "statistics", extra=("--rollout-step", f"0-{last}"))
    notes = docs["1_key_mapping"]["sources"]["rollout"]["notes"]
    assert any(n.startswith("steps 0, 1") and "joined as calls" in n for n in notes)
    assert docs["5_root_cause_report"]["verdict"] == "no_credible_divergence"


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_generation_without_the_last_sampled_token_is_joined(tmp_path, task):
    # The trainer scores all 8 tokens; the engine fed 7 (the 8th was sampled, never fed back).
    docs = _run_steps(tmp_path, task, rollout_faults=(F.CorruptWeight("rollout", "down", 1),), fed=CFG.seq_len - 1)
    plan = docs["1_key_mapping"]["sources"]["input_plan"]
    assert [s["step"] for s in plan["sides"]["rollout"]["steps"]] == [str(n) for n in range(CFG.seq_len - PREFILL)]
    assert (plan["tokens"]["how"], plan["tokens"]["verified"]) == ("count/max/min, last token not fed", False)
    rc = docs["5_root_cause_report"]["root_causes"][0]
    assert (rc["category"], rc["rollout_module"]) == ("parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj")
    r = _result(docs, "L0.attn_norm_out")
    if task == "tensor":
        assert r["status"] == "match" and any("last token" in n for n in r["notes"])
    else:
        # Statistics over 8 and 7 tokens only bound each other: consistent, not verified.
        assert r["status"] == "bounded" and "one token more" in r["reason"]
        assert r["bounds"]["broken"] is None and "max" in r["bounds"]["checked"]
