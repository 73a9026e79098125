"""One owner per judgement (issue 11, "Structure first" item 1): where a pair sits (its previous
aligned pair, its containers, the one-sided modules between) is stated in output_4 by the compare
step, and the root-cause step follows what output_4 says instead of working it out again.

Each test runs a real pair once, edits one of those fields in a copy of the out-dir and re-runs
only the root-cause step (``--reuse-outputs``): its finding must move with the edit.
"""
from __future__ import annotations

import json
import shutil

import pytest
from real.corpus_check import CORPUS, REPORT, run_pair

OUT4 = "output_4_module_analysis.json"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """case name -> out-dir of one full run (compare and root cause) on that real pair."""
    root = tmp_path_factory.mktemp("owner")
    out = {}
    for name in ("megatron_tp1_qkv_plain_order", "llama_tp1_fp32_extra_op"):
        code, err, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", root / name)
        assert code == 0, err
        out[name] = root / name
    return out


def _top(out_dir):
    doc = json.loads((out_dir / REPORT).read_text(encoding="utf-8"))
    assert doc["verdict"] == "root_cause_found"
    return doc["root_causes"][0]


def _rerun(src, dst, pid, **fields):
    """Copy out-dir ``src`` to ``dst``, set ``fields`` of output_4 pair ``pid`` and run the root-cause
    step alone on it: (exit code, stderr)."""
    shutil.copytree(src, dst)
    path = dst / OUT4
    doc = json.loads(path.read_text(encoding="utf-8"))
    rec = next(m for m in doc["modules"] if m["pid"] == pid)
    rec.update(fields)
    path.write_text(json.dumps(doc), encoding="utf-8")
    code, err, _doc = run_pair("unused-train", "unused-rollout", dst, "--reuse-outputs")
    return code, err


def test_previous_aligned_and_containers_are_read(runs, tmp_path):
    src = runs["megatron_tp1_qkv_plain_order"]
    before = _top(src)
    # The fused qkv output agrees and its split parts do not: the finding sits at output_4's
    # previous aligned pair of the suspect.
    assert before["rules_fired"] == ["fused_split_differs"]
    suspect = before["evidence"]["suspect_pair"]["pair"]
    prev = before["evidence"]["previous_aligned"]["pair"]
    assert before["train_module"] == "decoder.layers.0.self_attention.linear_qkv"
    doc4 = json.loads((src / OUT4).read_text(encoding="utf-8"))
    rec = next(m for m in doc4["modules"] if m["pid"] == suspect)
    assert rec["previous_aligned"] == prev
    earlier = next(m for m in doc4["modules"] if m["train_modules"] == ["decoder.layers.0.input_layernorm"])
    container = next(m for m in doc4["modules"] if m["train_modules"] == ["decoder.layers.0.self_attention"])
    assert rec["containers"][0] == container["pid"]

    # Name the input norm as the boundary: no fused product before the suspect any more, so the
    # break is inside the enclosing attention module that output_4 names.
    assert _rerun(src, tmp_path / "prev", suspect, previous_aligned=earlier["pid"]) == (0, "")
    after = _top(tmp_path / "prev")
    assert after["evidence"]["previous_aligned"]["pair"] == earlier["pid"]
    assert after["evidence"]["boundary"]["train_module"] == "decoder.layers.0.input_layernorm"
    assert after["rules_fired"][0] == "impl_in_container"
    assert (after["category"], after["train_module"]) == ("in_module_impl_difference",
                                                        "decoder.layers.0.self_attention")

    # And with no container named, the same break is reported at the suspect itself.
    assert _rerun(src, tmp_path / "flat", suspect, previous_aligned=earlier["pid"], containers=[]) == (0, "")
    flat = _top(tmp_path / "flat")
    assert flat["rules_fired"][0] == "impl_inline"
    assert flat["train_module"] == rec["train_modules"][0]


def test_one_sided_between_is_read(runs, tmp_path):
    src = runs["llama_tp1_fp32_extra_op"]
    before = _top(src)
    assert before["rules_fired"][0] == "extra_op_between"
    assert before["rollout_module"] == "model.layers.1.mlp.activation"
    suspect = before["evidence"]["suspect_pair"]["pair"]
    # With output_4 naming nothing between the boundary and the suspect, the op is inline.
    assert _rerun(src, tmp_path / "none", suspect, one_sided_between=[]) == (0, "")
    after = _top(tmp_path / "none")
    assert after["rules_fired"] == ["inline_op_between"]
    assert after["category"] == "missing_or_extra_op_between_aligned_boundary"
    assert after["op_module"] is None and after["evidence"]["one_sided_between"] == []
    assert after["rollout_module"] == "model.layers.1.mlp.down_proj"


def test_a_reference_to_no_record_is_an_input_error(runs, tmp_path):
    src = runs["llama_tp1_fp32_extra_op"]
    suspect = _top(src)["evidence"]["suspect_pair"]["pair"]
    code, err = _rerun(src, tmp_path / "bad", suspect, previous_aligned="P9999")
    assert code == 2
    assert len(err.splitlines()) == 1 and OUT4 in err and "P9999" in err
