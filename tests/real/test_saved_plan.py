"""``run_compare.py --plan output_2.json`` executes a saved mapping plan instead of mapping again
(issue 11, "Structure first" item 1): on real pairs the re-run gives the same comparisons and the
same module analysis; a plan that does not fit the dumps is exit 2 with one line naming the file.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from real.corpus_check import CORPUS, REPO

COMPARE = REPO / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
OUT2, OUT3, OUT4 = "output_2_mapping.json", "output_3_value_compare.json", "output_4_module_analysis.json"
# Keys whose values name files or folders (they would differ with the out-dir or the inputs' place).
PATH_KEYS = {"path", "folder", "files", "dump_dir", "dump_data_dir", "config_file"}


def _compare(case, out, *extra):
    proc = subprocess.run([sys.executable, str(COMPARE), "--train", str(CORPUS / case / "train"),
                           "--rollout", str(CORPUS / case / "rollout"), "--out-dir", str(out), "--quiet",
                           *map(str, extra)], capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr.strip()


def _read(path):
    return json.loads(path.read_text(encoding="utf-8"))


def _no_paths(obj):
    if isinstance(obj, dict):
        return {k: _no_paths(v) for k, v in obj.items() if k not in PATH_KEYS}
    if isinstance(obj, list):
        return [_no_paths(v) for v in obj]
    return obj


# A tensor-mode Megatron pair whose fused qkv needs the head geometry the plan carries, and a
# tensor-parallel HF/vLLM pair whose ranks are merged before the plan is applied.
# the GPT-NeoX pair maps mostly by values and order (value_align.py): the plan keeps how
@pytest.mark.parametrize("case", ["megatron_tp1_tensor_qkv_plain_order", "llama_tp2_fp32_wrong_shard",
                                  "neox_renamed_fp32_stale_fc_out"])
def test_a_saved_plan_gives_the_same_comparisons(case, tmp_path):
    assert _compare(case, tmp_path / "first") == (0, "")
    plan = tmp_path / "first" / OUT2
    assert _compare(case, tmp_path / "again", "--plan", plan) == (0, "")
    first, again = (_read(tmp_path / d / OUT3) for d in ("first", "again"))
    assert len(first["results"]) > 20
    assert _no_paths(again["results"]) == _no_paths(first["results"])
    assert _no_paths(again) == _no_paths(first)
    assert _read(tmp_path / "again" / OUT4)["modules"] == _read(tmp_path / "first" / OUT4)["modules"]
    assert any(r["status"] == "mismatch" for r in first["results"])   # the fault is found both times
    pairs = [_read(tmp_path / d / OUT2)["pairs"] for d in ("first", "again")]
    assert [p["aligned_by"] for p in pairs[1]] == [p["aligned_by"] for p in pairs[0]]


def test_the_plan_is_what_runs(tmp_path):
    case = "llama_tp1_fp32_stale_rollout"
    assert _compare(case, tmp_path / "first") == (0, "")
    doc = _read(tmp_path / "first" / OUT2)
    dropped = next(c for c in doc["comparisons"] if c["point"] == "L1.down.weight" and c["pair"] is None)
    doc["comparisons"] = [c for c in doc["comparisons"] if c is not dropped]
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(doc), encoding="utf-8")
    assert _compare(case, tmp_path / "again", "--plan", edited) == (0, "")
    first, again = (_read(tmp_path / d / OUT3)["results"] for d in ("first", "again"))
    assert [r["cid"] for r in again] == [r["cid"] for r in first if r["cid"] != dropped["cid"]]
    assert not any(r["point"] == "L1.down.weight" and r["pair"] is None for r in again)


def test_a_plan_of_other_dumps_is_exit_2_naming_the_file(tmp_path):
    assert _compare("llama_tp1_fp32_clean", tmp_path / "llama") == (0, "")
    plan = tmp_path / "llama" / OUT2
    code, err = _compare("megatron_tp1_clean", tmp_path / "out", "--plan", plan)
    assert code == 2
    assert len(err.splitlines()) == 1 and str(plan) in err and "module key" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, words", [("{not json", "not a readable JSON file"),
                                         ('{"schema_version": "1.1", "pairs": []}', "schema_version 2.x"),
                                         ('{"schema_version": "2.0", "pairs": [{}]}', "not a mapping plan")])
def test_an_unreadable_plan_is_exit_2_naming_the_file(tmp_path, text, words):
    plan = tmp_path / "plan.json"
    plan.write_text(text, encoding="utf-8")
    code, err = _compare("llama_tp1_fp32_clean", tmp_path / "out", "--plan", plan)
    assert code == 2
    assert len(err.splitlines()) == 1 and str(plan) in err and words in err
    assert not (tmp_path / "out").exists()
