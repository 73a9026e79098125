"""Mapping by values (issue 11 rule 10) on real dumps: transformers' GPT-NeoX, a family no naming
profile describes, against the same computation under an engine-style tree with other names, a
wrapper prefix and a fused linear+GELU (tools/real_dumps/cases_values.py, renamed_like.py).

Only the decoder layers pair by name (``layers.N`` / ``blocks.N``); everything else is aligned by
the statistics it carries or, downstream of a fault, by order.
"""
from __future__ import annotations

import functools
import json
from collections import Counter

import pytest
from dumpcompare import value_align
from dumpcompare.tolerances import load_tolerances
from dumpcompare.loaders import load_input
from dumpcompare.mapping import build_plan
from dumpcompare.naming import Namer, load_profiles, name_side
from real.corpus_check import CORPUS, case_doc, disagreements, run_default_command, run_pair

CLEAN = ["neox_renamed_fp32_clean", "neox_renamed_bf16_clean"]
FAULTS = ["neox_renamed_fp32_stale_fc_out", "neox_renamed_bf16_stale_fc_out", "neox_renamed_fp32_stale_dense_train"]
MAPPING = "output_2_mapping.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("values")
    return root, run_default_command(CLEAN + FAULTS, root)


def _mapping(runs, name):
    return json.loads((runs[0] / name / MAPPING).read_text(encoding="utf-8"))


def _pair(doc, train_module):
    return next(p for p in doc["pairs"] if p["train_modules"] == [train_module])


@pytest.mark.parametrize("name", CLEAN)
def test_clean_unprofiled_pair_maps_by_values_and_stays_silent(name, runs):
    code, stderr, report = runs[1][name]
    assert disagreements(case_doc(name)["expected"], code, stderr, report) == []
    assert report["verdict"] == "no_credible_divergence"
    doc = _mapping(runs, name)
    s = doc["summary"]
    assert s["pairs_by_alignment"] == {"names": 2, "values": 18, "order": 2}
    # 22 of 30 train modules: the rest are 5 dropouts, the model-level rotary table and the two
    # dense_h_to_4h whose output the rollout's fused fc_in never shows
    assert (s["mapped_train_modules"], s["train_modules"]) == (22, 30)
    assert (s["mapped_rollout_modules"], s["rollout_modules"]) == (22, 26)
    fused = _pair(doc, "gpt_neox.layers.1.mlp.act")
    assert (fused["rollout_modules"], fused["aligned_by"]) == (["backbone.blocks.1.ffn.fc_in"], "values")
    assert _pair(doc, "gpt_neox.layers.0")["aligned_by"] == "names"
    # the logits: all 8 rows on train, the sampled row on the rollout; the head weight pairs them
    assert (_pair(doc, "lm_head")["rollout_modules"], _pair(doc, "lm_head")["aligned_by"]) == (["head"], "order")
    one = {o["module"] for o in doc["one_sided"] if o["side"] == "rollout"}
    assert one == {f"backbone.blocks.{n}.mixer.{m}" for n in (0, 1) for m in ("rope", "core")}


@pytest.mark.parametrize("name, train, rollout, order", [
    ("neox_renamed_fp32_stale_fc_out", "gpt_neox.layers.1.mlp.dense_4h_to_h", "backbone.blocks.1.ffn.fc_out", 5),
    # bf16: the stale weight moves the statistics by 0.12, four times the tolerance; not a value match
    ("neox_renamed_bf16_stale_fc_out", "gpt_neox.layers.1.mlp.dense_4h_to_h", "backbone.blocks.1.ffn.fc_out", 5),
    ("neox_renamed_fp32_stale_dense_train", "gpt_neox.layers.0.attention.dense", "backbone.blocks.0.mixer.proj", 13),
])
def test_fault_in_an_unprofiled_pair_is_named_through_order_alignment(name, train, rollout, order, runs):
    code, stderr, report = runs[1][name]
    assert disagreements(case_doc(name)["expected"], code, stderr, report) == []
    rc = report["root_causes"][0]
    assert (rc["category"], rc["train_module"], rc["rollout_module"]) == (
        "parameter_or_checkpoint_issue", train, rollout)
    doc = _mapping(runs, name)
    # the diverged module cannot match by value: the order rule pairs it
    assert _pair(doc, train)["aligned_by"] == "order"
    assert doc["summary"]["pairs_by_alignment"]["order"] == order
    # the root cause says how its pair was found, and asks the user to confirm it
    assert rc["evidence"]["aligned_by"] == "order"
    assert "paired by their position between aligned modules, not by name" in rc["next_checks"][-1]["check"]


def _records(name):
    namer = Namer(load_profiles())
    out = {}
    for side in ("train", "rollout"):
        dump = load_input(next((CORPUS / name / side).glob("step0/*/dump.json")))
        out[side] = (dump, name_side(dump, side, namer)[1])
    return namer, out


