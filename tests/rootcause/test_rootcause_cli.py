"""Command line of run_root_cause_analysis.py: exit codes, error messages, the sibling skill,
--reuse-outputs, pass-through options, and that nothing is written outside --out-dir.

Exit-code and traceback tests run the script as a subprocess, as a user or CI job would.
"""
import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from synth import Config, generate_pair
from synth import faults as F

REPO = Path(__file__).resolve().parents[2]
SKILL = REPO / "rl-consistency-analysis"
SIBLING = REPO / "dump-module-mapping-value-compare"
ML_DEBUG = REPO / "ml-debug"
SCRIPT = SKILL / "scripts" / "run_root_cause_analysis.py"
REPORT = "output_5_root_cause_report.json"
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


def small_pair(root, faults=(), **kw):
    return generate_pair(root, Config(layers=4, hidden=32), train_layout="hf", rollout_layout="vllm",
                         faults=list(faults), **kw)


def snapshot(root: Path, skip: Path | None = None) -> dict:
    """Every file under root (except __pycache__ and ``skip``) with its size and mtime."""
    out = {}
    for p in root.rglob("*"):
        if "__pycache__" in p.parts or (skip is not None and (p == skip or skip in p.parents)):
            continue
        st = p.lstat()
        out[str(p.relative_to(root))] = (p.is_dir(), st.st_size if p.is_file() else 0, st.st_mtime_ns)
    return out


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# --- exit codes ------------------------------------------------------------------------------

def test_fail_on_finding_exits_1_on_a_fault(tmp_path, script):
    train, rollout = small_pair(tmp_path / "pair", [F.CorruptWeight("rollout", "down", 2)])
    res = script(SCRIPT, "--train", train, "--rollout", rollout, "--out-dir", tmp_path / "out", "--fail-on-finding")
    assert res.code == 1, res.err
    assert res.err == ""
    doc = json.loads((tmp_path / "out" / REPORT).read_text())
    assert doc["verdict"] == "root_cause_found"
    assert doc["root_causes"][0]["train_module"] == "model.layers.2.mlp.down_proj"
    assert "verdict: root cause found" in res.out.splitlines()


def test_without_flag_a_fault_exits_0(analyze):
    assert analyze([F.CorruptWeight("rollout", "gate", 1)]).code == 0


def test_fail_on_finding_exits_0_on_a_clean_pair(tmp_path, script):
    train, rollout = small_pair(tmp_path / "pair", [F.KernelNoise("train", 1e-6, 0), F.KernelNoise("rollout", 1e-6, 1)])
    res = script(SCRIPT, "--train", train, "--rollout", rollout, "--out-dir", tmp_path / "out", "--fail-on-finding",
                 "--quiet")
    assert res.code == 0, res.err
    assert res.out == "" and res.err == ""
    assert json.loads((tmp_path / "out" / REPORT).read_text())["verdict"] == "no_credible_divergence"


@pytest.mark.parametrize("fault,verdict", [(F.HalfPrecision("rollout", "all"), "precision_only"),
                                           (F.ExtraOp("rollout", 2), "root_cause_found")])
def test_fail_on_finding_with_other_verdicts(analyze, cli, tmp_path, fault, verdict):
    res = analyze([fault])
    out = tmp_path / "out"
    shutil.copytree(res.out, out)
    code, _, _ = cli("--train", res.train, "--rollout", res.rollout, "--out-dir", out, "--reuse-outputs",
                     "--fail-on-finding")
    assert json.loads((out / REPORT).read_text())["verdict"] == verdict
    assert code == 1


def test_missing_train_file_exits_2_with_one_line(tmp_path, script):
    _, rollout = small_pair(tmp_path / "pair")
    missing = tmp_path / "nowhere" / "dump.json"
    res = script(SCRIPT, "--train", missing, "--rollout", rollout, "--out-dir", tmp_path / "out")
    assert res.code == 2
    line = one_line_error(res.err)
    assert str(missing) in line and "--train" in line
    assert not (tmp_path / "out" / REPORT).exists()


@pytest.mark.parametrize("make", ["empty_dir", "bad_json"])
def test_unreadable_train_dump_exits_2(tmp_path, script, make):
    _, rollout = small_pair(tmp_path / "pair")
    if make == "empty_dir":
        bad = tmp_path / "empty"
        bad.mkdir()
    else:
        bad = tmp_path / "dump.json"
        bad.write_text("{not json")
    res = script(SCRIPT, "--train", bad, "--rollout", rollout, "--out-dir", tmp_path / "out")
    assert res.code == 2
    assert str(bad) in one_line_error(res.err)


def test_usage_error_exits_2(script):
    res = script(SCRIPT, "--train", "x")
    assert res.code == 2
    assert "Traceback" not in res.err and "--rollout" in res.err


