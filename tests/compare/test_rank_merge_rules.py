"""Rank-merge rules real Megatron/vLLM dumps need (unshard.RuleFacts, layout.gather_rank_qkv)."""
import numpy as np

from dumpcompare.compare.layout import gather_rank_qkv
from dumpcompare.naming import ModuleRecord
from dumpcompare.records import Leaf
from synth.tp import merge_rule


def _rec(role):
    return ModuleRecord("train", 0, "k", "module", "forward", "decoder.layers.0.x", "decoder.layers.0.x", "C", 0, 0,
                        "x", role, "attention", "megatron")


def _leaves(shape, n=2):
    return [Leaf("output.0", "torch.float32", shape, 1.0 + i, -1.0, 0.1 * i, 2.0 + i) for i in range(n)]


def test_sequence_parallel_slices_concatenate_along_the_tokens():
    # 8 tokens, batch 1, TP 2: each rank holds [4, 1, h]
    assert merge_rule(_rec("input_norm"), "output.0", _leaves((4, 1, 64)), {"tokens": 8}) == "concat:0"
    # the same shapes without sequence parallelism (a feature shard of 8 tokens) stay on the last dim
    assert merge_rule(_rec("q"), "output.0", _leaves((8, 1, 64)), {"tokens": 8}) == "concat:-1"


def test_per_head_activations_concatenate_along_the_heads():
    assert merge_rule(_rec("q_norm"), "output.0", _leaves((8, 1, 2, 16)), {"tokens": 8}) == "concat:2"


def test_fused_qkv_of_tp_ranks_is_gathered_into_q_k_v():
    head, per_group = 2, 2
    q = np.arange(8 * 2).reshape(8, 2)              # 4 q heads of 2 rows
    k = 100 + np.arange(4 * 2).reshape(4, 2)        # 2 kv heads
    v = 200 + np.arange(4 * 2).reshape(4, 2)
    ranks = [np.concatenate([q[4 * r:4 * r + 4], k[2 * r:2 * r + 2], v[2 * r:2 * r + 2]]) for r in range(2)]
    merged = np.concatenate(ranks)
    np.testing.assert_array_equal(gather_rank_qkv(merged, 2, 0, head, per_group), np.concatenate([q, k, v]))
    assert gather_rank_qkv(merged, 2, 0, 3, per_group) is None      # a head size that does not divide