def _plan(name, aligned: bool):
    namer, sides = _records(name)
    align = None
    if aligned:
        values = value_align.Values({s: d.entries for s, (d, _) in sides.items()}, load_tolerances()["statistics"])
        align = functools.partial(value_align.align, values=values)
    return build_plan(sides["train"][1], sides["rollout"][1], namer, align), sides


def _members(plan, sides, by=None):
    return {(tuple(sides["train"][1][i].path for i in p.train), tuple(sides["rollout"][1][i].path for i in p.rollout),
             p.kind) for p in plan.pairs if by is None or p.aligned_by == by}


def test_without_value_alignment_the_faulty_module_stays_one_sided():
    name = "neox_renamed_fp32_stale_fc_out"
    bare, sides = _plan(name, aligned=False)
    one = {sides[o.side][1][o.rec].path for o in bare.one_sided}
    assert {"gpt_neox.layers.1.mlp.dense_4h_to_h", "backbone.blocks.1.ffn.fc_out"} <= one
    assert Counter(p.aligned_by for p in bare.pairs) == {"names": 2}
    full, sides = _plan(name, aligned=True)
    assert (("gpt_neox.layers.1.mlp.dense_4h_to_h",), ("backbone.blocks.1.ffn.fc_out",), "one_to_one") \
        in _members(full, sides, "order")


@pytest.mark.parametrize("name", ["neox_renamed_fp32_stale_dense_train", "llama_tp1_fp32_extra_op",
                                  "qwen3_moe_tp1_fp32_clean", "gemma2_tp1_fp32_clean"])
def test_name_pairs_are_never_overridden_and_order_is_kept(name):
    bare, sides = _plan(name, aligned=False)
    full, _ = _plan(name, aligned=True)
    assert _members(full, sides, "names") == _members(bare, sides)
    added = sorted((p.train[0], p.rollout[0]) for p in full.pairs if p.aligned_by != "names")
    assert [r for _, r in added] == sorted(r for _, r in added), "aligned pairs keep execution order"


def test_an_extra_op_stays_one_sided():
    """The extra activation planted in a rollout (a profiled pair) has no counterpart: neither
    values nor order may give it one, or the missing/extra-op finding would be lost."""
    full, sides = _plan("llama_tp1_fp32_extra_op", aligned=True)
    extra = next(i for i, r in enumerate(sides["rollout"][1]) if r.path == "model.layers.1.mlp.activation")
    assert any(o.side == "rollout" and o.rec == extra for o in full.one_sided)
    assert all(p.aligned_by == "names" for p in full.pairs)


def test_best_monotone_prefers_more_and_fuller_matches():
    import numpy as np

    # a module and its container carry the same output (score 2 each); inputs break the tie (3)
    score = np.array([[3, 2, 0], [2, 2, 0], [0, 0, 2]])
    assert value_align._best_monotone(score) == [(0, 0), (1, 1), (2, 2)]
    # crossing matches cannot both be kept
    assert value_align._best_monotone(np.array([[0, 2], [2, 0]])) in ([(0, 1)], [(1, 0)])
    assert value_align._best_monotone(np.zeros((2, 3), dtype=np.int64)) == []


def test_aligned_pairs_compare_their_own_leaves(tmp_path):
    name = "neox_renamed_fp32_clean"
    code, _, _ = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", tmp_path)
    assert code == 0
    doc = json.loads((tmp_path / MAPPING).read_text(encoding="utf-8"))
    assert {p["aligned_by"] for p in doc["pairs"]} == {"names", "values", "order"}
    by_point = {c["point"]: c for c in doc["comparisons"]}
    pair = _pair(doc, "gpt_neox.layers.1.mlp.act")
    for point in pair["points"]["out"]:
        assert by_point[point]["pair"] == pair["pair_id"]


def _lf(name, mx, checksum=None, dtype="torch.bfloat16"):
    from dumpcompare.records import Leaf

    return Leaf(name, dtype, (8, 64), mx, -mx, 0.01, 5.0, checksum=checksum)


def test_checksums_decide_over_statistics_and_tolerance_follows_the_dtype():
    tol = load_tolerances()["statistics"]
    a = [_lf("output.0", 1.0, "aa"), _lf("output.0", 1.0, "bb"), _lf("output.0", 1.0)]
    b = [_lf("output.0", 2.0, "aa"), _lf("output.0", 1.0, "cc"), _lf("output.0", 1.02)]
    got = value_align._agree(a, b, 8 * 64, tol)
    assert got[0, 0] == 1      # equal checksums, whatever the statistics
    assert got[1, 1] == 0      # different checksums, equal statistics
    assert got[2, 2] == 1      # 2% off: within bf16's statistics tolerance (3e-2)
    fp32 = [_lf("output.0", 1.0, dtype="torch.float32")]
    assert value_align._agree(fp32, [_lf("output.0", 1.02, dtype="torch.float32")], 8 * 64, tol)[0, 0] == 0