def test_help_documents_the_ci_flag(script):
    res = script(SCRIPT, "--help")
    assert res.code == 0
    assert "--fail-on-finding" in res.out and "--out-dir" in res.out


# --- the sibling skill -----------------------------------------------------------------------

def run_with_skills(tmp_path, script, folders, prepare=None):
    """Run a copy of this skill with only ``folders`` beside it (``prepare(skills dir)`` first)."""
    skills = tmp_path / "skills"
    for src in folders:
        shutil.copytree(src, skills / src.name, ignore=IGNORE)
    if prepare:
        prepare(skills)
    train, rollout = small_pair(tmp_path / "pair")
    return script(skills / SKILL.name / "scripts" / SCRIPT.name, "--train", train, "--rollout", rollout,
                  "--out-dir", tmp_path / "out")


def test_skill_without_its_sibling_exits_2_naming_it(tmp_path, script):
    res = run_with_skills(tmp_path, script, (SKILL, ML_DEBUG))
    assert res.code == 2
    assert "dump-module-mapping-value-compare" in one_line_error(res.err)
    assert not (tmp_path / "out" / REPORT).exists()


def test_failing_sibling_exits_2_with_its_message(tmp_path, script):
    def fake_compare(skills):
        entry = skills / SIBLING.name / "scripts" / "run_compare.py"
        entry.parent.mkdir(parents=True)
        # The stub keeps the real safe-text module, which the root-cause skill loads before it runs.
        (entry.parent / "dumpcompare").mkdir()
        shutil.copy(SIBLING / "scripts" / "dumpcompare" / "safetext.py", entry.parent / "dumpcompare")
        entry.write_text("import sys\nprint('warming up')\nprint('error: compare exploded on purpose', "
                         "file=sys.stderr)\nsys.exit(3)\n")
    res = run_with_skills(tmp_path, script, (SKILL, ML_DEBUG), fake_compare)
    assert res.code == 2
    line = one_line_error(res.err)
    assert "compare exploded on purpose" in line


def test_sibling_without_its_safe_text_module_exits_2_naming_it(tmp_path, script):
    """The root-cause skill escapes names with the sibling's safetext.py: without it, one line."""
    res = run_with_skills(tmp_path, script, (SKILL, SIBLING, ML_DEBUG),
                          lambda skills: (skills / SIBLING.name / "scripts" / "dumpcompare" / "safetext.py").unlink())
    assert res.code == 2
    line = one_line_error(res.err)
    assert "safetext.py" in line and "dump-module-mapping-value-compare" in line
    assert not (tmp_path / "out").exists()


def test_the_compare_and_root_cause_skills_copied_alone_run_the_demo_from_another_folder(tmp_path, script):
    """Installed without ml-debug (each skill ships what it reads), from a cwd outside the bundle."""
    skills = tmp_path / "skills"
    for src in (SKILL, SIBLING):
        shutil.copytree(src, skills / src.name, ignore=IGNORE)
    demo = REPO / "examples" / "hf_train_vs_vllm_rollout"
    (tmp_path / "elsewhere").mkdir()
    res = script(skills / SKILL.name / "scripts" / SCRIPT.name, "--train", demo / "train", "--rollout",
                 demo / "rollout", "--out-dir", tmp_path / "out", cwd=tmp_path / "elsewhere")
    assert res.code == 0, res.err
    doc = json.loads((tmp_path / "out" / REPORT).read_text())
    # the demo's fault: a stale gate/up weight of layer 2 on the rollout side
    assert doc["verdict"] == "root_cause_found"
    assert doc["root_causes"][0]["rollout_module"] == "model.layers.2.mlp.gate_up_proj"
    assert doc["root_causes"][0]["confidence_word"] != ""


def test_without_its_credence_scale_the_skill_exits_2(tmp_path, script):
    res = run_with_skills(tmp_path, script, (SKILL, SIBLING),
                          lambda skills: (skills / SKILL.name / "scripts" / "rootcause" / "credence_scale.json").unlink())
    assert res.code == 2
    line = one_line_error(res.err)
    assert "credence_scale.json" in line and "credence scale" in line
    assert not (tmp_path / "out" / REPORT).exists()


