"""dump_vllm.py and dump_trainer.py without vLLM or torch: --help, the one-line message when a
package is missing, and bad input (exit 2, one line, nothing written)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "rl-consistency-analysis" / "scripts"
MODEL = ROOT / "tests" / "data" / "real_vllm" / "_models" / "llama"
CLEAN = ROOT / "tests" / "data" / "real_vllm" / "llama_clean_stats_onestep"

# Makes the named top-level packages unimportable even where they are installed.
_BLOCKER = """
import sys, runpy
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('No module named ' + repr(name))
sys.meta_path.insert(0, Block())
sys.argv = [{script!r}] + {args!r}
runpy.run_path({script!r}, run_name='__main__')
"""


def _run(script, args, blocked=("vllm", "torch", "transformers", "msprobe")):
    code = _BLOCKER.format(blocked=set(blocked), script=str(SCRIPTS / script), args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script, options", [
    ("dump_vllm.py", ["--model", "--prompt-ids", "--max-tokens", "--per-call", "--tp", "--hf-overrides",
                      "--logprobs", "--task", "--layers", "--out"]),
    ("dump_trainer.py", ["--model", "--tokens", "--temperature", "--dtype", "--task", "--layers", "--out"]),
    ("check_weight_sync.py", ["--model", "--engine-model", "--tp", "--dtype", "--out-dir"]),
])
def test_help_works_without_the_engines(script, options):
    res = _run(script, ["--help"])
    assert res.returncode == 0, res.stderr
    for opt in options:
        assert opt in res.stdout


def _one_line_error(res, *pieces):
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for piece in pieces:
        assert piece in lines[0], lines[0]


def test_dump_vllm_names_the_missing_package(tmp_path):
    res = _run("dump_vllm.py", ["--model", str(MODEL), "--prompt-ids", "[5, 6, 7]", "--max-tokens", "2",
                                "--out", str(tmp_path / "out")])
    _one_line_error(res, "needs vLLM", "pip install vllm")
    assert not (tmp_path / "out").exists()


def test_dump_trainer_names_the_missing_package(tmp_path):
    res = _run("dump_trainer.py", ["--model", str(MODEL), "--tokens", str(CLEAN / "tokens.json"),
                                   "--out", str(tmp_path / "out")])
    _one_line_error(res, "needs torch", "pip install torch")
    assert not (tmp_path / "out").exists()


def test_check_weight_sync_names_the_missing_package(tmp_path):
    res = _run("check_weight_sync.py", ["--model", str(MODEL), "--out-dir", str(tmp_path / "out")])
    _one_line_error(res, "needs vLLM", "pip install vllm")
    assert not (tmp_path / "out").exists()


def test_check_weight_sync_needs_safetensors_in_the_reference(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    res = _run("check_weight_sync.py", ["--model", str(tmp_path), "--out-dir", str(tmp_path / "out")])
    _one_line_error(res, "no *.safetensors")


@pytest.mark.parametrize("args, piece", [
    (["--prompt-ids", "[5, -1]", "--max-tokens", "2"], "non-negative integer"),
    (["--prompt-ids", "[[5, 6], [7, 999]]", "--max-tokens", "2"], "prompt 1: token id 999 is outside"),
    (["--prompt-ids", "no_such_file.json", "--max-tokens", "2"], "neither JSON nor an existing file"),
    (["--prompt-ids", "[5, 6]", "--max-tokens", "0"], "--max-tokens"),
    (["--prompt-ids", "[5, 999]", "--max-tokens", "1"], "outside the model's vocabulary (256)"),
    (["--prompt-ids", "[5, 6]", "--max-tokens", "2", "--hf-overrides", "[1]"], "JSON object"),
])
def test_dump_vllm_bad_input(tmp_path, args, piece):
    res = _run("dump_vllm.py", ["--model", str(MODEL), "--out", str(tmp_path / "out"), *args])
    _one_line_error(res, piece)
    assert not (tmp_path / "out").exists()


def test_dump_vllm_refuses_a_model_folder_without_config(tmp_path):
    res = _run("dump_vllm.py", ["--model", str(tmp_path), "--prompt-ids", "[5]", "--max-tokens", "1",
                                "--out", str(tmp_path / "out")])
    _one_line_error(res, "no config.json")


def test_an_earlier_dump_is_never_overwritten(tmp_path):
    earlier = tmp_path / "out" / "train" / "step0"
    earlier.mkdir(parents=True)
    (earlier / "dump.json").write_text("{}")
    res = _run("dump_trainer.py", ["--model", str(MODEL), "--tokens", str(CLEAN / "tokens.json"),
                                   "--out", str(tmp_path / "out")])
    _one_line_error(res, "already exists")
    assert (earlier / "dump.json").read_text() == "{}"


@pytest.mark.parametrize("doc, piece", [
    ({"prompt_ids": [1, 2]}, "'prompt_ids' and 'response_ids'"),
    ({"prompt_ids": [1, 2], "response_ids": []}, "response_ids"),
    ([1, 2, 3], "'prompt_ids' and 'response_ids'"),
])
def test_dump_trainer_bad_tokens_file(tmp_path, doc, piece):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(doc))
    res = _run("dump_trainer.py", ["--model", str(MODEL), "--tokens", str(tokens), "--out", str(tmp_path / "o")])
    _one_line_error(res, str(tokens), piece)
