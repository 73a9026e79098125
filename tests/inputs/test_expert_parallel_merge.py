"""Stacked experts of expert-parallel ranks are concatenated on the experts dim; tensor-parallel
ones keep the profile's intermediate-dim rule (unshard.RuleFacts.rule, _experts_by_block)."""
from pathlib import Path

import numpy as np
import pytest

from dumpcompare.compare.sources import Leafsrc
from dumpcompare.naming import Namer, load_profiles, name_side
from dumpcompare.records import FORWARD, Dump, Entry, Leaf
from dumpcompare.unshard import RankMerge

E, H, I, T = 8, 16, 12, 5
BLOCK = "model.layers.0.mlp"


def _leaf(name, arr, folder, rank):
    np.save(folder / f"r{rank}_{name}.npy", arr)
    a = arr.astype(np.float64)
    return Leaf(name, "torch.float32", arr.shape, float(a.max()), float(a.min()), float(a.mean()),
                float(np.linalg.norm(a)), data_name=f"r{rank}_{name}.npy")


def _rank(folder, rank, w13, w2, out, logits):
    entries = [
        Entry("gate.forward.0", 0, "module", f"{BLOCK}.gate", "ReplicatedLinear", FORWARD, 0,
              leaves=[_leaf("output.0", logits, folder, rank)]),
        Entry("experts.forward.0", 1, "module", f"{BLOCK}.experts", "FusedMoE", FORWARD, 0,
              leaves=[_leaf("parameters.w13_weight", w13, folder, rank), _leaf("parameters.w2_weight", w2, folder, rank),
                      _leaf("output", out, folder, rank)]),
    ]
    return Dump(folder / "dump.json", folder, "msprobe", "tensor", "L0", "pytorch", None, entries)


def _merged(folder, shards):
    namer = Namer(load_profiles())
    dumps = [_rank(folder, r, *s) for r, s in enumerate(shards)]
    _fam, recs = name_side(dumps[0], "rollout", namer, "vllm")
    merge = RankMerge(dumps[0], recs, namer.p.get("tensor_parallel", {}))
    for d in dumps[1:]:
        merge.add(d)
    done = merge.finish()
    leaves = {lf.name: lf for lf in done.entries[1].leaves}
    return leaves, done.notes[-1]


def _whole(lf):
    """The merged tensor as a tensor-mode comparison reads it (compare/sources.Leafsrc)."""
    return Leafsrc([np.load(Path(d) / n) for d, n, _x in lf.shards], lf.merge).whole()


@pytest.mark.parametrize("ep", [2, 4])
def test_expert_parallel_shards_concatenate_on_the_experts_in_rank_order(tmp_path, ep):
    rng = np.random.default_rng(ep)
    w13, w2 = rng.normal(size=(E, 2 * I, H)), rng.normal(size=(E, H, I))
    logits = rng.normal(size=(T, E))
    k = E // ep
    shards = [(w13[r * k:(r + 1) * k], w2[r * k:(r + 1) * k], rng.normal(size=(T, H)), logits) for r in range(ep)]
    leaves, note = _merged(tmp_path, shards)
    for name, whole in (("parameters.w13_weight", w13), ("parameters.w2_weight", w2)):
        lf = leaves[name]
        assert lf.merge == "concat:0" and lf.shape == whole.shape
        assert [n for _d, n, _x in lf.shards] == [f"r{r}_{name}.npy" for r in range(ep)]
        np.testing.assert_array_equal(_whole(lf), whole)
        assert lf.norm == pytest.approx(float(np.linalg.norm(whole)), rel=1e-12)
        assert lf.max == pytest.approx(whole.max()) and lf.min == pytest.approx(whole.min())
    # Each rank's output is its experts' partial sum.
    assert leaves["output"].merge == "sum" and leaves["output"].norm is None
    assert "2 expert_parallel" in note and "expert_parallel: stacked experts" in note


def test_tensor_parallel_experts_still_merge_on_the_intermediate_dim(tmp_path):
    rng = np.random.default_rng(0)
    tp = 2
    w13, w2 = rng.normal(size=(E, 2 * I, H)), rng.normal(size=(E, H, I))
    logits = rng.normal(size=(T, E))
    j = I // tp
    # vLLM's w13 on rank r is [gate_r; up_r] per expert; the merge only concatenates.
    shards = [(w13[:, r * 2 * j:(r + 1) * 2 * j], w2[:, :, r * j:(r + 1) * j], rng.normal(size=(T, H)), logits)
              for r in range(tp)]
    leaves, note = _merged(tmp_path, shards)
    assert leaves["parameters.w13_weight"].merge == "concat:1" and leaves["parameters.w13_weight"].shape == (E, 2 * I, H)
    assert leaves["parameters.w2_weight"].merge == "concat:2" and leaves["parameters.w2_weight"].shape == (E, H, I)
    np.testing.assert_array_equal(_whole(leaves["parameters.w2_weight"]), w2)
    assert "expert_parallel" not in note


def test_uneven_expert_split_and_no_router_width(tmp_path):
    rng = np.random.default_rng(1)
    w13, w2 = rng.normal(size=(E, 2 * I, H)), rng.normal(size=(E, H, I))
    logits = rng.normal(size=(T, E))
    # 8 experts over 3 ranks: 3, 3, 2 (shapes differ on dim 0 only).
    cuts = [0, 3, 6, 8]
    shards = [(w13[a:b], w2[a:b], rng.normal(size=(T, H)), logits) for a, b in zip(cuts, cuts[1:])]
    leaves, _note = _merged(tmp_path, shards)
    assert leaves["parameters.w13_weight"].merge == "concat:0" and leaves["parameters.w13_weight"].shape == w13.shape
    # A router of another width (here 6) is no evidence: the profile's rule applies.
    bad = [(s[0], s[1], s[2], logits[:, :6]) for s in shards]
    leaves, note = _merged(tmp_path, bad)
    assert leaves["parameters.w13_weight"].merge == "concat:1" and "expert_parallel" not in note
