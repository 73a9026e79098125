"""One owner of the words (issue 22 part c): the compare step publishes them in output_4
``vocabulary`` (status groups, dtype precision order, point forms and words) and the root-cause
step reads them from there instead of keeping its own copies.

As in test_single_owner.py, a real pair runs once; each test edits the vocabulary in a copy of the
out-dir and re-runs only the root-cause step (``--reuse-outputs``): its report must follow.
"""
from __future__ import annotations

import json
import shutil

import pytest
from real.corpus_check import CORPUS, REPORT, run_pair

OUT3 = "output_3_value_compare.json"
OUT4 = "output_4_module_analysis.json"
# The rollout's logits are bf16 while everything else is fp32: a precision boundary at lm_head.
PAIR = "llama_tp1_fp32_lm_head_bf16"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Out-dir of one full run (compare and root cause) on PAIR, with its output_5."""
    out = tmp_path_factory.mktemp("vocab") / PAIR
    code, err, doc = run_pair(CORPUS / PAIR / "train", CORPUS / PAIR / "rollout", out)
    assert code == 0, err
    return out, doc


def _rerun(src, dst, edit):
    """Copy out-dir ``src`` to ``dst``, apply ``edit`` to output_4's ``vocabulary`` and run the
    root-cause step alone on it: (exit code, stderr, output_5)."""
    shutil.copytree(src, dst)
    path = dst / OUT4
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc["vocabulary"])
    path.write_text(json.dumps(doc), encoding="utf-8")
    return run_pair("unused-train", "unused-rollout", dst, "--reuse-outputs")


def test_output_4_publishes_the_vocabulary(run):
    out, _doc = run
    doc4 = json.loads((out / OUT4).read_text(encoding="utf-8"))
    assert doc4["schema_version"] == "2.2"
    vocab = doc4["vocabulary"]
    assert vocab["statuses"] == {"clean": ["match", "drift"], "diverged": ["mismatch", "nonfinite"],
                                 "bounded": ["bounded"]}
    assert vocab["dtype_precision"] == ["float64", "float32", "float16", "bfloat16"]
    # Every point output_3 compares has its form.
    results = json.loads((out / OUT3).read_text(encoding="utf-8"))["results"]
    assert {r["point"] for r in results} <= set(vocab["points"])
    assert vocab["points"]["M.logits"]["parts"][0] == {"point": "M.logits", "scope": "model", "layer": None,
                                                       "name": "logits", "parameter": None, "call": None}


def test_the_lower_precision_side_follows_the_published_order(run, tmp_path):
    _out, before = run
    top = before["root_causes"][0]
    assert top["rules_fired"][0] == "precision_boundary" and top["side"] == "rollout"
    assert top["evidence"]["precision_boundary"] == "rollout side in lower precision"
    # Published the other way round, bf16 is the more precise dtype: the train side (fp32) is lower.
    code, err, after = _rerun(run[0], tmp_path / "order", lambda v: v["dtype_precision"].reverse())
    assert code == 0, err
    top = after["root_causes"][0]
    assert top["side"] == "train" and top["evidence"]["precision_boundary"] == "train side in lower precision"


def test_the_glossary_and_the_layer_profile_follow_the_published_points(run, tmp_path):
    out, before = run
    assert before["glossary"]["points"]["M.logits"] == "model: logits of every token"
    forms = json.loads((out / OUT4).read_text(encoding="utf-8"))["vocabulary"]["points"]
    # A layer-1 activation that was compared and agrees: it counts in the layer profile.
    point = next(r["point"] for r in json.loads((out / OUT3).read_text(encoding="utf-8"))["results"]
                 if r.get("pair") is None and r["status"] == "match" and forms[r["point"]]["layer"] == 1
                 and forms[r["point"]]["kind"] == "activation")
    assert "7" not in before["precision"]["median_error_by_layer"]

    def edit(vocab):
        vocab["point_words"]["logits"] = "an edited word for the logits"
        vocab["points"][point] = {**vocab["points"][point], "layer": 7}
    code, err, after = _rerun(out, tmp_path / "points", edit)
    assert code == 0, err
    assert after["glossary"]["points"]["M.logits"] == "model: an edited word for the logits"
    assert "7" in after["precision"]["median_error_by_layer"]


def test_the_graded_statuses_follow_the_published_groups(run, tmp_path):
    out, before = run
    results = [r for r in json.loads((out / OUT3).read_text(encoding="utf-8"))["results"] if r.get("pair") is None]
    count = {s: sum(r["status"] == s for r in results) for s in ("match", "drift", "mismatch", "nonfinite")}
    assert before["precision"]["compared"] == sum(count.values())

    # With "match" no longer published as an agreement, a match is not graded: only the rest count.
    def edit(vocab):
        vocab["statuses"]["clean"] = ["drift"]
    code, err, after = _rerun(out, tmp_path / "statuses", edit)
    assert code == 0, err
    assert count["match"] > 0
    assert after["precision"]["compared"] == sum(count.values()) - count["match"]


@pytest.mark.parametrize("how", ["missing", "a form without parts"])
def test_an_output_4_without_a_well_formed_vocabulary_is_an_input_error(run, tmp_path, how):
    dst = tmp_path / "bad"
    shutil.copytree(run[0], dst)
    doc = json.loads((dst / OUT4).read_text(encoding="utf-8"))
    if how == "missing":
        del doc["vocabulary"]
    else:
        doc["vocabulary"]["points"]["M.logits"] = {"kind": "activation", "layer": None}
    (dst / OUT4).write_text(json.dumps(doc), encoding="utf-8")
    code, err, _doc = run_pair("unused-train", "unused-rollout", dst, "--reuse-outputs")
    assert code == 2
    assert len(err.splitlines()) == 1 and OUT4 in err and "vocabulary" in err
