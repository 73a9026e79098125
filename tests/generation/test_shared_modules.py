"""A module object shared by every layer (vLLM's rotary embedding) is put back under the layer that
called it, from construct.json: on a hand-built dump and on a real vLLM dump."""
import json
from pathlib import Path

import numpy as np

from dumpcompare.loaders import load_path
from dumpcompare.loaders.shared import attribute
from dumpcompare.records import Entry, Leaf

REAL = Path(__file__).resolve().parents[1] / "data" / "real_vllm"


def _e(key, path, cls, call, order, mx=1.0):
    return Entry(key, order, "module", path, cls, "forward", call, [Leaf("output.0", "torch.float32", (2, 4), mx, 0.0, 0.5, 1.0)])


def _rotary(call, order):
    return _e(f"Module.model.layers.0.self_attn.rotary_emb.RotaryEmbedding.forward.{call}",
              "model.layers.0.self_attn.rotary_emb", "RotaryEmbedding", call, order, mx=float(call))


def _attn(layer, call, order):
    return _e(f"Module.model.layers.{layer}.self_attn.Attention.forward.{call}", f"model.layers.{layer}.self_attn",
              "Attention", call, order)


def test_calls_of_a_shared_module_go_under_their_calling_layer():
    entries, construct, order = [], {}, 0
    for fwd in range(2):                          # two forward calls of a 2-layer model
        for layer in range(2):
            k = fwd * 2 + layer
            rot, att = _rotary(k, order), _attn(layer, fwd, order + 1)
            construct[rot.key] = att.key
            construct[att.key] = None
            entries += [rot, att]
            order += 2
    out, notes = attribute(entries, construct)
    rot = [e for e in out if e.cls == "RotaryEmbedding"]
    assert [(e.raw_path, e.call, e.leaves[0].max) for e in rot] == [
        ("model.layers.0.self_attn.rotary_emb", 0, 0.0), ("model.layers.1.self_attn.rotary_emb", 0, 1.0),
        ("model.layers.0.self_attn.rotary_emb", 1, 2.0), ("model.layers.1.self_attn.rotary_emb", 1, 3.0)]
    assert all(e.key == f"Module.{e.raw_path}.RotaryEmbedding.forward.{e.call}" for e in rot)
    assert len(notes) == 1 and "shared" in notes[0]


def test_a_parent_elsewhere_in_the_tree_is_left_alone():
    e = _e("Module.model.norm.RMSNorm.forward.0", "model.norm", "RMSNorm", 0, 0)
    p = _e("Module.lm_head.Head.forward.0", "lm_head", "Head", 0, 1)
    out, notes = attribute([e, p], {e.key: p.key, p.key: None})
    assert out == [e, p] and notes == []


def test_folded_calls_are_unfolded_before_they_move():
    first = _rotary(0, 0)
    first.n_calls = 2
    first.leaves[0].per_call = np.array([[0.0, 0.0, 0.5, 1.0], [7.0, 0.0, 0.5, 1.0]])
    a0, a1 = _attn(0, 0, 1), _attn(1, 0, 2)
    construct = {first.key: a0.key, first.key.replace("forward.0", "forward.1"): a1.key, a0.key: None, a1.key: None}
    out, _ = attribute([first, a0, a1], construct)
    assert [(e.raw_path, e.call) for e in out] == [
        ("model.layers.0.self_attn.rotary_emb", 0), ("model.layers.0.self_attn", 0),
        ("model.layers.1.self_attn.rotary_emb", 0), ("model.layers.1.self_attn", 0)]
    moved = out[2]
    assert moved.n_calls == 1 and moved.leaves[0].per_call is None and moved.leaves[0].max == 7.0


def test_a_folded_run_made_by_several_blocks_splits_by_block():
    # calls 0..3 of the shared rotary: layers 0, 1, 0, 1 (two forward calls of two layers)
    first = _rotary(0, 0)
    first.n_calls = 4
    first.leaves[0].per_call = np.array([[float(c), 0.0, 0.5, 1.0] for c in range(4)])
    attn = [_attn(layer, call, 10 + 2 * call + layer) for call in range(2) for layer in range(2)]
    rot_keys = [first.key.replace("forward.0", f"forward.{c}") for c in range(4)]
    construct = {k: a.key for k, a in zip(rot_keys, attn)} | {a.key: None for a in attn}
    out, _ = attribute([first] + attn, construct)
    rot = [e for e in out if e.cls == "RotaryEmbedding"]
    assert [(e.raw_path, e.call, e.n_calls) for e in rot] == [
        ("model.layers.0.self_attn.rotary_emb", 0, 2), ("model.layers.1.self_attn.rotary_emb", 0, 2)]
    # each block keeps its own calls' statistics, in call order
    assert [r[0] for r in rot[0].leaves[0].per_call] == [0.0, 2.0]
    assert [r[0] for r in rot[1].leaves[0].per_call] == [1.0, 3.0]
    assert rot[1].leaves[0].max == 1.0


def test_real_vllm_rotary_is_one_module_per_layer():
    dump = load_path(REAL / "llama_clean_stats_onestep" / "rollout" / "step0" / "rank0" / "dump.json")
    rot = [e for e in dump.entries if e.cls == "RotaryEmbedding"]
    case = json.loads((REAL / "llama_clean_stats_onestep" / "case.json").read_text())
    layers = 3
    assert sorted({e.raw_path for e in rot}) == [f"model.layers.{i}.self_attn.rotary_emb" for i in range(layers)]
    for i in range(layers):
        # the prefill, then the decode calls as one folded run
        calls = [(e.call, e.n_calls) for e in rot if e.raw_path == f"model.layers.{i}.self_attn.rotary_emb"]
        assert calls == [(0, 1), (1, case["forward_calls"] - 1)]
    # each layer's rotary call sits right after its own qkv projection, as the engine ran it
    keys = [e.key for e in dump.entries]
    for i in range(layers):
        q = keys.index(f"Module.model.layers.{i}.self_attn.qkv_proj.QKVParallelLinear.forward.0")
        assert keys[q + 1] == f"Module.model.layers.{i}.self_attn.rotary_emb.RotaryEmbedding.forward.0"
