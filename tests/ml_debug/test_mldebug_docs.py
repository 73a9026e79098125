"""The skill's documents: valid frontmatter, every named file exists, and the recorded runs are real."""
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from mldebug_common import CREDENCE_SCALE

CHECKERS = ("check_training_guide", "check_evidence_criteria", "check_tables", "read_curves",
            "paired_compare", "scan_silent_bugs", "sample_outputs", "check_overfit", "check_quotes")
SPEC_REFERENCES = ("playbook", "checklist", "diagnostics", "static_analysis", "loss_surface",
                   "metric_stuck", "sweeps", "llm_judges", "time_series", "research_taste",
                   "transformers", "rl", "pinn", "exercises", "sources", "checker_runs", "checkers")


@pytest.fixture(scope="module")
def skill_md(skill):
    return (skill.root / "SKILL.md").read_text()


def test_frontmatter(skill_md):
    assert skill_md.startswith("---\n")
    meta = yaml.safe_load(skill_md.split("---\n")[1])
    assert set(meta) == {"name", "description"}
    assert meta["name"] == "ml-debug"
    assert 0 < len(meta["description"]) <= 1024
    for phrase in ("read the log", "crashed", "loss is not going down", "does A", "looks fine"):
        assert phrase in meta["description"]


def test_every_checker_is_named_with_its_command(skill_md, skill):
    for name in CHECKERS:
        assert f"python3 <skill_root>/scripts/{name}.py" in skill_md
        assert (skill.scripts / f"{name}.py").is_file()


def test_commands_do_not_assume_the_repository_layout(skill):
    # Linked into .claude/skills/, the folder is no longer called ml-debug/ under the working directory.
    skill_md = (skill.root / "SKILL.md").read_text()
    assert "`<skill_root>` is this skill's folder" in skill_md
    for doc in [skill.root / "SKILL.md", *skill.references.glob("*.md"), *skill.assets.glob("*.md"),
                *skill.examples.rglob("*.md")]:
        assert "python3 ml-debug/scripts" not in doc.read_text(), doc.name


def test_dependency_line_names_pyyaml(skill_md):
    assert "(standard library, numpy and\npyyaml only)" in skill_md


def test_every_path_in_skill_md_exists(skill_md, skill):
    paths = set(re.findall(r"`((?:references|assets)/[\w./-]+)`", skill_md))
    assert paths
    for rel in paths:
        assert (skill.root / rel).exists(), rel


def test_spec_reference_list_is_complete(skill):
    for name in SPEC_REFERENCES:
        assert (skill.references / f"{name}.md").is_file(), name


def test_credence_scale_in_skill_md_matches_the_code(skill_md):
    for word, lo, hi in CREDENCE_SCALE:
        assert re.search(rf"\| {word} \| {lo}-{hi} \|", skill_md), word


def test_local_links_resolve(skill):
    for doc in [skill.root / "SKILL.md", *skill.references.glob("*.md"), *skill.assets.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text()):
            if not re.match(r"[a-z]+://", target):
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"


def test_sources_cite_links_and_quote_nothing(skill):
    text = (skill.references / "sources.md").read_text()
    bullets = [b for b in text.split("\n- ")[1:]]
    assert len(bullets) >= 30
    assert all(re.search(r"\]\(https?://", b) or "`references/" in b for b in bullets)
    assert not re.search(r"^>", text, re.MULTILINE)


def recorded_runs(text):
    for block in re.findall(r"```console\n(.*?)\n```", text, re.DOTALL):
        lines = block.splitlines()
        assert lines[0].startswith("$ ") and re.fullmatch(r"\[exit \d\]", lines[-1])
        yield lines[0][2:], "\n".join(lines[1:-1]), int(lines[-1][6])


def test_checker_runs_page_matches_real_runs(skill):
    runs = list(recorded_runs((skill.references / "checker_runs.md").read_text()))
    assert {re.search(r"scripts/(\w+)\.py", cmd).group(1) for cmd, _, _ in runs} == set(CHECKERS)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for cmd, expected, code in runs:
        argv = shlex.split(cmd)
        argv[0] = sys.executable
        proc = subprocess.run(argv, cwd=skill.root, capture_output=True, text=True, env=env,
                              timeout=60)
        assert proc.returncode == code, cmd
        assert (proc.stdout + proc.stderr).rstrip("\n") == expected, cmd
