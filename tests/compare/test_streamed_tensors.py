"""Big tensors are compared block by block; the result must equal the whole-tensor comparison.

Each scenario runs twice on the same tensor-mode dumps: once whole, once with a block budget so
small that every comparison is split into blocks of a few rows (or columns), which exercises the
block path through every layout step: fused parts, Megatron grouped qkv, padded vocabulary,
rank shards and stitched decode calls.
"""
import json
import math

import numpy as np
import pytest

import synth
from dumpcompare.cli import main as cli_main
from dumpcompare.compare import sources
from synth import faults as F
from synth.decode import split_prefill_decode
from synth.tp import shard_entries

BLOCK_NOTE = "compared block by block"
CFG = synth.Config(layers=2, seq_len=12)


def _pair(root, **kw):
    return synth.generate_pair(root, CFG if "cfg" not in kw else kw.pop("cfg"), task="tensor", **kw)


def _tp_pair(root):
    w = synth.init_weights(CFG)
    tdir = synth.write_dump(root / "train", synth.run_side(CFG, "hf", grad=True, weights=w), task="tensor")
    ranks = shard_entries(synth.run_side(CFG, "vllm", (F.CorruptWeight("rollout", "up", 1),), weights=w), CFG, 2)
    for r, es in enumerate(ranks):
        synth.write_dump(root / "rollout" / "step0" / f"rank{r}", es, task="tensor")
    return tdir, root / "rollout", ("--rollout-rank", "all")


def _decode_pair(root):
    w = synth.init_weights(CFG)
    tdir = synth.write_dump(root / "train", synth.run_side(CFG, "hf", grad=True, weights=w), task="tensor")
    full = synth.run_side(CFG, "vllm", (F.CorruptWeight("rollout", "down", 1),), weights=w)
    rdir = synth.write_dump(root / "rollout", split_prefill_decode(full, CFG.seq_len, 5), task="tensor")
    return tdir, rdir, ()


SCENARIOS = {
    "gate_fault": lambda root: (*_pair(root, faults=(F.CorruptWeight("rollout", "gate", 1),)), ()),
    "megatron_grouped_qkv": lambda root: (*_pair(root, train_layout="megatron", rollout_layout="hf"), ()),
    "permuted_qkv": lambda root: (*_pair(root, faults=(F.PermuteQKV("rollout", 1),)), ()),
    "padded_vocab": lambda root: (*_pair(root, cfg=synth.Config(layers=2, seq_len=12, vocab=100),
                                         rollout_options={"pad_vocab": True}), ()),
    "bf16_pt": lambda root: (*_pair(root, faults=(F.HalfPrecision("rollout"),), tensor_format="pt"), ()),
    "tp2_rollout": _tp_pair,
    "prefill_decode": _decode_pair,
}


def _results(tdir, rdir, extra, out):
    assert cli_main(["--train", str(tdir), "--rollout", str(rdir), "--out-dir", str(out), "--quiet",
                     *extra]) == 0
    return json.loads((out / "output_3_value_compare.json").read_text())["results"]


def _close(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_block_by_block_equals_whole(tmp_path, monkeypatch, name):
    tdir, rdir, extra = SCENARIOS[name](tmp_path / "dumps")
    whole = _results(tdir, rdir, extra, tmp_path / "whole")
    monkeypatch.setattr(sources, "BLOCK_BYTES", 64)
    blocked = _results(tdir, rdir, extra, tmp_path / "blocked")
    assert sum(any(n.startswith(BLOCK_NOTE) for n in r["notes"]) for r in blocked) > len(blocked) // 2
    for w, b in zip(whole, blocked, strict=True):
        assert (w["point"], w["status"], w["reason"]) == (b["point"], b["status"], b["reason"])
        assert _close(w["error"], b["error"]), w["point"]
        assert _close(w["tensor_metrics"], b["tensor_metrics"]), w["point"]
        for side in ("train", "rollout"):
            assert _close(w[side].get("stats"), b[side].get("stats")), (w["point"], side)
        assert [n for n in b["notes"] if not n.startswith(BLOCK_NOTE)] == w["notes"]


def test_block_ranges_cover_the_axis_without_a_lone_last_row():
    for length in range(2, 40):
        for unit in (1, 8, 24, 100):
            sources.BLOCK_BYTES, saved = 64, sources.BLOCK_BYTES
            try:
                ranges = sources.block_ranges(length, unit)
            finally:
                sources.BLOCK_BYTES = saved
            assert ranges[0][0] == 0 and ranges[-1][1] == length
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert all(hi - lo >= 2 for lo, hi in ranges)
            assert np.sum([hi - lo for lo, hi in ranges]) == length
