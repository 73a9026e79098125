"""Expert-parallel rollout ranks on real dumps (tests/data/real/qwen3_moe_ep2_*, written by
tools/real_dumps/cases_ep.py): Qwen3-MoE whose vLLM-shaped rollout holds 2 of the 4 experts on each
of its 2 ranks. The default command merges the ranks' stacked experts on the experts dim (the
rule of references/tensor_parallel.md, "Expert parallelism") and then finds nothing on the clean
pair and the stale expert of rank 1 on the faulty one."""
from __future__ import annotations

import json

import pytest
from real.corpus_check import CLEAN_VERDICTS, CORPUS, case_doc, run_pair

# Qwen3-MoE of the corpus (tools/real_dumps/families.py): 4 experts, hidden 64, moe_intermediate 32.
E, H, I = 4, 64, 32


def _run(name, tmp_path):
    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0 and doc is not None, err
    values = json.loads((tmp_path / "output_3_value_compare.json").read_text(encoding="utf-8"))
    sources = json.loads((tmp_path / "output_1_key_mapping.json").read_text(encoding="utf-8"))["sources"]
    return doc, values, sources


def _expert_rows(values, layer):
    """Rollout leaf -> result row of layer ``layer``'s stacked expert parameters."""
    return {r["rollout"]["leaves"][0]: r for r in values["results"]
            if r["rollout"] and r["rollout"]["modules"] == [f"model.layers.{layer}.mlp.experts"]
            and r["rollout"]["leaves"][0].startswith("parameters.")}


def test_clean_expert_parallel_pair_merges_whole_experts_and_finds_nothing(tmp_path):
    doc, values, sources = _run("qwen3_moe_ep2_bf16_clean", tmp_path)
    assert doc["verdict"] in CLEAN_VERDICTS and not doc["root_causes"]
    assert sources["rollout"]["ranks"] == ["0", "1"]
    # 2 layers x (w13, w2): the 4 stacked-expert parameters, and nothing else, merged as experts
    assert any("4 expert_parallel" in n and "stacked experts concatenated on dim 0" in n
               for n in sources["rollout"]["notes"])
    for layer in (0, 1):
        rows = _expert_rows(values, layer)
        assert rows["parameters.w13_weight"]["rollout"]["shapes"] == [[E, 2 * I, H]]
        assert rows["parameters.w2_weight"]["rollout"]["shapes"] == [[E, H, I]]
        for r in rows.values():
            assert r["rollout"]["merges"] == ["concat:0"] and r["status"] == "match"
            assert r["train"]["shapes"] == r["rollout"]["shapes"]


def test_stale_expert_on_one_rank_is_found_at_the_experts_module(tmp_path):
    name = "qwen3_moe_ep2_bf16_stale_expert_rollout"
    assert case_doc(name)["fault"]["rank"] == 1
    doc, values, _sources = _run(name, tmp_path)
    rc = doc["root_causes"][0]
    assert doc["verdict"] == "root_cause_found"
    assert rc["category"] == "parameter_or_checkpoint_issue"
    assert rc["rollout_module"] == "model.layers.0.mlp.experts" and rc["layer"] == 0
    # The stale expert is rank 1's; its gate/up weights differ, its down weights and the other
    # layer's experts do not.
    rows = _expert_rows(values, 0)
    assert rows["parameters.w13_weight"]["rollout"]["shapes"] == [[E, 2 * I, H]]
    assert rows["parameters.w13_weight"]["status"] != "match"
    assert rows["parameters.w2_weight"]["status"] == "match"
    assert all(r["status"] == "match" for r in _expert_rows(values, 1).values())


@pytest.mark.parametrize("name", ["qwen3_moe_ep2_bf16_clean", "qwen3_moe_ep2_bf16_stale_expert_rollout"])
def test_each_rank_holds_half_the_experts_whole(name):
    # What makes the pair expert-parallel rather than tensor-parallel: dim 0 split, not dim 1/2.
    for rank in (0, 1):
        data = json.loads((CORPUS / name / "rollout" / "step0" / f"rank{rank}" / "dump.json")
                          .read_text(encoding="utf-8"))["data"]
        entry = data["Module.model.layers.0.mlp.experts.FusedMoE.forward.0"]
        assert entry["parameters"]["w13_weight"]["shape"] == [E // 2, 2 * I, H]
        assert entry["parameters"]["w2_weight"]["shape"] == [E // 2, H, I]
