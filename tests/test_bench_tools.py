"""tools/bigdump.py writes valid msprobe dumps; tools/bench.py runs and prints its ratios.

No timing assertions: the bench's numbers depend on the machine. The runs of whole bench and
size-targeted dumps are marked ``slow`` (``make test-slow``; .ci/run runs them).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIGDUMP = ROOT / "tools" / "bigdump.py"
BENCH = ROOT / "tools" / "bench.py"
KEY = re.compile(r"^Module\.[A-Za-z_][\w.]*\.[A-Za-z_]\w*\.forward\.\d+$")


def _run(cmd, **kw):
    proc = subprocess.run([sys.executable, *map(str, cmd)], capture_output=True, text=True,
                          timeout=120, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc


def _bigdump(out, *args):
    proc = _run([BIGDUMP, "--out", out, "--layers", "2", *args])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bigdump_writes_msprobe_dumps(tmp_path):
    summary = _bigdump(tmp_path, "--calls", "3", "--steps", "2", "--ranks", "2")
    assert summary["calls"] == 3
    assert len(summary["files"]) == 8
    docs = {}
    for side in ("train", "rollout"):
        for s in range(2):
            for r in range(2):
                folder = tmp_path / side / f"step{s}" / f"rank{r}"
                text = (folder / "dump.json").read_text()
                doc = json.loads(text)
                # msprobe layout: indent=1, bare NaN/Infinity tokens (json.dumps round trip).
                assert json.dumps(doc, indent=1) == text
                for token in (": NaN", ": Infinity", ": -Infinity"):
                    assert token in text, (side, token)
                assert [k for k in doc if k != "data"] == ["task", "level", "framework",
                                                          "dump_data_dir"]
                assert doc["task"] == "statistics" and doc["level"] == "L0"
                assert all(KEY.match(k) for k in doc["data"]), side
                construct = json.loads((folder / "construct.json").read_text())
                assert set(construct) == set(doc["data"])
                assert all(p is None or p in construct for p in construct.values())
                docs[side, s, r] = doc["data"]
    train, rollout = docs["train", 0, 0], docs["rollout", 0, 0]
    for n in range(3):
        assert f"Module.model.layers.1.self_attn.q_proj.Linear.forward.{n}" in train
        assert f"Module.model.layers.1.mlp.down_proj.Linear.forward.{n}" in train
        assert f"Module.model.layers.1.self_attn.qkv_proj.QKVParallelLinear.forward.{n}" in rollout
        assert f"Module.model.layers.1.mlp.gate_up_proj.MergedColumnParallelLinear.forward.{n}" \
            in rollout
    # The structure of a synth entry: HF attention takes kwargs only (with the -inf mask),
    # vLLM row-parallel linears return [y, null].
    attn = train["Module.model.layers.0.self_attn.LlamaAttention.forward.1"]
    assert attn["input_args"] == [] and attn["input_kwargs"]["attention_mask"]["Mean"] == float("-inf")
    assert rollout["Module.model.layers.0.mlp.down_proj.RowParallelLinear.forward.2"]["output"][1] is None
    # Values vary per call, identically on both sides (no fault injected).
    emb_t = [train[f"Module.model.embed_tokens.Embedding.forward.{n}"]["output"][0]["Norm"]
             for n in range(3)]
    emb_r = [rollout[f"Module.model.embed_tokens.VocabParallelEmbedding.forward.{n}"]["output"][0]["Norm"]
             for n in range(3)]
    assert emb_t == emb_r and len(set(emb_t)) == 3
    # Other step/rank files hold other value sets.
    assert docs["train", 1, 1] != train


@pytest.mark.slow
def test_bigdump_size_target_and_fault(tmp_path):
    summary = _bigdump(tmp_path / "a", "--size-mb", "0.5", "--fault", "corrupt:rollout:gate:1")
    for side in ("train", "rollout"):
        assert 0.25e6 < summary["side_bytes"][side] < 1.0e6
    clean = _bigdump(tmp_path / "b", "--calls", str(summary["calls"]))
    key = "Module.model.layers.1.mlp.gate_up_proj.MergedColumnParallelLinear.forward.0"
    faulty = json.loads((tmp_path / "a/rollout/step0/rank0/dump.json").read_text())["data"][key]
    ok = json.loads((Path(clean["rollout"]) / "step0/rank0/dump.json").read_text())["data"][key]
    assert faulty["parameters"]["weight"] != ok["parameters"]["weight"]


@pytest.mark.slow
def test_bench_quick_prints_ratios(tmp_path):
    work = tmp_path / "w"
    proc = _run([BENCH, "--quick", "--size-mb", "0.1", "--layers", "2", "--tensor-hidden", "64",
                 "--tensor-seq-len", "8", "--tensor-vocab", "128", "--workdir", work])
    out = proc.stdout
    assert "median s" in out and "peak MB" in out
    for label in ("ratio statistics compare:", "ratio statistics root cause triage",
                  "ratio statistics end to end", "ratio tensor compare:",
                  "ratio tensor rootcause:"):
        line = next((ln for ln in out.splitlines() if ln.startswith(label)), None)
        assert line is not None, (label, out)
        assert re.search(r"= >?\d+\.\d\dx", line), line
    assert "json.load all files" in out and "tensor: np.load" in out
    assert re.search(r"verdict \(full run\): root_cause_found", out), out
    # Generated files are removed without --keep.
    assert not (work / "stats_pair").exists() and not (work / "tensor_pair").exists()


@pytest.mark.slow
def test_bench_keeps_and_reuses_the_pair(tmp_path):
    work = tmp_path / "w"
    args = [BENCH, "--size-mb", "0.2", "--layers", "2", "--stages", "json", "--repeat", "1",
            "--workdir", work, "--keep"]
    first = _run(args)
    assert (work / "stats_pair/train/step0/rank0/dump.json").is_file()
    assert "reusing" not in first.stderr
    second = _run(args)
    assert "reusing the statistics pair" in second.stderr
    assert "json.load all files" in second.stdout


def test_help():
    assert "--size-mb" in _run([BENCH, "--help"]).stdout
    assert "--size-mb" in _run([BIGDUMP, "--help"]).stdout
