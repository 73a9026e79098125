"""Mixture-of-experts routing replayed from real tensor-mode Qwen3-MoE dumps (issue 11 rule 9,
issue 12 items 2-3).

tests/data/real/qwen3_moe_tensor_* (tools/real_dumps/cases_moe.py): transformers 5.x Qwen3-MoE
(router returning logits, top-k weights and ids; stacked experts) against the vLLM-shaped rollout
(``mlp.gate`` GateLinear logits, the MoERunner at ``mlp.experts`` choosing the top-k itself, as
vLLM 0.32 builds it: the runner holds no parameters and is called with ``router_logits`` = the
hidden states), bf16, with ``norm_topk_prob`` flipped
on one side, or the train side's stacked experts stale. The checkpoint is the corpus's own.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from dumpcompare import tensorio
from dumpcompare.replay.routing import compare, route
from refcheck.realcases import COMPARE, CORPUS, ROOTCAUSE, case, references, report, run

CONFIG = json.loads((CORPUS / "_models" / "qwen3_moe" / "config.json").read_text())
CLEAN = "qwen3_moe_tensor_bf16_clean"
NORM_FAULTS = ("qwen3_moe_tensor_norm_topk_rollout", "qwen3_moe_tensor_norm_topk_train")

# Since tests/data/real/ follows vLLM 0.32's MoE tree (tools/real_dumps/README.md), the rollout's
# MoERunner holds no expert weight and is called with the hidden states as router_logits; its routing
# is replayed from the GateLinear's logits, its input and output and the checkpoint's experts
# (--model: routing records with expert_weights "checkpoint"), or without --model the train dump's
# stacked experts (expert_weights "train").


def _train_router(name, layer, leaf):
    folder = CORPUS / name / "train" / "step0" / "proc0" / "dump_tensor_data"
    return tensorio.load_tensor(folder / f"Module.model.layers.{layer}.mlp.gate.Qwen3MoeTopKRouter.forward.0.{leaf}.pt")


def _routing(out, op):
    doc = json.loads((out / "output_3_value_compare.json").read_text())
    return [r for r in doc["replays"] if r["op"] == op]


@pytest.mark.parametrize("layer", [0, 1])
def test_route_reproduces_the_transformers_router(layer):
    """softmax, top-2, renormalised as config.json says: the router's own dumped ids and weights."""
    logits = _train_router(CLEAN, layer, "output.0").astype(np.float64)
    idx, w = route(logits, CONFIG)
    assert np.array_equal(idx, _train_router(CLEAN, layer, "output.2"))
    dumped = _train_router(CLEAN, layer, "output.1")
    assert np.max(np.abs(w - dumped)) <= 2.0 ** -8          # the dump rounded the weights to bf16
    _, raw = route(logits, {**CONFIG, "norm_topk_prob": False})
    assert np.max(np.abs(raw - dumped)) > 0.1              # renormalising is visible