def test_copied_skills_run_and_write_only_inside_out_dir(tmp_path, script):
    """The three skill folders copied elsewhere (the sibling is found relative to the skill root);
    the run writes nothing outside --out-dir: not in the dumps, the skills, the cwd or TMPDIR."""
    skills = tmp_path / "skills"
    for src in (SKILL, SIBLING, ML_DEBUG):
        shutil.copytree(src, skills / src.name, ignore=IGNORE)
    train, rollout = small_pair(tmp_path / "pair", [F.MissingActivation("train", 2)], task="tensor")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "results" / "out"
    before = snapshot(tmp_path)
    res = script(skills / SKILL.name / "scripts" / SCRIPT.name, "--train", train, "--rollout", rollout,
                 "--out-dir", out, cwd=tmp_path / "cwd", env={"TMPDIR": str(tmp_path / "tmp")})
    assert res.code == 0, res.err
    after = snapshot(tmp_path, skip=out)
    after.pop("results", None)
    assert after == before
    doc = json.loads((out / REPORT).read_text())
    rc = doc["root_causes"][0]
    assert (rc["category"], rc["rollout_module"], rc["missing_on"]) == (
        "missing_or_extra_op_between_aligned_boundary", "model.layers.2.mlp.act_fn", "train")
    assert doc["mode"] == "tensor"


# --- --reuse-outputs ---------------------------------------------------------------------------

def _without_commands(findings: list[dict]) -> list[dict]:
    return [{**f, "next_checks": [c["check"] for c in f["next_checks"]]} for f in findings]


def test_reuse_outputs_does_not_rerun_the_compare_step(analyze, cli, tmp_path, monkeypatch):
    from rootcause import sibling

    res = analyze([F.PermuteQKV("rollout", 1)])
    out = tmp_path / "out"
    shutil.copytree(res.out, out)
    (out / REPORT).unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*a, **k):
        raise AssertionError("the compare step must not run with --reuse-outputs")

    # locate() still runs: report.html is drawn by the sibling's chart module
    monkeypatch.setattr(sibling, "run", boom)
    code, stdout, err = cli("--train", res.train, "--rollout", res.rollout, "--out-dir", out, "--reuse-outputs")
    assert code == 0, err
    doc = json.loads((out / REPORT).read_text())
    assert doc["verdict"] == res.doc["verdict"]
    # The commands of the next checks rerun this command line, whose --out-dir is another one.
    assert _without_commands(doc["root_causes"]) == _without_commands(res.doc["root_causes"])
    assert doc["suppressed"] == res.doc["suppressed"]
    # output_1..4 untouched; report.html is redrawn (its commands name this --out-dir)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name not in (REPORT, "report.html")} == \
        {k: v for k, v in before.items() if k != "report.html"}


def test_reuse_outputs_without_outputs_exits_2(cli, tmp_path):
    code, _, err = cli("--train", tmp_path / "t", "--rollout", tmp_path / "r", "--out-dir", tmp_path,
                       "--reuse-outputs")
    assert code == 2
    assert "output_2_mapping.json" in one_line_error(err)


@pytest.mark.parametrize("damage", ["schema", "not_json"])
def test_reuse_outputs_with_damaged_output_exits_2(analyze, cli, tmp_path, damage):
    res = analyze([F.PermuteQKV("rollout", 1)])
    out = tmp_path / "out"
    shutil.copytree(res.out, out)
    path = out / "output_3_value_compare.json"
    if damage == "schema":
        doc = json.loads(path.read_text())
        doc["schema_version"] = "9.0"
        path.write_text(json.dumps(doc))
    else:
        path.write_text("{")
    code, _, err = cli("--train", res.train, "--rollout", res.rollout, "--out-dir", out, "--reuse-outputs")
    assert code == 2
    assert "output_3_value_compare.json" in one_line_error(err)


def test_reuse_outputs_with_malformed_output_4_is_an_input_error(analyze, cli, tmp_path):
    res = analyze([F.PermuteQKV("rollout", 1)])
    out = tmp_path / "out"
    shutil.copytree(res.out, out)
    path = out / "output_4_module_analysis.json"
    doc = json.loads(path.read_text())
    doc["modules"] = [{"pid": "P0000"}]
    path.write_text(json.dumps(doc))
    code, _, err = cli("--train", res.train, "--rollout", res.rollout, "--out-dir", out, "--reuse-outputs",
                       "--fail-on-finding")
    assert "Traceback" not in err
    assert code == 2


# --- pass-through options ----------------------------------------------------------------------

def test_compare_options_are_passed_through():
    from rootcause import cli as rcli

    args = rcli.build_parser().parse_args([
        "--train", "T", "--rollout", "R", "--out-dir", "O", "--train-family", "hf", "--rollout-family", "vllm",
        "--train-step", "3", "--rollout-rank", "1", "--naming", "n.yaml", "--tolerances", "t.yaml",
        "--format", "sglang", "--statistics-only", "--reuse-outputs", "--fail-on-finding", "--quiet"])
    argv = rcli._compare_argv(args)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert argv[:6] == ["--train", "T", "--rollout", "R", "--out-dir", "O"]
    assert {"--train-family": "hf", "--rollout-family": "vllm", "--train-step": "3", "--rollout-rank": "1",
            "--naming": "n.yaml", "--tolerances": "t.yaml", "--format": "sglang"}.items() <= pairs.items()
    assert "--statistics-only" in argv
    # options of this script only are not given to the compare step
    assert not {"--reuse-outputs", "--fail-on-finding", "--quiet"} & set(argv)


