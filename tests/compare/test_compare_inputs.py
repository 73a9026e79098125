"""Input handling of the CLI: bad inputs, step/rank folders, truncated dumps, the generic format."""
import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from compare.test_compare_support import OUTPUT_JSON, ROOT, SAMPLES, SCRIPT, run_cli
from dumpcompare.cli import main as cli_main
from dumpcompare.loaders import load_path
from dumpcompare.loaders.msprobe import parse_key

LLAMA = SAMPLES / "llama_L0_statistics" / "step0" / "proc0" / "dump.json"
LLAMA_BAD = SAMPLES / "llama_L0_statistics_perturbed" / "step0" / "proc0" / "dump.json"


def cli(*args):
    """Run the CLI as a real process (exit code, stdout and stderr as a user sees them)."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def cli_in_process(capsys):
    """The same CLI in this process (faster); returns an object like subprocess.CompletedProcess."""
    def run(*args):
        rc = cli_main([str(a) for a in args])
        cap = capsys.readouterr()
        return SimpleNamespace(returncode=rc, stdout=cap.out, stderr=cap.err)
    return run


def assert_usage_error(proc, out_dir, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for w in words:
        assert w in lines[0]
    assert not out_dir.exists()


def two_step_folder(root):
    for step in ("step0", "step1"):
        (root / step / "rank0").mkdir(parents=True)
        shutil.copy(LLAMA if step == "step0" else LLAMA_BAD, root / step / "rank0" / "dump.json")
    return root


@pytest.mark.parametrize("case", ["missing", "not_json", "empty", "array", "no_data", "empty_folder",
                                  "bad_naming", "bad_tolerances"])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, case, cli_in_process):
    bad = tmp_path / "bad.json"
    extra = []
    target = bad
    if case == "missing":
        words = ["does not exist"]
    elif case == "not_json":
        bad.write_text("hello\n")
        words = ["not a dump"]
    elif case == "empty":
        bad.write_text("")
        words = ["empty file"]
    elif case == "array":
        bad.write_text("[1, 2]")
        words = ["expected a JSON object"]
    elif case == "no_data":
        bad.write_text('{"task": "statistics", "level": "L0"}')
        words = ["no 'data' object", "level, task"]
    elif case == "empty_folder":
        target = tmp_path / "empty"
        target.mkdir()
        words = ["no dump.json found"]
    else:
        target = LLAMA
        bad.write_text("- not: [a mapping")
        extra = ["--naming" if case == "bad_naming" else "--tolerances", bad]
        words = ["bad.json"]
    out = tmp_path / "out"
    run = cli if case == "missing" else cli_in_process      # one real process is enough
    proc = run("--train", target, "--rollout", LLAMA_BAD, "--out-dir", out, *extra)
    assert_usage_error(proc, out, str(bad if extra else target), *words)


def test_folder_with_two_steps_needs_train_step(tmp_path, cli_in_process):
    cli = cli_in_process
    root = two_step_folder(tmp_path / "train")
    out = tmp_path / "out"
    proc = cli("--train", root, "--rollout", LLAMA, "--out-dir", out)
    assert_usage_error(proc, out, "holds 2 dumps", "steps: 0, 1", "--train-step")
    proc = cli("--train", root, "--train-step", "9", "--rollout", LLAMA, "--out-dir", out)
    assert_usage_error(proc, out, "no dump.json matches")
    proc = cli("--train", root, "--train-step", "1", "--rollout", LLAMA, "--out-dir", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "output_4_module_analysis.json").read_text())
    assert doc["first_divergence"]["train_modules"] == ["model.layers.1.mlp.down_proj"]
    src = json.loads((out / "output_1_key_mapping.json").read_text())["sources"]["train"]["path"]
    assert src.endswith("step1/rank0/dump.json")


def test_each_side_chooses_its_own_step_and_rank(tmp_path):
    train = two_step_folder(tmp_path / "train")
    rollout = tmp_path / "rollout"
    for rank in ("rank0", "rank1"):
        (rollout / "step3" / rank).mkdir(parents=True)
        shutil.copy(LLAMA_BAD if rank == "rank1" else LLAMA, rollout / "step3" / rank / "dump.json")
    out = run_cli(train, rollout, tmp_path / "out", "--train-step", "step0", "--rollout-rank", "rank1")
    assert out.first["train_modules"] == ["model.layers.1.mlp.down_proj"]
    assert out.d1["sources"]["rollout"]["path"].endswith("step3/rank1/dump.json")


def test_msprobe_8x_rank_folder_and_26x_proc_folder(tmp_path):
    for layout in ("step0/rank", "step0/proc1234"):
        d = tmp_path / layout.replace("/", "_") / layout
        d.mkdir(parents=True)
        shutil.copy(LLAMA, d / "dump.json")
        out = run_cli(tmp_path / layout.replace("/", "_"), LLAMA_BAD, tmp_path / f"out_{d.name}")
        assert out.first["status"] == "parameter_mismatch"


def test_out_dir_that_is_a_file_is_refused(tmp_path, cli_in_process):
    cli = cli_in_process
    f = tmp_path / "file"
    f.write_text("x")
    proc = cli("--train", LLAMA, "--rollout", LLAMA_BAD, "--out-dir", f)
    assert proc.returncode == 2 and "--out-dir exists and is not a folder" in proc.stderr
    assert f.read_text() == "x"


def test_truncated_dump_is_salvaged_and_marked_partial(tmp_path):
    cut = tmp_path / "dump.json"
    cut.write_bytes(LLAMA_BAD.read_bytes()[:30000])
    out_dir = tmp_path / "out"
    proc = cli("--train", LLAMA, "--rollout", cut, "--out-dir", out_dir)
    assert proc.returncode == 0, proc.stderr
    assert "PARTIAL rollout: file ends in the middle of a value (truncated)" in proc.stdout
    docs = [json.loads((out_dir / n).read_text()) for n in OUTPUT_JSON]
    assert all(d["partial"] is True for d in docs)
    src = docs[0]["sources"]["rollout"]
    sal = src["salvage"]
    assert src["partial"] is True and 0 < sal["byte_offset"] <= 30000
    assert sal["entries_recovered"] == src["entries"] > 0
    assert sal["last_complete_key"].startswith("Module.") and "truncated" in sal["reason"]
    assert docs[0]["sources"]["train"]["salvage"] is None
    # Every train module past the cut is listed as one-sided, none is dropped.
    s = docs[1]["summary"]
    assert s["train_modules"] == s["mapped_train_modules"] + s["train_only"] and s["train_only"] > 0
    assert "Partial analysis" in (out_dir / "output_4_module_analysis.md").read_text()


def test_tolerances_file_changes_the_verdict(tmp_path):
    tol = tmp_path / "tol.yaml"
    tol.write_text("statistics: {float32: 1.0}\n")
    out = run_cli(LLAMA, LLAMA_BAD, tmp_path / "out", "--tolerances", tol)
    assert out.first["pair"] is None and out.d3["tolerances"]["statistics"]["float32"] == 1.0


# -- generic JSON format --------------------------------------------------------------------------

def to_generic(dump_json, dest):
    """Convert the forward module entries of a msprobe dump.json into the generic format."""
    doc = json.loads(dump_json.read_text(encoding="utf-8"))

    def lower(item):
        if isinstance(item, dict):
            return {k.lower() if k in ("Max", "Min", "Mean", "Norm") else k: lower(v)
                    for k, v in item.items()}
        return [lower(x) for x in item] if isinstance(item, list) else item

    modules = []
    for key, entry in doc["data"].items():
        kind, path, cls, direction, call = parse_key(key)
        if kind == "module" and direction == "forward":
            modules.append({"name": path, "class": cls, "call": call, "inputs": lower(entry["input_args"]),
                            "kwargs": lower(entry["input_kwargs"]), "outputs": lower(entry["output"]),
                            "parameters": lower(entry["parameters"])})
    dest.write_text(json.dumps({"format": "dumpcompare-generic/1", "task": "statistics",
                                "modules": modules}), encoding="utf-8")
    return dest


def test_generic_format_gives_the_same_finding(tmp_path):
    generic = to_generic(LLAMA, tmp_path / "train.json")
    out = run_cli(generic, LLAMA_BAD, tmp_path / "out")
    assert out.d1["sources"]["train"]["format"] == "generic"
    assert out.summary["pairs_by_kind"] == {"one_to_one": 31}
    assert (out.first["train_modules"], out.first["status"]) == (["model.layers.1.mlp.down_proj"],
                                                                  "parameter_mismatch")


def test_documented_generic_example_loads(tmp_path):
    text = (ROOT / "dump-module-mapping-value-compare" / "references" / "input_formats.md").read_text()
    example = text.split("## Generic JSON format", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    f = tmp_path / "generic.json"
    f.write_text(example, encoding="utf-8")
    dump = load_path(f)
    assert dump.fmt == "generic" and dump.entries
    leaves = {lf.name: lf for e in dump.entries for lf in e.leaves}
    assert "output.0" in leaves and "parameters.weight" in leaves
    assert all(lf.norm is not None for lf in leaves.values() if lf.is_tensor)


@pytest.mark.parametrize("doc, words", [
    ({"format": "dumpcompare-generic/1"}, "needs a 'modules' list"),
    ({"format": "dumpcompare-generic/1", "modules": [{"class": "Linear"}]},
     "modules[0] needs a string 'name'"),
])
def test_malformed_generic_dump_is_a_usage_error(tmp_path, doc, words, cli_in_process):
    f = tmp_path / "g.json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert_usage_error(cli_in_process("--train", f, "--rollout", LLAMA, "--out-dir", out), out, words)
