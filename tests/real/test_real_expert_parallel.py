"""Expert-parallel rollout ranks on real dumps (tests/data/real/qwen3_moe_ep2_*, written by
tools/real_dumps/cases_ep.py): Qwen3-MoE whose vLLM-shaped rollout holds 2 of the 4 experts on each
of its 2 ranks. As in real vLLM 0.32, the experts are a ``MoERunner`` whose weights sit in its
never-called ``routed_experts`` (no dump entry holds them) and whose output is already reduced over
the ranks, so the dumps show expert parallelism only through the activations: the default command
finds nothing on the clean pair; on the faulty one (rank 1's stale expert) it finds the drift only
downstream, and with --model and the token ids the stale weight at layer 0's experts module.
(Merging the ranks' stacked expert weights on the experts dim, references/tensor_parallel.md
"Expert parallelism", has no real-vLLM dump to act on since these cases follow vLLM 0.32; it is
tested on synthetic dumps.)"""
from __future__ import annotations

import json
import shutil

import pytest
from real.corpus_check import CLEAN_VERDICTS, CORPUS, case_doc, default_expected, disagreements, run_pair


def _run(name, tmp_path):
    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0 and doc is not None, err
    sources = json.loads((tmp_path / "output_1_key_mapping.json").read_text(encoding="utf-8"))["sources"]
    return doc, sources


def test_clean_expert_parallel_pair_finds_nothing(tmp_path):
    doc, sources = _run("qwen3_moe_ep2_bf16_clean", tmp_path)
    assert doc["verdict"] in CLEAN_VERDICTS and not doc["root_causes"]
    assert sources["rollout"]["ranks"] == ["0", "1"]


def test_clean_expert_parallel_pair_matches_the_checkpoint_forward(tmp_path):
    """With --model and the ids, both sides match the checkpoint's forward everywhere: no departure,
    so nothing is carried back to the experts whose weight the rollout hides."""
    name = "qwen3_moe_ep2_bf16_clean"
    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path, "--model",
                              CORPUS / "_models" / "qwen3_moe", "--token-ids", CORPUS / name / "tokens.json")
    assert code == 0 and doc is not None, err
    assert doc["verdict"] in CLEAN_VERDICTS and not doc["root_causes"] and not doc["other_candidates"]
    assert doc["reference_forward"]["ran"] is True


def test_stale_expert_on_one_rank_is_found_at_the_experts_module(tmp_path):
    """In bf16 statistics the stale expert moves layer 0's experts output within the tolerance (Norm
    3.25 against 3.203, Max/Min equal) and the MoERunner shows no expert weight, so without the
    checkpoint the dumps show the drift only from layer 1 on, carried in: inconclusive, never an
    all-clear. With --model and the ids both engines ran (tokens.json), the rollout leaves the
    checkpoint's forward at layer 1 through modules whose weights all match it, and the one module
    upstream whose weight the dump does not show is layer 0's experts, whose output the rollout
    already holds further from the reference than the train side: the expected weight finding there,
    charged to the rollout (the side the fault is on)."""
    name = "qwen3_moe_ep2_bf16_stale_expert_rollout"
    case = case_doc(name)
    assert case["fault"]["rank"] == 1
    doc, _sources = _run(name, tmp_path / "default")
    assert disagreements(default_expected(case), 0, "", doc) == []
    assert doc["verdict"] == "inconclusive" and doc["first_divergence"]["layer"] == 1
    # where the evidence points without the checkpoint: upstream of layer 1, and how to look there
    carried = [n for n in doc["notes"] if n.startswith("the first divergence (L1.k, layer 1) is carried in")]
    assert carried and "--model" in carried[0] and "--token-ids" in carried[0]

    code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path / "model", "--model",
                              CORPUS / "_models" / case["family"], "--token-ids", CORPUS / name / "tokens.json")
    assert code == 0 and doc is not None, err
    assert disagreements(case["expected"], code, err, doc) == []
    rc = doc["root_causes"][0]
    assert (rc["side"], rc["rules_fired"][0]) == (case["fault"]["side"], "reference_carried_from_unseen_weight")
    assert rc["evidence"]["carried_through"]["rollout_module"] == "model.layers.1.self_attn.qkv_proj"
    errors = rc["evidence"]["output_errors"]["L0.experts_out"]
    assert errors["rollout"] > errors["train"]
    # the reader is told the module was reached by elimination, and from where
    assert any(n.startswith("found by elimination") and "model.layers.1.self_attn.qkv_proj" in n
               for n in rc["confidence_notes"])


def _with_model_outputs(tmp_path_factory):
    name = "qwen3_moe_ep2_bf16_stale_expert_rollout"
    out = tmp_path_factory.mktemp("ep2_model")
    code, err, _doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", out, "--model",
                               CORPUS / "_models" / "qwen3_moe", "--token-ids", CORPUS / name / "tokens.json")
    assert code == 0, err
    return out


def _rerun_with(out, tmp_path, edit):
    """The root-cause step alone on a copy of ``out`` whose output_3 ``edit`` changed."""
    copy = tmp_path / "edited"
    shutil.copytree(out, copy)
    path = copy / "output_3_value_compare.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, err, got = run_pair(CORPUS / "x" / "train", CORPUS / "x" / "rollout", copy, "--reuse-outputs")
    assert code == 0 and got is not None, err
    return got


@pytest.mark.parametrize("edit", ["none", "rollout_not_further", "second_unseen_weight"])
def test_a_departure_is_not_carried_back_where_the_evidence_does_not_single_out_one_module(
        edit, tmp_path, tmp_path_factory):
    """Where the rollout holds layer 0's experts output no further from the reference than the train
    side does, or a second module upstream (layer 0's o_proj) hides its weight too, nothing singles
    out one hidden weight: the departure stays what it was (no weight finding at the experts). The
    outputs left as they are ("none") give that finding, so the edits are what removes it."""
    out = _with_model_outputs(tmp_path_factory)

    def change(doc):
        points = doc["reference_forward"]["points"]
        by_point = {r["point"]: r["cid"] for r in doc["results"] if r.get("pair") is None}
        if edit == "none":
            return
        if edit == "rollout_not_further":
            rec = points[by_point["L0.experts_out"]]
            rec["rollout"]["error"] = rec["train"]["error"]
        else:
            o_proj = next(r for r in doc["results"] if r["point"] == "L0.o.weight")
            o_proj["reference"]["rollout"]["matches_reference"] = None
    got = _rerun_with(out, tmp_path, change)
    carried = [f for f in got["root_causes"] + got["other_candidates"]
               if "reference_carried_from_unseen_weight" in f["rules_fired"]]
    assert bool(carried) == (edit == "none")
    assert got["verdict"] == ("root_cause_found" if edit == "none" else "inconclusive")


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
