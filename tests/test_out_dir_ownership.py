"""A run owns its out-dir's output_* files (issue 13, item 3): re-running never leaves outputs of
different runs side by side, and nothing but our exact output names is ever removed.

Runs the two scripts as a user would on the committed real msprobe pair: the clean run against its
copy with noise on ``model.layers.1.mlp.down_proj.weight`` finds a root cause, the clean run against
itself finds nothing.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "msprobe"
CLEAN, PERTURBED = DATA / "llama_L0_statistics", DATA / "llama_L0_statistics_perturbed"
COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
ROOTCAUSE = ROOT / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
REPORT, AGENT_REPORT = "output_5_root_cause_report.json", "output_5_root_cause_report.md"
# Files an out-dir may hold that are not ours: never removed.
FOREIGN = ("notes.txt", "output_9_mine.json", "output_5_root_cause_report.md.bak", "my_output_1_key_mapping.json")


def _run(script: Path, train: Path, rollout: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), "--train", str(train), "--rollout", str(rollout),
                           "--out-dir", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)


def _finding_dir(tmp_path: Path) -> Path:
    """An out-dir from a root-cause run that found the perturbed weight, with the agent's markdown."""
    out = tmp_path / "out"
    res = _run(ROOTCAUSE, CLEAN, PERTURBED, out)
    assert res.returncode == 0, res.stderr
    old = json.loads((out / REPORT).read_text())
    assert old["verdict"] == "root_cause_found"
    assert old["root_causes"][0]["train_module"] == "model.layers.1.mlp.down_proj"
    (out / AGENT_REPORT).write_text("# root cause: model.layers.1.mlp.down_proj\n")
    for name in FOREIGN:
        (out / name).write_text("not ours\n")
    (out / "output_5_extra").mkdir()
    return out


def test_compare_rerun_removes_a_stale_root_cause_report(tmp_path):
    out = _finding_dir(tmp_path)
    res = _run(COMPARE, CLEAN, CLEAN, out)
    assert res.returncode == 0, res.stderr
    assert not (out / REPORT).exists() and not (out / AGENT_REPORT).exists()
    assert json.loads((out / "output_4_module_analysis.json").read_text())["first_divergence"]["pair"] is None
    assert all((out / name).read_text() == "not ours\n" for name in FOREIGN)
    assert (out / "output_5_extra").is_dir()


def test_root_cause_rerun_on_inputs_that_find_nothing_replaces_the_report(tmp_path):
    out = _finding_dir(tmp_path)
    # a copy: the same folder on both sides is refused (exit 2) before anything is written
    copy = tmp_path / "copy"
    shutil.copytree(CLEAN, copy)
    res = _run(ROOTCAUSE, CLEAN, copy, out)
    assert res.returncode == 0, res.stderr
    assert json.loads((out / REPORT).read_text())["verdict"] == "no_credible_divergence"
    assert not (out / AGENT_REPORT).exists()
    assert all((out / name).read_text() == "not ours\n" for name in FOREIGN)


def test_reuse_outputs_keeps_output_1_to_4_and_drops_the_agents_old_markdown(tmp_path):
    out = _finding_dir(tmp_path)
    kept = {p.name: p.read_bytes() for p in out.glob("output_[1-4]_*")}
    assert len(kept) == 8
    res = _run(ROOTCAUSE, CLEAN, PERTURBED, out, "--reuse-outputs")
    assert res.returncode == 0, res.stderr
    assert {p.name: p.read_bytes() for p in out.glob("output_[1-4]_*")} == kept
    assert json.loads((out / REPORT).read_text())["verdict"] == "root_cause_found"
    assert not (out / AGENT_REPORT).exists()
    assert all((out / name).read_text() == "not ours\n" for name in FOREIGN)


def test_a_failed_run_removes_nothing(tmp_path):
    out = _finding_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    res = _run(COMPARE, tmp_path / "missing", CLEAN, out)
    assert res.returncode == 2
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
