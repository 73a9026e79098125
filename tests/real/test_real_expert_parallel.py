"""Expert-parallel rollout ranks on real dumps (tests/data/real/qwen3_moe_ep2_*, written by
tools/real_dumps/cases_ep.py): Qwen3-MoE whose vLLM-shaped rollout holds 2 of the 4 experts on each
of its 2 ranks. As in real vLLM 0.32, the experts are a ``MoERunner`` whose weights sit in its
never-called ``routed_experts`` (no dump entry holds them) and whose output is already reduced over
the ranks, so the dumps show expert parallelism only through the activations: the default command
finds nothing on the clean pair and the stale expert (rank 1's) at the experts module of layer 0 on
the faulty one, from the activations alone. (Merging the ranks' stacked expert weights on the
experts dim, references/tensor_parallel.md "Expert parallelism", has no real-vLLM dump to act on
since these cases follow vLLM 0.32; it is tested on synthetic dumps.)"""
from __future__ import annotations

import json

import pytest
from real.corpus_check import CLEAN_VERDICTS, CORPUS, case_doc, run_pair


def _run(name, tmp_path):
    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0 and doc is not None, err
    sources = json.loads((tmp_path / "output_1_key_mapping.json").read_text(encoding="utf-8"))["sources"]
    return doc, sources


def test_clean_expert_parallel_pair_finds_nothing(tmp_path):
    doc, sources = _run("qwen3_moe_ep2_bf16_clean", tmp_path)
    assert doc["verdict"] in CLEAN_VERDICTS and not doc["root_causes"]
    assert sources["rollout"]["ranks"] == ["0", "1"]


# What the pipeline says today instead (the lead removes the mark when a fix lands; strict).
_STALE_EXPERT_XFAIL = (
    "since the rollout follows vLLM 0.32 (expert weights in no entry, experts output reduced on every "
    "rank) the default command says inconclusive, first divergence L1.k at layers.1 qkv_proj: the "
    "stale expert moves layer 0's experts output within the bf16 statistics tolerance (Norm 3.25 vs "
    "3.203, Max/Min equal)")


@pytest.mark.xfail(strict=True, reason=_STALE_EXPERT_XFAIL)
def test_stale_expert_on_one_rank_is_found_at_the_experts_module(tmp_path):
    name = "qwen3_moe_ep2_bf16_stale_expert_rollout"
    assert case_doc(name)["fault"]["rank"] == 1
    doc, _sources = _run(name, tmp_path)
    rc = doc["root_causes"][0]
    assert doc["verdict"] == "root_cause_found"
    assert rc["category"] == "parameter_or_checkpoint_issue"
    assert rc["rollout_module"] == "model.layers.0.mlp.experts" and rc["layer"] == 0


@pytest.mark.parametrize("name", ["qwen3_moe_ep2_bf16_clean", "qwen3_moe_ep2_bf16_stale_expert_rollout"])
def test_expert_weights_are_in_no_entry_and_the_output_is_reduced(name):
    # vLLM 0.32: MoERunner's own parameters are none (its routed_experts is never called) and it
    # all-reduces its result, so both ranks dump the same experts output.
    outs = []
    for rank in (0, 1):
        data = json.loads((CORPUS / name / "rollout" / "step0" / f"rank{rank}" / "dump.json")
                          .read_text(encoding="utf-8"))["data"]
        entry = data["Module.model.layers.0.mlp.experts.MoERunner.forward.0"]
        assert not entry.get("parameters")
        assert set(entry["input_kwargs"]) == {"hidden_states", "router_logits"}
        assert entry["input_kwargs"]["router_logits"]["shape"] == entry["input_kwargs"]["hidden_states"]["shape"]
        outs.append({k: entry["output"][0][k] for k in ("Max", "Min", "Mean", "Norm")})
    assert outs[0] == outs[1]
