"""Steps of the two sides are paired by the tokens they saw, not by their numbers."""
import json
from dataclasses import replace

from dumpcompare.cli import main as compare_main
from synth import Config, init_weights, run_side, write_dump

CFG = Config(layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=8)


def _write(root, layout, cfg, step):
    entries = run_side(cfg, layout, (), weights=init_weights(cfg))
    return write_dump(root / f"step{step}" / "rank0", entries)


def test_rollout_step_with_the_train_tokens_is_chosen(tmp_path, capsys):
    _write(tmp_path / "train", "hf", CFG, 0)
    _write(tmp_path / "rollout", "vllm", replace(CFG, seq_len=5), 0)   # another request
    _write(tmp_path / "rollout", "vllm", CFG, 1)                       # the same tokens as train
    _write(tmp_path / "rollout", "vllm", replace(CFG, seq_len=1), 2)   # a decode step
    out = tmp_path / "out"
    assert compare_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                         "--out-dir", str(out), "--quiet"]) == 0
    src = json.loads((out / "output_1_key_mapping.json").read_text())["sources"]["rollout"]
    assert "/step1/" in src["path"]
    assert "rollout step1 chosen: it saw the same tokens as the other side" in src["notes"]
    doc = json.loads((out / "output_4_module_analysis.json").read_text())
    assert doc["comparability"]["comparable"] and doc["first_divergence"]["pair"] is None


def test_no_step_with_the_same_tokens_is_an_input_error(tmp_path, capsys):
    _write(tmp_path / "train", "hf", CFG, 0)
    for step, n in ((0, 5), (1, 3)):
        _write(tmp_path / "rollout", "vllm", replace(CFG, seq_len=n), step)
    code = compare_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                         "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "no step of the rollout side saw the same tokens" in err and "--rollout-step" in err


def test_a_pinned_step_is_kept(tmp_path):
    _write(tmp_path / "train", "hf", CFG, 0)
    _write(tmp_path / "rollout", "vllm", CFG, 0)
    _write(tmp_path / "rollout", "vllm", replace(CFG, seq_len=5), 1)
    out = tmp_path / "out"
    assert compare_main(["--train", str(tmp_path / "train"), "--rollout", str(tmp_path / "rollout"),
                         "--rollout-step", "1", "--out-dir", str(out), "--quiet"]) == 0
    doc = json.loads((out / "output_4_module_analysis.json").read_text())
    assert not doc["comparability"]["comparable"]
