"""Acceptance: the two real msprobe sample pairs whose root cause is known."""
import pytest

from compare.test_compare_support import SAMPLES, run_cli

LLAMA = SAMPLES / "llama_L0_statistics"
LLAMA_BAD = SAMPLES / "llama_L0_statistics_perturbed"
CC = SAMPLES / "consistent_check_fsdp_vs_vllm_synthetic"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return run_cli(LLAMA, LLAMA_BAD, tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def cc_bug(tmp_path_factory):
    return run_cli(CC / "train", CC / "rollout_bug", tmp_path_factory.mktemp("cc_bug"))


def test_llama_perturbed_down_proj_is_the_only_rank1_and_first_divergence(llama):
    fd = llama.first
    assert fd["train_modules"] == ["model.layers.1.mlp.down_proj"]
    assert fd["rollout_modules"] == ["model.layers.1.mlp.down_proj"]
    assert (fd["status"], fd["layer"], fd["point"]) == ("parameter_mismatch", 1, "L1.down.weight")
    top = llama.ranked(best=2)
    assert [m["train_modules"] for m in top] == [["model.layers.1.mlp.down_proj"]]
    v = top[0]
    assert (v["status"], v["module_priority_rank"]) == ("parameter_mismatch", 1)
    assert v["input_status"] == "match" and v["parameter_status"] == "mismatch"
    assert v["output_status"] == "mismatch"


def test_llama_everything_before_the_fault_is_clean_and_after_is_propagated(llama):
    fault = llama.verdict(["model.layers.1.mlp.down_proj"])
    for m in llama.d4["modules"]:
        if m["train_order"] < fault["train_order"]:
            assert m["status"] == "clean", m["pid"]
        elif m is not fault and m["output_status"] == "mismatch":
            assert m["status"] == "propagated" and m["module_priority_rank"] == 3, m["pid"]


def test_llama_same_engine_maps_one_to_one_and_keeps_backward_apart(llama):
    s = llama.summary
    assert s["train_modules"] == s["rollout_modules"] == s["mapped_train_modules"] == 31
    assert s["pairs_by_kind"] == {"one_to_one": 31}
    assert s["backward_entries"]["train"] > 0 and s["parameters_grad_entries"]["train"] > 0
    keys = [leaf["key"] for comp in llama.d2["comparisons"] for side in ("train", "rollout")
            for leaf in comp[side]]
    assert keys and all(".forward." in k for k in keys)
    assert llama.d1["sources"]["train"]["family"] == "hf"
    comp = dict(llama.d4["comparability"])
    assert comp.pop("activations")["compared"] > 0
    assert comp.pop("codes") == []
    assert comp == {"comparable": True, "reasons": [], "tokens": {"how": "count/max/min", "verified": False}}


def test_consistent_check_rollout_bug_is_the_layer1_gate_up_composite(cc_bug):
    fd = cc_bug.first
    gate_up = ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
    assert fd["train_modules"] == gate_up
    assert fd["rollout_modules"] == ["model.layers.1.mlp.gate_up_proj"]
    assert fd["status"] == "parameter_mismatch"
    top = cc_bug.ranked(best=2)
    assert len(top) == 1
    v = top[0]
    assert (v["kind"], v["train_modules"], v["status"], v["module_priority_rank"]) == \
        ("composite", gate_up, "parameter_mismatch", 1)
    assert cc_bug.result("L1.gate.weight+L1.up.weight")["status"] == "mismatch"
    assert cc_bug.result("L1.q.weight+L1.k.weight+L1.v.weight")["status"] == "match"


def test_consistent_check_fsdp_names_are_normalised_and_wrappers_expected(cc_bug):
    train = cc_bug.d1["train"]
    assert any("_fsdp_wrapped_module" in r["raw_path"] for r in train)
    assert not any("_fsdp_wrapped_module" in r["path"] for r in train)
    assert cc_bug.d1["sources"]["rollout"]["family"] == "vllm"
    kinds = cc_bug.summary["pairs_by_kind"]
    assert kinds["composite"] == 4                      # qkv and gate_up in each of 2 layers
    wrappers = [o for o in cc_bug.d2["one_sided"] if o["role"] == "wrapper"]
    assert wrappers and all(o["expected"] for o in wrappers)
    # The demo's rollout model has no logits module: train lm_head is listed with its reason.
    head = cc_bug.one_sided("train", "lm_head")
    assert head["expected"] is False and "lm_head" in head["reason"]


def test_consistent_check_missing_tensor_files_degrade_to_statistics(cc_bug):
    assert cc_bug.d1["sources"]["train"]["task"] == "tensor"
    assert cc_bug.d3["mode"] == "statistics"
    r = cc_bug.results("L0.resid_in")[0]
    assert any(n.startswith("tensor unavailable, statistics used instead") for n in r["notes"])


def test_consistent_check_clean_rollout_has_no_divergence(tmp_path):
    out = run_cli(CC / "train" / "step0" / "proc0" / "dump.json",
                  CC / "rollout" / "step0" / "proc0" / "dump.json", tmp_path)
    assert out.first["pair"] is None and out.first["point"] is None
    assert out.d4["summary"]["by_status"] == {"clean": len(out.d4["modules"])}