def test_route_sigmoid_with_correction_bias_chooses_by_biased_score():
    """DeepSeek style: the bias moves the choice, the weights are the unbiased sigmoid scores."""
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    cfg = {"num_experts_per_tok": 2, "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5}
    idx, w = route(logits, cfg, bias=np.array([0.0, 0.0, 0.0, 1.0]))
    assert idx.tolist() == [[3, 0]]
    s = 1 / (1 + np.exp(-np.array([-1.0, 2.0])))
    assert np.allclose(w, 2.5 * s / s.sum())
    small = np.array([0.0, 0.0, 0.0, 0.5])
    assert route(logits, cfg, bias=small)[0].tolist() == [[0, 3]]
    # group-limited: groups {0, 1} (0.88 + 0.73) and {2, 3} (0.5 + 0.77); only the best group is kept
    assert route(logits, {**cfg, "n_group": 2, "topk_group": 1}, bias=small)[0].tolist() == [[0, 1]]


def test_compare_tells_a_near_tie_flip_from_a_systematic_choice():
    """The real router logits of layer 1 with token 3's 3rd expert moved to 0.002 below its 2nd on
    the train side: 0.002 above it on the other side is a flip (bf16 rounding of a tie); far above
    it, the logits themselves differ (upstream of routing); the same logits routed with a bias
    are systematic."""
    lt = _train_router(CLEAN, 1, "output.0").astype(np.float64)
    order = np.argsort(-lt, axis=-1)
    a, b = order[3, 1], order[3, 2]
    lt[3, b] = lt[3, a] - 0.002
    near, far = lt.copy(), lt.copy()
    near[3, b] = lt[3, a] + 0.002
    far[3, b] = lt[3, a] + 2.0
    train = route(lt, CONFIG)
    biased = np.zeros(lt.shape[1])
    biased[order[3, 3]] = 1.0                              # the 4th choice of token 3 pulled to the top
    for other, routed, verdict, flips in ((near, route(near, CONFIG), "flips_only", 1),
                                          (far, route(far, CONFIG), "logits_differ", 0),
                                          (lt, route(lt, {**CONFIG, "scoring_func": "sigmoid"}, biased),
                                           "systematic", 0)):
        rec = compare(train, routed, lt, other, "bfloat16", 0.015)
        assert (rec["verdict"], rec["flips"], rec["tokens"]) == (verdict, flips, len(lt))
        assert rec["set_differs"] >= 1


def test_clean_bf16_pair_routes_the_same_and_is_precision_only(tmp_path):
    """No token of the 16 flips in either layer (the nearest tie is 0.035 apart, the logits differ
    by at most 0.02); the experts outputs differ by rounding, which is not a cause."""
    proc = run(ROOTCAUSE, CLEAN, tmp_path)
    assert proc.returncode == 0, proc.stderr
    cmp = _routing(tmp_path, "routing_compare")
    assert [(r["layer"], r["tokens"], r["set_differs"], r["flips"], r["verdict"]) for r in cmp] == \
        [(0, 16, 0, 0, "same"), (1, 16, 0, 0, "same")]
    fits = _routing(tmp_path, "routing")
    assert len(fits) == 8 and all(r["reproduces_reference"] for r in fits)
    # the rollout dumps no expert weight: its fits rebuild the MoERunner's output with the checkpoint's experts
    assert {r["side"] for r in fits if r.get("expert_weights") == "checkpoint"} == {"rollout"}
    doc = report(tmp_path)
    assert doc["verdict"] == "precision_only" and doc["root_causes"] == []
    assert any("mixture-of-experts output of layer 1" in n for n in doc["notes"])


@pytest.mark.parametrize("name", NORM_FAULTS)
def test_norm_topk_prob_fault_is_charged_to_its_side(name, tmp_path):
    bad = case(name)["fault"]["side"]
    good = "train" if bad == "rollout" else "rollout"
    proc = run(ROOTCAUSE, name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    fits = {(r["side"], r["layer"], r["key"]): r for r in _routing(tmp_path, "routing")}
    for layer in (0, 1):
        wrong, right = fits[(bad, layer, "norm_topk_prob")], fits[(good, layer, "norm_topk_prob")]
        assert (wrong["reference_value"], wrong["reproduces_reference"], wrong["fitted"]["value"]) == (True, False, False)
        assert wrong["fitted"]["residual"] <= wrong["tolerance"] < 0.1 < wrong["residual_at_reference"]
        assert right["reproduces_reference"] is True and right["fitted"]["value"] is True
        assert fits[(bad, layer, "scoring_func")]["fitted"]["value"] == "softmax"
    cmp = {r["layer"]: r for r in _routing(tmp_path, "routing_compare")}
    assert cmp[0]["verdict"] == "systematic" and (cmp[0]["set_differs"], cmp[0]["tokens"]) == (0, 8)
    assert cmp[0]["differing_keys"] == [{"key": "norm_topk_prob", "train": bad != "train", "rollout": bad != "rollout"}]
    rc = report(tmp_path)["root_causes"][0]
    assert (rc["category"], rc["train_module"], rc["rollout_module"], rc["side"]) == (
        "in_module_impl_difference", "model.layers.0.mlp.experts", "model.layers.0.mlp.experts", bad)
    # With --model the reference forward's finding stands in for the triage's routing_differs: the
    # injected norm_topk_prob reproduces the faulty side at the layer where it departs.
    assert rc["rules_fired"][0] == "reference_simulated_config"
    assert any(c.startswith("norm_topk_prob = False") for c in rc["evidence"]["reproduced_by"])
    assert cmp[0]["weights_rel_error"] > 0.2
    assert "norm_topk_prob" in rc["config_keys"]
    assert any(c["check"].startswith(f"Set norm_topk_prob to True on the {bad} side") for c in rc["next_checks"])


@pytest.mark.parametrize("name", NORM_FAULTS)
def test_without_the_checkpoint_the_disagreeing_key_is_named(name, tmp_path):
    """The rollout's MoERunner holds no expert weight; without --model its output is rebuilt with the
    train dump's stacked experts, which reproduce it only under the other norm_topk_prob: the key is
    named, the side is not (no config says which value is right)."""
    bad = case(name)["fault"]["side"]
    proc = run(ROOTCAUSE, name, tmp_path, model=False)
    assert proc.returncode == 0, proc.stderr
    fits = [r for r in _routing(tmp_path, "routing") if r["side"] == "rollout"]
    assert fits and all(r["expert_weights"] == "train" and r["fitted"]["residual"] <= r["tolerance"] for r in fits)
    cmp = {r["layer"]: r for r in _routing(tmp_path, "routing_compare")}
    assert cmp[0]["verdict"] == "systematic" and cmp[0]["differing_keys"] == [
        {"key": "norm_topk_prob", "train": bad != "train", "rollout": bad != "rollout"}]
    rc = report(tmp_path)["root_causes"][0]
    assert (rc["train_module"], rc["rollout_module"]) == ("model.layers.0.mlp.experts", "model.layers.0.mlp.experts")
    assert (rc["category"], rc["side"], rc["rules_fired"][0]) == ("in_module_impl_difference", "undetermined",
                                                                   "routing_differs")
    assert "norm_topk_prob" in rc["next_checks"][0]["check"] and "Rerun with --model" in rc["next_checks"][0]["check"]


def test_stale_stacked_experts_are_charged_to_the_train_side(tmp_path):
    """transformers 5.x gate_up_proj [E, 2I, H] against the checkpoint's per-expert gate_proj and
    up_proj: the train side's differs (tensor, exact); vLLM 0.32's MoERunner dumps no expert weight,
    so the rollout has no record of its own, and its experts' output, rebuilt from its own input with
    the checkpoint's experts, matches (its reference-forward departure downstream is carried drift)."""
    proc = run(ROOTCAUSE, "qwen3_moe_tensor_stale_expert_train", tmp_path)
    assert proc.returncode == 0, proc.stderr
    refs = references(tmp_path)
    bad = refs["L0.experts.gate_up.weight"]
    assert (bad["train"]["matches_reference"], bad["train"]["how"], bad["train"]["exact"]) == (False, "tensor", True)
    assert "rollout" not in bad and bad["train"]["layout"] == "stacked per expert"
    assert len(bad["train"]["checkpoint_tensors"]) == 8    # 4 experts x (gate, up)
    for point in ("L0.experts.down.weight", "L1.experts.gate_up.weight", "L1.experts.down.weight"):
        assert {s: refs[point][s]["matches_reference"] for s in refs[point]} == {"train": True}
    fits = [r for r in _routing(tmp_path, "routing") if r["side"] == "rollout"]
    assert fits and all(r["reproduces_reference"] and r["expert_weights"] == "checkpoint" for r in fits)
    doc = report(tmp_path)
    rc = doc["root_causes"][0]
    assert (rc["category"], rc["train_module"], rc["side"]) == ("parameter_or_checkpoint_issue",
                                                                "model.layers.0.mlp.experts", "train")
    assert rc["rules_fired"][0] == "reference_weight_differs" and len(doc["root_causes"]) == 1


def test_stale_train_experts_name_no_routing_key_without_the_checkpoint(tmp_path):
    """Where the train dump's experts are the stale ones, they rebuild the rollout's layer-0 runner
    output under no routing (a weight, not a key, differs): that side is left with its top-k sets
    alone, no key is named, and the finding stays a weight at layer 0. Layer 1 (same experts on both
    sides) is rebuilt as usual."""
    proc = run(ROOTCAUSE, "qwen3_moe_tensor_stale_expert_train", tmp_path, model=False)
    assert proc.returncode == 0, proc.stderr
    fits = {(r["side"], r["layer"]) for r in _routing(tmp_path, "routing")}
    assert ("rollout", 0) not in fits and ("rollout", 1) in fits
    cmp = {r["layer"]: r for r in _routing(tmp_path, "routing_compare")}
    assert cmp[0]["weights_rel_error"] is None and cmp[0]["differing_keys"] == [] and cmp[0]["verdict"] == "same"
    rc = report(tmp_path)["root_causes"][0]
    assert (rc["category"], rc["train_module"], rc["layer"]) == ("parameter_or_checkpoint_issue",
                                                                 "model.layers.0.mlp.experts", 0)
    assert "routing_differs" not in rc["rules_fired"]


def test_expert_layouts_of_tensor_parallel_shards():
    """Rank r of 2 holds [gate_r; up_r] of every expert (not a contiguous half of [gate; up]);
    merged ranks put the shards side by side."""
    from dumpcompare.reference import expert_layouts
    rng = np.random.default_rng(0)
    gates, ups = [rng.normal(size=(4, 3)) for _ in range(2)], [rng.normal(size=(4, 3)) for _ in range(2)]
    arrays = [gates[0], ups[0], gates[1], ups[1]]          # checkpoint order: expert by expert
    shard1 = np.stack([np.concatenate([g[2:], u[2:]]) for g, u in zip(gates, ups)])
    got = dict(expert_layouts(arrays, "L0.experts.gate_up.weight", shard1.shape, []))
    assert any(np.array_equal(a, shard1) for label, a in got.items() if label == "shard 1 of 2 along dim 1")
    merged = np.stack([np.concatenate([g[:2], u[:2], g[2:], u[2:]]) for g, u in zip(gates, ups)])
    got = dict(expert_layouts(arrays, "L0.experts.gate_up.weight", merged.shape, [2]))
    assert np.array_equal(got["per-rank concatenation of 2 shards"], merged)
    assert np.array_equal(got["stacked per expert"], np.stack([np.concatenate([g, u]) for g, u in zip(gates, ups)]))


def test_a_routing_flip_is_precision_never_a_cause(tmp_path):
    """A clean bf16 pair where one of 16 tokens picks another 2nd expert in layer 0 (its 2nd and
    3rd logits tie within the engines' rounding): the experts' output differs at that token far
    past tolerance, yet the pair is set aside as a routing flip and the verdict is precision."""
    name = "qwen3_moe_tensor_bf16_flip_clean"
    for model in (True, False):
        proc = run(ROOTCAUSE, name, tmp_path / str(model), model=model)
        assert proc.returncode == 0, proc.stderr
        cmp = {r["layer"]: r for r in _routing(tmp_path / str(model), "routing_compare")}
        assert (cmp[0]["tokens"], cmp[0]["set_differs"], cmp[0]["flips"], cmp[0]["verdict"]) == (16, 1, 1, "flips_only")
        assert cmp[1]["verdict"] == "same"
        doc = report(tmp_path / str(model))
        assert doc["verdict"] == "precision_only" and doc["root_causes"] == [] and doc["other_candidates"] == []
        screened = [s for group in doc["suppressed"].values() if isinstance(group, list) for s in group
                    if s.get("rules_fired") == ["routing_flip"]]
        assert [(s["train_module"], s["rollout_module"]) for s in screened] == [
            ("model.layers.0.mlp.experts", "model.layers.0.mlp.experts")]
        assert screened[0]["reason"].startswith("routing flip: 1 of 16 tokens")
