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
                 "--tensor-seq-len", "8", "--tensor-vocab", "128", "--gen-decode", "6", "--gen-layers", "2",
                 "--gen-hidden", "64", "--gen-vocab", "128", "--workdir", work])
    out = proc.stdout
    assert "median s" in out and "peak MB" in out
    for label in ("ratio statistics compare:", "ratio statistics root cause triage",
                  "ratio statistics end to end", "ratio tensor compare:",
                  "ratio tensor rootcause:", "ratio wide:", "ratio generation compare [small]:",
                  "ratio generation reference [small]:", "ratio many time:", "ratio many memory:",
                  "floor many encoding:", "floor many memory:"):
        line = next((ln for ln in out.splitlines() if ln.startswith(label)), None)
        assert line is not None, (label, out)
        assert re.search(r"= >?\d+\.\d\dx", line), line
    assert "json.load all files" in out and "tensor: np.load" in out
    assert re.search(r"verdict \(full run\): root_cause_found", out), out
    # Generated files are removed without --keep.
    assert not (work / "stats_pair").exists() and not (work / "tensor_pair").exists()
    assert not list(work.glob("wide_*")) and not list(work.glob("generation_*"))
    assert not (work / "many_pair").exists() and not (work / "tiny_pair").exists()


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


def _bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_tool", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_scale_lines_show_growth_against_the_smallest_set():
    bench = _bench_module()
    sets = [{"stage": "compare", "size_mb": s, "files": 16,
             "side_bytes": {"train": s * 1e6, "rollout": s * 1e6}, "largest_file_bytes": s * 1e6 / 8,
             "json_load_s": s / 10, "median_s": t, "peak_bytes": p}
            for s, t, p in ((400, 40.0, 600e6), (100, 10.0, 200e6), (200, 21.0, None))]
    [line] = bench.scale_lines(sets)
    assert line.startswith("scale statistics compare (16 files per set): 100 MB/side")
    cells = line.split(": ", 1)[1].split("; ")
    assert cells[0] == "100 MB/side (input x1.00): 10.00 s (x1.00), peak 200 MB (x1.00), 16.00x the largest file"
    # Sorted by input size; a stage without a measured peak still shows its time.
    assert cells[1] == "200 MB/side (input x2.00): 21.00 s (x2.10), peak -"
    assert cells[2] == "400 MB/side (input x4.00): 40.00 s (x4.00), peak 600 MB (x3.00), 12.00x the largest file"
    # One set per stage: nothing to scale.
    assert bench.scale_lines(sets[:1]) == []


@pytest.mark.slow
def test_bench_rank_sets_print_ratio_and_scale_lines(tmp_path):
    work = tmp_path / "w"
    proc = _run([BENCH, "--ranks", "8", "--sizes", "0.5,1", "--layers", "2", "--stages", "json,compare",
                 "--repeat", "1", "--workdir", work])
    out = proc.stdout.splitlines()
    for size in ("0.5", "1"):
        tag = f"[8 file(s) x {size} MB per side]"
        line = next(ln for ln in out if ln.startswith(f"ratio statistics compare {tag}:"))
        assert re.search(r"time / json\.load\(all files\) = \d+\.\d\dx .*"
                         r"peak memory / largest rank file = \d+\.\d\dx", line), line
        assert any(ln.startswith(f"json.load all files (sum of medians) {tag}") for ln in out)
        info = next(ln for ln in out if ln.startswith(f"statistics pair {tag}:"))
        assert "16 dump.json (1 step(s) x 8 rank(s) per side)" in info, info
    # 16 files per set: the per-file json.load rows are summed up, not listed.
    assert not any(ln.startswith("json.load train/") for ln in out)
    scale = next(ln for ln in out if ln.startswith("scale statistics compare (16 files per set): "))
    assert "0.5 MB/side (input x1.00)" in scale and re.search(r"1 MB/side \(input x\d\.\d\d\)", scale)
    assert not list(work.glob("stats_pair*"))


