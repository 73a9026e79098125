"""Ranks are read and merged one at a time (loaders/assembly.py, unshard.RankMerge).

The running merge must give the statistics of merging every rank at once, change no loaded dump,
and hold about one incoming rank besides the merge so far, whatever the number of ranks.
"""
import functools
import json
import weakref
from pathlib import Path

import numpy as np
import pytest

from dumpcompare.cli import main as compare_main
from dumpcompare.compare import leaf_stats
from dumpcompare.compare.stats import ATTRS, combine
from dumpcompare.loaders import assembly
from dumpcompare.loaders.parallel import load_files
from dumpcompare.naming import ModuleRecord
from dumpcompare.records import FORWARD, Dump, Entry, Leaf
from dumpcompare.unshard import RankMerge
from synth import Config, init_weights, run_side, write_dump
from synth.tp import shard_entries

CFG8 = Config(layers=3, hidden=32, intermediate=64, heads=8, kv_heads=8, head_dim=4, vocab=64)


def _dump(leaves, key="m.forward.0"):
    e = Entry(key, 0, "module", "model.layers.0.mlp.up_proj", "Linear", FORWARD, 0, leaves=leaves)
    return Dump(Path("d.json"), Path("."), "msprobe", None, None, None, None, [e])


def _merge(leaves, rec) -> Leaf:
    """The merged copy of one leaf held by each rank (ranks merged one at a time)."""
    merge = RankMerge(_dump([leaves[0]]), [rec], {})
    for lf in leaves[1:]:
        merge.add(_dump([lf]))
    return merge.finish().entries[0].leaves[0]


def _rank_leaf(rng, cols, calls):
    pc = rng.normal(size=(calls, 4)) * [3, 1, 0.1, 40]
    pc[:, 1] = -np.abs(pc[:, 1])
    return Leaf("output.0", "torch.float32", (5, cols), *map(float, pc[0]), per_call=pc)


def test_running_merge_gives_the_statistics_of_all_ranks_at_once():
    rng = np.random.default_rng(3)
    # Five ranks of different widths; rank 3 holds one call fewer, so 3 calls are merged.
    group = [_rank_leaf(rng, c, 4 if r != 3 else 3) for r, c in enumerate((8, 8, 6, 8, 10))]
    before = [lf.per_call.copy() for lf in group]
    rec = ModuleRecord("rollout", 0, "m.forward.0", "module", FORWARD, "model.layers.0.mlp.up_proj",
                       "model.layers.0.mlp.up_proj", "Linear", 0, 0, "mlp.up_proj", "up", "mlp", "vllm")
    merged = _merge(group, rec)
    want = combine([leaf_stats(lf, 3) for lf in group])
    assert merged.merge == "concat:1" and merged.shape == (5, 40)
    assert merged.per_call.shape == (3, 4)
    for j, a in enumerate(ATTRS):
        np.testing.assert_allclose(merged.per_call[:, j], getattr(want, a), rtol=1e-13)
        assert getattr(merged, a) == pytest.approx(float(getattr(want, a)[0]), rel=1e-13)
    # The loaded leaves are untouched.
    for lf, pc in zip(group, before):
        np.testing.assert_array_equal(lf.per_call, pc)


def test_a_statistic_one_rank_lacks_is_absent_after_the_merge():
    rng = np.random.default_rng(4)
    group = [_rank_leaf(rng, 8, 1) for _ in range(3)]
    for lf in group:
        lf.per_call = None
    group[2].mean = None
    rec = ModuleRecord("rollout", 0, "m.forward.0", "module", FORWARD, "x", "x", "Linear", 0, 0, "x", "up", "mlp",
                       "vllm")
    merged = _merge(group, rec)
    assert merged.mean is None and merged.per_call is None
    assert merged.max == max(lf.max for lf in group) and merged.min == min(lf.min for lf in group)
    assert merged.norm == pytest.approx(float(np.sqrt(sum(lf.norm ** 2 for lf in group))), rel=1e-14)


def _write_tp8(root, corrupt_rank=None):
    entries = run_side(CFG8, "vllm", (), weights=init_weights(CFG8))
    ranks = shard_entries(entries, CFG8, 8)
    if corrupt_rank is not None:
        for e in ranks[corrupt_rank]:
            if "layers.1.mlp.gate_up_proj" in e.key:
                e.parameters["weight"].data = e.parameters["weight"].data * 1.5
    for r, es in enumerate(ranks):
        write_dump(root / "step0" / f"rank{r}", es, task="statistics")
    return root


def test_eight_ranks_are_merged_one_at_a_time(tmp_path, monkeypatch):
    train = tmp_path / "train"
    write_dump(train / "step0" / "rank0", run_side(CFG8, "hf", (), weights=init_weights(CFG8)), task="statistics")
    rollout = _write_tp8(tmp_path / "rollout", corrupt_rank=5)
    alive: list = []
    held: list[int] = []
    real_load = assembly.load_input

    def counting_load(item, fold=True):
        # How many dumps read earlier are still referenced when the next one is read.
        held.append(sum(r() is not None for r in alive))
        dump = real_load(item, fold)
        alive.append(weakref.ref(dump))
        return dump

    monkeypatch.setattr(assembly, "load_input", counting_load)
    out = tmp_path / "o"
    assert compare_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out),
                         "--quiet", "--jobs", "1"]) == 0
    assert len(held) == 9
    # The train dump, rollout rank 0 (the merge's base) and nothing else: never all eight ranks.
    assert max(held) <= 2, held
    src = json.loads((out / "output_1_key_mapping.json").read_text())["sources"]["rollout"]
    assert src["rank_layout"]["kind"] == "tensor_parallel" and len(src["ranks"]) == 8
    assert any(n.startswith("merged 8 tensor-parallel ranks") for n in src["notes"])
    # Rank 5's gate_up shard is wrong: only that weight, merged from all eight shards, differs.
    off = [(r["point"], r["status"], r["rollout"]["modules"], r["rollout"]["merges"])
           for r in json.loads((out / "output_3_value_compare.json").read_text())["results"] if r["status"] != "match"]
    assert off == [("L1.gate.weight+L1.up.weight", "mismatch", ["model.layers.1.mlp.gate_up_proj"], ["concat:0"])]


def _marking_load(path, marks):
    (marks / path.name).touch()
    return path.name


def test_the_loader_reads_at_most_jobs_files_ahead(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    paths = [tmp_path / f"f{i}" for i in range(7)]
    for p in paths:
        p.write_text("x")
    got = []
    for i, name in enumerate(load_files(paths, functools.partial(_marking_load, marks=marks), jobs=2)):
        # The consumer is on file i: files i+1 and i+2 may be read ahead, never more.
        assert len(list(marks.iterdir())) <= i + 3
        got.append(name)
    assert got == [p.name for p in paths]
