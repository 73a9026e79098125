"""Shared helpers of the tests/fuzz tests: tiny dump pairs, dump editing, running the CLIs.

Imported by the test files as ``fuzz.fuzz_support`` (``tests/`` is on sys.path, see
tests/conftest.py); it holds no tests itself. The JSON helpers (objects with duplicate keys, NaN,
raw number tokens) come from tools/fuzz_dumps.py so that the tests and the fuzzer write the same
kind of text.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import fuzz_dumps  # noqa: E402  (tools/fuzz_dumps.py)
import synth  # noqa: E402
from dumpcompare.cli import main as compare_main  # noqa: E402
from fuzz_dumps import Obj, Raw, emit, parse  # noqa: E402,F401

COMPARE = fuzz_dumps.COMPARE
ROOTCAUSE = fuzz_dumps.ROOTCAUSE
SAMPLES = fuzz_dumps.SAMPLES
FUZZER = TOOLS / "fuzz_dumps.py"
TINY = dict(fuzz_dumps.TINY)
OUTPUT_JSON = ("output_1_key_mapping.json", "output_2_mapping.json", "output_3_value_compare.json",
               "output_4_module_analysis.json")

# A float activation, an integer tensor and a parameter that the hf/vllm tiny pair compares directly.
MLP_OUT = ("Module.model.layers.0.mlp.down_proj.Linear.forward.0", "output.0",
           "Module.model.layers.0.mlp.down_proj.RowParallelLinear.forward.0", "output.0")
TOKENS = ("Module.model.embed_tokens.Embedding.forward.0", "input_args.0",
          "Module.model.embed_tokens.VocabParallelEmbedding.forward.0", "input_args.0")
DOWN_W = ("Module.model.layers.0.mlp.down_proj.Linear.forward.0", "parameters.weight",
          "Module.model.layers.0.mlp.down_proj.RowParallelLinear.forward.0", "parameters.weight")


def tiny_pair(root: Path, task: str = "statistics", tensor_format: str = "npy", faults=(), **cfg):
    """Write a tiny hf (train) / vllm (rollout) pair under ``root``; returns (train_dir, rollout_dir)."""
    config = synth.Config(**{**TINY, **cfg})
    return synth.generate_pair(root, config, "hf", "vllm", faults=faults, task=task,
                               tensor_format=tensor_format)


def copy_pair(src_root: Path, dst_root: Path):
    """Copy a pair written by tiny_pair; returns the copied (train_dir, rollout_dir)."""
    shutil.copytree(src_root, dst_root, symlinks=True)
    return tuple(dst_root / s / "step0" / "rank0" for s in ("train", "rollout"))


def read_doc(dump_dir: Path) -> Obj:
    return parse((Path(dump_dir) / "dump.json").read_text(encoding="utf-8"))


def write_doc(dump_dir: Path, doc, indent=1) -> None:
    (Path(dump_dir) / "dump.json").write_bytes(fuzz_dumps.encode(emit(doc, indent)))


def entry(doc: Obj, key: str) -> Obj:
    return doc.get("data").get(key)


def leaf(doc: Obj, key: str, name: str) -> Obj:
    """The leaf object at a dumpcompare leaf name (``output.0``, ``parameters.weight``, ...)."""
    head, *rest = name.split(".")
    node = entry(doc, key).get(head)
    for part in rest:
        node = node.get(part) if isinstance(node, Obj) else node[int(part)]
    return node


def set_stats(obj: Obj, **values) -> None:
    for k, v in values.items():
        obj.set(k, v)


@contextlib.contextmanager
def debug_env():
    """DUMPCOMPARE_DEBUG=1: the CLI re-raises anything but InputError instead of exiting 1."""
    old = os.environ.get("DUMPCOMPARE_DEBUG")
    os.environ["DUMPCOMPARE_DEBUG"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DUMPCOMPARE_DEBUG", None)
        else:
            os.environ["DUMPCOMPARE_DEBUG"] = old


def compare(train, rollout, out_dir, *extra) -> tuple[int, str, str]:
    """run_compare.py in this process; an exception other than InputError propagates."""
    out, err = io.StringIO(), io.StringIO()
    with debug_env(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = compare_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out_dir),
                           "--quiet", *map(str, extra)])
    return rc, out.getvalue(), err.getvalue()


def run_script(script: Path, train, rollout, out_dir, *extra, timeout=120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, str(script), "--train", str(train), "--rollout", str(rollout),
                           "--out-dir", str(out_dir), "--quiet", *map(str, extra)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def outputs(out_dir: Path) -> dict:
    """The four JSON outputs by number (1..4), strictly parsed (no NaN tokens)."""
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return {i + 1: json.loads((Path(out_dir) / n).read_text(encoding="utf-8"), parse_constant=bad)
            for i, n in enumerate(OUTPUT_JSON)}


def results_for(doc3: dict, side: str, key: str, leaf_name: str) -> list[dict]:
    """output_3 results that read the given leaf of one side."""
    return [r for r in doc3["results"] if (key, leaf_name) in zip(r[side]["keys"], r[side]["leaves"])]


def direct_result(doc3: dict, spec, pair=None) -> dict:
    """The output_3 result comparing train leaf spec[0:2] with rollout leaf spec[2:4] directly."""
    tkey, tleaf, rkey, rleaf = spec
    hits = [r for r in doc3["results"]
            if r["train"]["keys"] == [tkey] and r["train"]["leaves"] == [tleaf]
            and r["rollout"]["keys"] == [rkey] and r["rollout"]["leaves"] == [rleaf]
            and (pair is None or r["pair"] == pair)]
    assert hits, f"no result compares {spec}"
    return hits[0]