def test_statistics_only_on_a_tensor_dump(analyze, cli, tmp_path):
    res = analyze([F.CorruptWeight("rollout", "gate", 1)], task="tensor")
    out = tmp_path / "out"
    code, _, err = cli("--train", res.train, "--rollout", res.rollout, "--out-dir", out, "--statistics-only",
                       "--quiet")
    assert code == 0, err
    doc = json.loads((out / REPORT).read_text())
    assert doc["mode"] == "statistics" and res.doc["mode"] == "tensor"
    assert doc["root_causes"][0]["rollout_module"] == "model.layers.1.mlp.gate_up_proj"


@pytest.mark.parametrize("option,text,key", [
    ("--naming", "roles:\n  - {role: down, block: mlp, local: ['mlp\\.(dense']}\n", "roles[0].local[0]"),
    ("--tolerances", "statistics:\n  bfloat16: loose\n", "statistics.bfloat16"),
], ids=["naming", "tolerances"])
def test_malformed_user_yaml_exits_2_naming_file_and_key(tmp_path, script, option, text, key):
    train, rollout = small_pair(tmp_path / "pair")
    bad = tmp_path / "user.yaml"
    bad.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    res = script(SCRIPT, "--train", train, "--rollout", rollout, "--out-dir", out, option, bad)
    assert res.code == 2, res.err
    line = one_line_error(res.err)
    assert line.startswith("error: ") and str(bad) in line and f"key '{key}'" in line
    assert not (out / REPORT).exists()


def test_pass_through_options_are_declared_as_run_compare_declares_them():
    # Issue 14: this skill keeps its own parser (it imports nothing from the compare skill at run
    # time); every compare option must be declared alike here and passed through unchanged.
    from dumpcompare.cli import build_parser as compare_parser
    from rootcause import cli as rcli

    theirs = {a.dest: a for a in compare_parser()._actions}
    ours = {a.dest: a for a in rcli.build_parser()._actions}
    passed = {"train", "rollout", "out_dir", *rcli.PASS_THROUGH_VALUES, *rcli.PASS_THROUGH_FLAGS}
    # --quiet is given to the compare step by sibling.run, --help is argparse's own.
    assert set(theirs) - {"help", "quiet"} == passed
    for dest in sorted(passed):
        a, b = theirs[dest], ours[dest]
        assert (a.option_strings, a.choices, a.nargs, a.const, a.required, type(a)) == \
            (b.option_strings, b.choices, b.nargs, b.const, b.required, type(b)), dest
        for text in ("1", "0", "-3", "x"):          # same converter: same value or same refusal
            outcomes = []
            for action in (a, b):
                try:
                    outcomes.append(action.type(text) if action.type else text)
                except (ValueError, TypeError, argparse.ArgumentTypeError):
                    outcomes.append("refused")
            assert outcomes[0] == outcomes[1], (dest, text, outcomes)
    argv = ["--train", "T", "--rollout", "R", "--out-dir", "O"]
    for dest in rcli.PASS_THROUGH_VALUES:
        action = ours[dest]
        argv += [action.option_strings[0], action.choices[-1] if action.choices else "2"]
    argv += [ours[d].option_strings[0] for d in rcli.PASS_THROUGH_FLAGS]
    got = vars(compare_parser().parse_args(rcli._compare_argv(rcli.build_parser().parse_args(argv))))
    want = vars(rcli.build_parser().parse_args(argv))
    assert {d: got[d] for d in passed} == {d: want[d] for d in passed}


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_below_one_is_a_usage_error(jobs, capsys):
    from rootcause import cli as rcli
    with pytest.raises(SystemExit) as exc:
        rcli.build_parser().parse_args(["--train", "T", "--rollout", "R", "--out-dir", "O", "--jobs", jobs])
    assert exc.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    """`... | head -1`: both scripts exit 0 and print no traceback when stdout closes early."""
    import subprocess
    import sys
    pair = Path(__file__).resolve().parents[1] / "data" / "real" / "llama_tp1_fp32_stale_rollout"
    repo = Path(__file__).resolve().parents[2]
    for i, script in enumerate((repo / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py",
                                repo / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py")):
        proc = subprocess.Popen([sys.executable, str(script), "--train", str(pair / "train"), "--rollout",
                                 str(pair / "rollout"), "--out-dir", str(tmp_path / f"o{i}")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()          # the reader is gone before the summary is printed
        err = proc.stderr.read().decode()
        assert proc.wait() == 0 and "Traceback" not in err, err
