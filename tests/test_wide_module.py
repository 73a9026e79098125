"""A module returning hundreds of thousands of tensors is planned and compared (issue 28, item 3).

Planning used a membership test on a list per leaf, so such a run never finished. The pair is
written by tools/widedump.py with one rollout output's statistics doubled: that output is the
finding. Marked slow (``make test-slow``): it runs the whole pipeline on ~60 MB per side, with
no time limit asserted (make bench, stage ``wide``, shows the planner is linear).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import widedump  # noqa: E402

COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
LEAVES = 200_000
FAULT = 123_457     # the rollout output whose statistics are doubled


@pytest.mark.slow
def test_one_module_of_200k_outputs_finds_the_one_that_differs(tmp_path):
    pair = widedump.write_pair(tmp_path, LEAVES, FAULT)
    proc = subprocess.run([sys.executable, str(COMPARE), "--train", str(pair["train"]), "--rollout",
                           str(pair["rollout"]), "--out-dir", str(tmp_path / "out"), "--quiet"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc4 = json.loads((tmp_path / "out" / "output_4_module_analysis.json").read_text(encoding="utf-8"))
    first = doc4["first_divergence"]
    assert first["train_modules"] == first["rollout_modules"] == [widedump.MODULE]
    assert first["point"].endswith(f":output.{FAULT}") and first["status"] == "origin"
    doc3 = json.loads((tmp_path / "out" / "output_3_value_compare.json").read_text(encoding="utf-8"))
    outputs = [r for r in doc3["results"] if f"{widedump.MODULE}:output." in r["point"]]
    assert len(outputs) == LEAVES
    assert [r["point"] for r in outputs if r["status"] != "match"] == [first["point"]]
