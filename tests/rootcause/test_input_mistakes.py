"""Inputs a tired engineer passes by mistake (issue 26): each one line naming the problem and the fix;
exit 2 where nothing useful can run, otherwise a note first on the console, in output_5 notes and
at the top of report.html. All on committed dumps."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
COMPARE = REPO / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
REAL = REPO / "tests" / "data" / "real"
MSPROBE = REPO / "tests" / "data" / "msprobe"
STATS = REAL / "llama_tp1_fp32_stale_rollout"
TENSOR = REAL / "llama_tp1_tensor_stale_rollout"
REPORT = "output_5_root_cause_report.json"


def run(*argv, script=SCRIPT, python=()):
    proc = subprocess.run([sys.executable, *python, str(script), *map(str, argv)], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def noted_everywhere(out: Path, stdout: str, words: str) -> str:
    """The note leads the console, output_5 notes and report.html (before the first chart)."""
    first = stdout.splitlines()[0]
    assert first.startswith("note: ") and words in first, stdout
    doc = json.loads((out / REPORT).read_text(encoding="utf-8"))
    assert words in doc["notes"][0] and doc["notes"][0] == doc["answer"]["input_notes"][0]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert words in page.split("<svg")[0]
    return first


def test_the_same_dump_on_both_sides_exits_2(tmp_path):
    code, _out, err = run("--train", STATS / "train", "--rollout", STATS / "train", "--out-dir", tmp_path / "o")
    assert code == 2
    line = one_line(err)
    assert "--train and --rollout are the same dump" in line and "rollout engine's dump as --rollout" in line
    assert not (tmp_path / "o").exists()


def test_a_byte_identical_copy_is_called_one_dump(tmp_path):
    shutil.copytree(STATS / "train", tmp_path / "copy")
    code, out, err = run("--train", STATS / "train", "--rollout", tmp_path / "copy", "--out-dir", tmp_path / "o")
    assert code == 0, err
    noted_everywhere(tmp_path / "o", out, "both sides are one dump")


def test_swapped_sides_are_named_and_the_labels_kept(tmp_path):
    # An HF tree passed as --rollout and a vLLM tree as --train.
    code, out, err = run("--train", STATS / "rollout", "--rollout", STATS / "train", "--out-dir", tmp_path / "o")
    assert code == 0, err
    line = noted_everywhere(tmp_path / "o", out, "train and rollout look swapped")
    assert "--train dump looks like vLLM" in line and "--rollout dump like Hugging Face" in line
    doc = json.loads((tmp_path / "o" / REPORT).read_text(encoding="utf-8"))
    # no silent swap: 'train' is still the --train dump (the vLLM one) in every output
    assert doc["sides"]["train"]["family"] == "vllm" and doc["sides"]["rollout"]["family"] == "hf"
    assert doc["inputs"]["train"] == str(STATS / "rollout")


def test_pairs_in_the_usual_order_or_of_one_kind_give_no_swap_warning(tmp_path):
    code, out, _ = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", tmp_path / "a")
    assert code == 0 and "swapped" not in out
    sglang = REAL / "sglang_llama_tp1_fp32_clean" / "rollout"
    code, out, _ = run("--train", STATS / "rollout", "--rollout", sglang, "--out-dir", tmp_path / "b")
    assert code == 0 and "swapped" not in out


def test_tensor_files_missing_say_how_many_and_that_statistics_were_used(tmp_path):
    shutil.copytree(TENSOR, tmp_path / "pair")
    removed = [p for p in (tmp_path / "pair" / "rollout").rglob("*.pt")]
    for p in removed:
        p.unlink()
    assert removed
    code, out, err = run("--train", tmp_path / "pair" / "train", "--rollout", tmp_path / "pair" / "rollout",
                         "--out-dir", tmp_path / "o")
    assert code == 0, err
    line = noted_everywhere(tmp_path / "o", out, "tensor files missing")
    compared = json.loads((tmp_path / "o" / "output_3_value_compare.json").read_text())["results"]
    # every rollout tensor is gone, so every comparison fell back to the statistics
    assert f"{len(compared)} of {len(compared)} comparisons" in line and "used the statistics" in line


def test_token_ids_without_model_are_not_ignored_silently(tmp_path):
    code, out, err = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", tmp_path / "o",
                         "--token-ids", "[1, 2, 3]")
    assert code == 0, err
    line = noted_everywhere(tmp_path / "o", out, "--token-ids was ignored")
    assert "--model" in line


def test_token_ids_in_another_form_says_which_form_it_takes(tmp_path):
    code, _out, err = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", tmp_path / "o",
                          "--model", REAL / "_models" / "llama", "--token-ids", "1,2,3")
    assert code == 2
    assert "JSON list of integers such as [1, 2, 3]" in one_line(err)


def test_given_token_ids_are_never_asked_for_again(tmp_path):
    code, _out, err = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", tmp_path / "o",
                          "--model", REAL / "_models" / "llama", "--token-ids", "[1, 2]")
    assert code == 0, err
    doc = json.loads((tmp_path / "o" / REPORT).read_text(encoding="utf-8"))
    reason = json.dumps(doc["reference_forward"])
    assert "2 ids" in reason and "give the ids with --token-ids" not in reason


@pytest.mark.parametrize("out_dir", ["/proc/rootcause-out", "/proc/self/status/x"])
def test_an_out_dir_that_cannot_be_written_is_an_input_error(tmp_path, out_dir):
    code, _out, err = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", out_dir)
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"error: {out_dir}: --out-dir ") and "internal error" not in line


def test_construct_json_is_named_with_the_dump_beside_it(tmp_path):
    construct = MSPROBE / "llama_L0_statistics" / "step0" / "proc0" / "construct.json"
    code, _out, err = run("--train", construct, "--rollout", STATS / "rollout", "--out-dir", tmp_path / "o")
    assert code == 2
    line = one_line(err)
    assert "msprobe's construct.json (module tree), not the dump" in line
    assert str(construct.with_name("dump.json")) in line and len(line) < 400


def test_missing_numpy_is_one_line_with_the_install_command(tmp_path):
    # -S: no site-packages, so neither numpy nor pyyaml can be imported
    code, _out, err = run("--help", script=COMPARE, python=("-S",))
    assert code == 2
    line = one_line(err)
    assert "numpy" in line and "not installed" in line
    assert "pip install -r" in line and line.endswith("dump-module-mapping-value-compare/requirements.txt")


def test_a_folder_of_unrelated_dumps_is_not_read_as_pipeline_ranks(tmp_path):
    # Two whole models (each fed the token ids) in one folder, as a user collects dumps of two runs.
    for rank, case in ((0, "llama_tp1_fp32_clean"), (1, "qwen3_tp1_bf16_clean")):
        (tmp_path / "dumps" / f"rank{rank}").mkdir(parents=True)
        found = sorted((REAL / case / "train").rglob("dump.json"))
        shutil.copy(found[0], tmp_path / "dumps" / f"rank{rank}" / "dump.json")
    code, _out, err = run("--train", tmp_path / "dumps", "--rollout", REAL / "llama_tp1_fp32_clean" / "rollout",
                          "--out-dir", tmp_path / "o")
    assert code == 2
    line = one_line(err)
    assert "not pipeline stages of one model" in line and "dumps of different runs, pass the one you mean" in line


def test_the_compare_step_alone_names_an_out_dir_it_cannot_create(tmp_path):
    code, _out, err = run("--train", STATS / "train", "--rollout", STATS / "rollout", "--out-dir", "/proc/compare-out",
                          "--quiet", script=COMPARE)
    assert code == 2
    line = one_line(err)
    assert line.startswith("error: /proc/compare-out: --out-dir cannot be created") and "internal error" not in line