def test_bench_rejects_bad_sizes():
    proc = subprocess.run([sys.executable, str(BENCH), "--sizes", "100,abc"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "--sizes" in proc.stderr


@pytest.mark.slow
def test_bench_refmodel_memory_stays_near_one_layer(tmp_path):
    """The reference forward streams its weights: on a random Llama of ~180 MB (two layers of
    23 MB, embedding and head of 66 MB each) its peak over the interpreter's stays below a few
    layers' bytes, far below the checkpoint."""
    proc = _run([BENCH, "--stages", "refmodel", "--repeat", "1", "--refmodel-mb", "150",
                 "--refmodel-tokens", "16", "--workdir", tmp_path / "w"])
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ratio refmodel:"))
    over_layer, over_ckpt = map(float, re.search(r"= ([\d.]+)x the largest layer .*, ([\d.]+)x the checkpoint", line).groups())
    assert over_layer < 4.0 and over_ckpt < 0.5, line
    assert not (tmp_path / "w" / "refmodel_llama").exists()


@pytest.mark.slow
def test_bench_generation_prints_its_ratio_lines(tmp_path):
    """The generation stage at a small size: both ratio lines parse, the reference forward ran and
    matched the dumps on every call (no departure, so no fault simulation weighs on the time)."""
    work = tmp_path / "w"
    proc = _run([BENCH, "--stages", "generation,reftorch", "--repeat", "1", "--gen-prompt", "4", "--gen-decode",
                 "6", "--gen-layers", "2", "--gen-hidden", "64", "--gen-vocab", "128", "--gen-models", "small",
                 "--workdir", work])
    out = proc.stdout.splitlines()
    for label, target in (("ratio generation compare [small]:", "1.5x"),
                          ("ratio generation reference [small]:", "1.2x")):
        line = next((ln for ln in out if ln.startswith(label)), None)
        assert line is not None, (label, proc.stdout)
        assert re.search(r"= \d+\.\d\dx \(target <= " + re.escape(target) + r"\), cpu time ratio \d+\.\d\dx", line), line
        assert not line.endswith("]"), line        # no failed or stopped run (its status tag ends the line)
    adds = next(ln for ln in out if ln.startswith("what --model adds [small]:"))
    assert re.search(r"-?\d+\.\d\d s on 6 decode calls against -?\d+\.\d\d s on one forward", adds), adds
    info = next(ln for ln in out if ln.startswith("generation pair [small]:"))
    assert "vLLM prefill 4 + 6 decode calls in one dump" in info and "7 calls x" in info, info
    assert not any("[qwen3-0.6b]" in ln for ln in out)
    for what in ("one forward", "6 decode calls"):
        ref = next(ln for ln in out if ln.startswith(f"reference forward [small] ({what}):"))
        assert "ran True" in ref and "both sides match the reference" in ref, ref
    torch = next(ln for ln in out if ln.startswith("ratio reftorch:"))
    assert re.search(r"ratio reftorch: (skipped: torch not installed|numpy reference forward / transformers "
                     r"forward: time \d+\.\d\dx .* peak memory \d+\.\d\dx)", torch), torch
    assert not (work / "generation_small").exists()


def test_gendump_writes_the_vllm_generation_shape(tmp_path):
    import subprocess as sp
    proc = sp.run([sys.executable, str(ROOT / "tools" / "gendump.py"), "--out", str(tmp_path), "--prompt", "3",
                   "--decode", "2", "--layers", "2", "--hidden", "32", "--head-dim", "16", "--vocab", "64"],
                  capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    g = json.loads(proc.stdout.strip().splitlines()[-1])
    dec = json.loads(Path(g["files"]["rollout_decode"]).read_text())["data"]
    construct = json.loads((Path(g["files"]["rollout_decode"]).parent / "construct.json").read_text())
    assert all(KEY.match(k) for k in dec)
    rot = "Module.model.layers.0.self_attn.rotary_emb.RotaryEmbedding.forward."
    # One rotary module under layer 0, called per layer and per forward call: call * layers + layer.
    assert sorted(int(k[len(rot):]) for k in dec if k.startswith(rot)) == list(range(3 * 2))
    assert not any("layers.1.self_attn.rotary_emb" in k for k in dec)
    assert construct[rot + "3"] == "Module.model.layers.1.self_attn.LlamaAttention.forward.1"
    q = "Module.model.layers.1.self_attn.qkv_proj.QKVParallelLinear.forward."
    assert [dec[q + str(n)]["output"][0]["shape"][0] for n in range(3)] == [3, 1, 1]
    assert list(construct) == sorted(construct, key=lambda k: int(k.rsplit(".", 1)[1]) if rot not in k
                                     else int(k.rsplit(".", 1)[1]) // 2)
    train = json.loads(Path(g["files"]["train"]).read_text())["data"]
    assert all(k.endswith(".forward.0") for k in train)
    assert json.loads(Path(g["tokens"]).read_text()) and len(json.loads(Path(g["tokens"]).read_text())) == 5
    assert (Path(g["model"]) / "model.safetensors").is_file()


def test_manydump_calls_do_not_fold(tmp_path):
    """tools/manydump.py: both sides valid msprobe dumps whose calls stay entries of their own (the
    bench's many stage measures that shape), the same sequence lengths in the same calls."""
    sys.path.insert(0, str(ROOT / "tools"))
    import manydump
    from dumpcompare.loaders import load_path

    summary = manydump.write_pair(tmp_path, calls=3, layers=2)
    for side in ("train", "rollout"):
        dump = load_path(Path(summary["files"][side]))
        assert len(dump.entries) == summary["entries"][side] > 3
        assert {e.n_calls for e in dump.entries} == {1}
        json.loads((Path(summary["files"][side]).parent / "construct.json").read_text())
    # Tokens per call (HF adds a batch dimension that vLLM does not).
    shapes = {s: [lf.shape[-2] for e in load_path(Path(summary["files"][s])).entries
                  if "embed_tokens" in e.key for lf in e.leaves if lf.name.startswith("output")] for s in summary["files"]}
    assert shapes["train"] == shapes["rollout"] and len(set(shapes["train"])) == 2


def test_a_measured_command_reports_its_own_peak_not_the_benchs(tmp_path):
    """Linux carries a process's peak RSS over fork and exec: the bench holds 300 MB here, and the
    small command it measures must still report its own few MB (bench_launch.py starts it)."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import bench\n"
              "held = bytearray(300 * 2**20)\n"
              "for i in range(0, len(held), 4096): held[i] = 1\n"
              "small = bench.run_measured([sys.executable, '-c', 'pass'])\n"
              "grows = bench.run_measured([sys.executable, '-c', "
              "'x = bytearray(120 * 2**20)\\nfor i in range(0, len(x), 4096): x[i] = 1'])\n"
              "print(small.rc, small.maxrss // 2**20, grows.rc, grows.maxrss // 2**20)\n")
    proc = _run(["-c", script, ROOT / "tools"])
    rc_small, small_mb, rc_grows, grows_mb = map(int, proc.stdout.split())
    assert (rc_small, rc_grows) == (0, 0)
    assert small_mb < 100, small_mb             # not the caller's 300 MB
    assert 120 <= grows_mb < 250, grows_mb       # what the command itself touched
