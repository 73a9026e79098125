"""`make install-skills DEST=...` (tools/install_skills.py): the three skills side by side, linked or
copied, never overwriting a different folder; the installed skills run from any working directory."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "install_skills.py"
SKILLS = ("dump-module-mapping-value-compare", "rl-consistency-analysis", "ml-debug")
DATA = ROOT / "tests" / "data" / "msprobe"


def _install(dest: Path, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--dest", str(dest), *extra],
                          capture_output=True, text=True, timeout=120)


def _one_line_error(res) -> str:
    assert res.returncode == 2, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_links_the_three_skills_side_by_side_creating_dest(tmp_path):
    dest = tmp_path / "project" / ".claude" / "skills"
    res = _install(dest)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(SKILLS)
    for name in SKILLS:
        assert (dest / name).is_symlink() and (dest / name).resolve() == (ROOT / name).resolve()
    again = _install(dest)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already installed") == 3


@pytest.mark.parametrize("kind", ["folder", "link", "file"])
def test_refuses_a_different_existing_entry_and_changes_nothing(tmp_path, kind):
    dest = tmp_path / "skills"
    dest.mkdir()
    other = dest / "ml-debug"
    if kind == "folder":
        other.mkdir()
        (other / "SKILL.md").write_text("someone else's skill\n")
    elif kind == "link":
        (tmp_path / "elsewhere").mkdir()
        other.symlink_to(tmp_path / "elsewhere")
    else:
        other.write_text("a file\n")
    line = _one_line_error(_install(dest))
    assert str(other) in line and "nothing was installed" in line
    assert [p.name for p in dest.iterdir()] == ["ml-debug"]
    if kind == "folder":
        assert (other / "SKILL.md").read_text() == "someone else's skill\n"


def test_copy_mode_copies_and_accepts_only_an_identical_copy(tmp_path):
    dest = tmp_path / "skills"
    res = _install(dest, "--copy")
    assert res.returncode == 0, res.stderr
    for name in SKILLS:
        assert (dest / name).is_dir() and not (dest / name).is_symlink()
        assert (dest / name / "SKILL.md").read_bytes() == (ROOT / name / "SKILL.md").read_bytes()
    assert not list(dest.rglob("__pycache__"))
    assert _install(dest, "--copy").returncode == 0
    # A link install where a copy already is (or the reverse) is a different entry, not this install.
    assert "not a link to" in _one_line_error(_install(dest))
    (dest / "ml-debug" / "SKILL.md").write_text("edited\n")
    assert "other contents" in _one_line_error(_install(dest, "--copy"))


def test_refuses_a_dest_inside_a_skill_folder(tmp_path):
    dest = ROOT / "ml-debug" / "not-created"
    assert "inside the skill folder" in _one_line_error(_install(dest))
    assert not dest.exists()


def test_copied_skills_run_from_any_working_directory(tmp_path):
    """The root-cause skill, copied with its sibling, runs from an unrelated cwd and finds the
    perturbed weight of the real msprobe pair."""
    dest = tmp_path / "skills"
    assert _install(dest, "--copy").returncode == 0
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    script = dest / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
    res = subprocess.run([sys.executable, str(script), "--train", str(DATA / "llama_L0_statistics"),
                          "--rollout", str(DATA / "llama_L0_statistics_perturbed"), "--out-dir", "out"],
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads((cwd / "out" / "output_5_root_cause_report.json").read_text())
    assert doc["root_causes"][0]["train_module"] == "model.layers.1.mlp.down_proj"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_target_installs_and_needs_dest(tmp_path):
    dest = tmp_path / "skills"
    res = subprocess.run(["make", "-s", "-C", str(ROOT), "install-skills", f"DEST={dest}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(SKILLS)
    res = subprocess.run(["make", "-s", "-C", str(ROOT), "install-skills"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "usage: make install-skills DEST=" in res.stderr
