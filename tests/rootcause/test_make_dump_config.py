"""make_dump_config.py: the msprobe config for an L0 dump, and which modules its layer scope keeps.

msprobe keeps a module when any entry of the task's ``list`` is a substring of its dump name
(msprobe 26.2 ``core/dump/data_dump/scope.py``, checked by a real dump in references/dumping.md);
the tests apply that rule to the dump names of every engine layout the synthetic generator writes.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from synth import Config, run_side

SCRIPT = Path(__file__).resolve().parents[2] / "rl-consistency-analysis" / "scripts" / "make_dump_config.py"
CFG = Config(layers=4, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=6)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def kept(names: list[str], keys: list[str]) -> list[str]:
    return [k for k in keys if any(n in k for n in names)]


@pytest.mark.parametrize("layout", ["hf", "hf_fsdp", "vllm", "sglang", "megatron"])
def test_layer_scope_keeps_those_layers_and_the_model_ends(tmp_path, layout):
    out = tmp_path / "config.json"
    res = run("--out", out, "--dump-path", tmp_path / "dump", "--layers", "1-2", "--task", "tensor")
    assert res.returncode == 0, res.stderr
    cfg = json.loads(out.read_text())
    assert cfg["task"] == "tensor" and cfg["level"] == "L0" and cfg["tensor"]["data_mode"] == ["forward"]
    keys = [e.key for e in run_side(CFG, layout, ())]
    selected = kept(cfg["tensor"]["list"], keys)
    layers = {int(m.group(1)) for k in selected if (m := re.search(r"layers\.(\d+)\.", k))}
    assert layers == {1, 2}
    every_layer_module = [k for k in keys if re.search(r"layers\.[12]\.", k)]
    assert set(every_layer_module) <= set(selected)
    # the embedding and the logits module are kept, so the dump shows the input and the output
    assert any("embed" in k for k in selected)
    assert any(s in k for k in selected for s in ("lm_head", "logits_processor", "output_layer"))


def test_statistics_md5_and_all_layers(tmp_path):
    out = tmp_path / "c.json"
    res = run("--out", out, "--dump-path", "d", "--summary-mode", "md5", "--steps", "0", "--ranks", "0", "1")
    assert res.returncode == 0, res.stderr
    cfg = json.loads(out.read_text())
    assert cfg["statistics"] == {"scope": [], "list": [], "data_mode": ["forward"], "summary_mode": "md5"}
    assert cfg["step"] == [0] and cfg["rank"] == [0, 1] and "precision" not in cfg


@pytest.mark.parametrize("args,needle", [
    (("--layers", "3-1"), "runs backwards"),
    (("--layers", "x"), "--layers"),
    (("--task", "tensor", "--summary-mode", "md5"), "--summary-mode"),
])
def test_bad_options_exit_2_with_one_line_and_write_nothing(tmp_path, args, needle):
    out = tmp_path / "c.json"
    res = run("--out", out, "--dump-path", "d", *args)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_help():
    res = run("--help")
    assert res.returncode == 0 and "--layers" in res.stdout and "L1" in res.stdout
