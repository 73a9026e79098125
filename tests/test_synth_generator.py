"""Tests of the synthetic msprobe dump generator (tests/synth)."""
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

import synth
from synth import faults as F
from synth.__main__ import main as cli_main
from synth.model import to_bf16

REAL_TENSOR_DUMP = Path(__file__).parent / "data" / "msprobe" / "llama_L0_tensor" / "step0" / "proc0"
# The model msprobe_samples/dump_tiny.py dumped (HF LlamaForCausalLM, transformers 5.x).
SAMPLE_CFG = synth.Config(vocab=64, hidden=16, intermediate=32, layers=2, heads=2, kv_heads=1,
                          head_dim=8, seq_len=5)
CFG = synth.Config()
STATS = ("Max", "Min", "Mean", "Norm")


def run(layout, faults=(), cfg=CFG, **options):
    """Entries of one side by key."""
    return {e.key: e for e in synth.run_side(cfg, layout, faults, options=options)}


def out(entries, key, i=0):
    return entries[key].output[i].data


def arg(entries, key, i=0):
    return entries[key].input_args[i].data


def hf_key(path, cls):
    return f"Module.model.{path}.{cls}.forward.0"


def close(a, b, tol=1e-5):
    return np.allclose(a, b, rtol=tol, atol=tol)


def leaves(item):
    """Every Leaf inside an Entry or Item."""
    if isinstance(item, synth.Entry):
        item = [item.input_args, item.input_kwargs, item.output, item.parameters]
    if isinstance(item, synth.Leaf):
        return [item]
    if isinstance(item, dict):
        item = list(item.values())
    return [x for v in item for x in leaves(v)] if isinstance(item, list) else []


def json_leaves(item):
    """Every tensor dict inside a dump.json Item."""
    if isinstance(item, dict) and item.get("type") == "torch.Tensor":
        return [item]
    values = item.values() if isinstance(item, dict) else item if isinstance(item, list) else []
    return [x for v in values for x in json_leaves(v)]


def skeleton(item):
    """An Item with the statistics removed: structure, dtypes, shapes, requires_grad, names."""
    if isinstance(item, dict):
        if item.get("type") == "torch.Tensor":
            return {k: v for k, v in item.items() if k not in STATS}
        return {k: skeleton(v) for k, v in item.items()}
    if isinstance(item, list):
        return [skeleton(v) for v in item]
    return item


def load(dump_dir):
    with open(Path(dump_dir) / "dump.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def hf():
    return run("hf")


@pytest.fixture(scope="module")
def vllm():
    return run("vllm")


@pytest.fixture(scope="module")
def megatron():
    return run("megatron")


# ---------------------------------------------------------------- format against real msprobe

def test_hf_tensor_dump_matches_real_msprobe_sample(tmp_path):
    """Same model shape as the real msprobe 26.2 sample: identical keys, order, Items, data_names."""
    train, _ = synth.generate_pair(tmp_path, SAMPLE_CFG, task="tensor", tensor_format="pt")
    ours = load(train)
    real = load(REAL_TENSOR_DUMP)
    real_fwd = {k: v for k, v in real["data"].items() if ".forward." in k}
    assert list(ours) == list(real) == ["task", "level", "framework", "dump_data_dir", "data"]
    assert list(ours["data"]) == list(real_fwd)
    for key, entry in real_fwd.items():
        assert skeleton(ours["data"][key]) == skeleton(entry), key


def test_json_text_format_and_construct_order(tmp_path):
    train, _ = synth.generate_pair(tmp_path, SAMPLE_CFG)
    text = (train / "dump.json").read_text()
    assert text.startswith('{\n "task": "statistics",\n "level": "L0",\n "framework": "pytorch",\n'
                           ' "dump_data_dir": null,\n "data": {\n  "Module.model.embed_tokens')
    # The causal mask overflows float32 sums exactly as in real files (bare -Infinity/Infinity).
    assert '"Mean": -Infinity' in text and '"Norm": Infinity' in text
    construct = json.loads((train / "construct.json").read_text())
    keys = list(construct)
    assert keys[0] == "Module.model.LlamaModel.forward.0" and construct[keys[0]] is None
    assert construct["Module.lm_head.Linear.forward.0"] is None
    assert construct[hf_key("layers.1.mlp.act_fn", "SiLUActivation")] == hf_key("layers.1.mlp", "LlamaMLP")
    for child, parent in construct.items():  # pre-order: a parent starts before its children
        assert parent is None or keys.index(parent) < keys.index(child)


@pytest.mark.parametrize("layout", sorted(synth.LAYOUTS))
def test_entries_are_post_order_with_consistent_parents(tmp_path, layout):
    dirs = synth.generate_pair(tmp_path, train_layout=layout, rollout_layout=layout)
    for d in dirs:
        data = load(d)["data"]
        construct = json.loads((d / "construct.json").read_text())
        order = list(data)
        assert set(construct) == set(order)
        for key, parent in construct.items():
            assert key.startswith("Module.") and ".forward." in key
            assert list(data[key]) == ["input_args", "input_kwargs", "output", "parameters"]
            if parent is not None:
                assert order.index(key) < order.index(parent)  # children finish first


def test_int_tensors_have_null_mean_and_norm(tmp_path):
    train, rollout = synth.generate_pair(tmp_path)
    ids = load(train)["data"][hf_key("embed_tokens", "Embedding")]["input_args"][0]
    pos = load(rollout)["data"][hf_key("layers.0.self_attn.rotary_emb", "RotaryEmbedding")]["input_args"][0]
    tokens = synth.make_tokens(CFG)
    assert ids["dtype"] == "torch.int64" and ids["Mean"] is None and ids["Norm"] is None
    assert ids["Max"] == int(tokens.max()) and isinstance(ids["Max"], int)
    assert (pos["Min"], pos["Max"], pos["shape"]) == (0, CFG.seq_len - 1, [CFG.seq_len])


def test_leaf_stats_follow_msprobe_rules():
    leaf = synth.Leaf(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32), "torch.float32")
    st = synth.leaf_stats(leaf)
    assert st == {"Max": 3.0, "Min": -2.0, "Mean": 0.625, "Norm": float(np.float32(np.sqrt(14.25)))}
    bf = synth.leaf_stats(synth.Leaf(to_bf16(np.array([1.001, 1.0], np.float32)), "torch.bfloat16"))
    assert bf["Mean"] == float(to_bf16(np.array([bf["Mean"]], np.float32))[0])


@pytest.mark.parametrize("fmt", ["npy", "pt"])
def test_tensor_mode_files_match_leaf_stats(tmp_path, fmt):
    if fmt == "pt":
        from synth.ptfile import load_tensor as read
    else:
        read = np.load
    train, _ = synth.generate_pair(tmp_path, faults=[F.HalfPrecision("train", "lm_head")],
                                   task="tensor", tensor_format=fmt)
    dump = load(train)
    assert dump["dump_data_dir"].startswith("/") and dump["dump_data_dir"].endswith("/dump_tensor_data")
    assert not Path(dump["dump_data_dir"]).exists()
    found = [leaf for entry in dump["data"].values() for leaf in json_leaves(entry)]
    files = sorted(p.name for p in (train / "dump_tensor_data").iterdir())
    assert files == sorted(leaf["data_name"] for leaf in found)
    for leaf in found:
        assert leaf["data_name"].endswith("." + fmt)
        data = read(train / "dump_tensor_data" / leaf["data_name"])
        assert list(data.shape) == leaf["shape"]
        st = synth.leaf_stats(synth.Leaf(np.asarray(data), leaf["dtype"]))
        assert {k: leaf[k] for k in STATS} == st, leaf["data_name"]
    assert any(leaf["dtype"] == "torch.bfloat16" for leaf in found)


# ---------------------------------------------------------------- same math across layouts

def test_hf_and_vllm_agree_on_every_comparison_point(hf, vllm):
    cfg = CFG
    logits = out(vllm, "Module.logits_processor.LogitsProcessor.forward.0")
    assert logits.shape == (cfg.seq_len, cfg.vocab)
    assert close(logits, out(hf, "Module.lm_head.Linear.forward.0")[0])
    for i in range(cfg.layers):
        p = f"layers.{i}"
        qkv = out(vllm, hf_key(f"{p}.self_attn.qkv_proj", "QKVParallelLinear"))
        q, k, v = np.split(qkv, [cfg.q_size, cfg.q_size + cfg.kv_size], axis=-1)
        assert close(q, out(hf, hf_key(f"{p}.self_attn.q_proj", "Linear"))[0])
        assert close(k, out(hf, hf_key(f"{p}.self_attn.k_proj", "Linear"))[0])
        assert close(v, out(hf, hf_key(f"{p}.self_attn.v_proj", "Linear"))[0])
        assert close(out(vllm, hf_key(f"{p}.self_attn.attn", "Attention")),
                     arg(hf, hf_key(f"{p}.self_attn.o_proj", "Linear"))[0])
        assert close(out(vllm, hf_key(f"{p}.mlp.act_fn", "SiluAndMul")),
                     arg(hf, hf_key(f"{p}.mlp.down_proj", "Linear"))[0])
        layer = vllm[hf_key(p, "LlamaDecoderLayer")]
        stream = layer.output[0].data + layer.output[1].data
        assert close(stream, out(hf, hf_key(p, "LlamaDecoderLayer"))[0])
    fused = vllm[hf_key("layers.1.self_attn.qkv_proj", "QKVParallelLinear")]
    assert fused.output[1] is None and fused.parameters["weight"].requires_grad is False


def test_vllm_fused_norms_and_layer_signatures(vllm):
    first = vllm[hf_key("layers.0.input_layernorm", "RMSNorm")]
    later = vllm[hf_key("layers.1.input_layernorm", "RMSNorm")]
    assert len(first.input_args) == 1 and len(first.output) == 1
    prev = vllm[hf_key("layers.0", "LlamaDecoderLayer")]
    assert [a.data is b.data for a, b in zip(later.input_args, prev.output)] == [True, True]
    assert close(later.output[1].data, prev.output[0].data + prev.output[1].data)
    assert vllm[hf_key("layers.0", "LlamaDecoderLayer")].input_args[2] is None
    assert vllm[hf_key("layers.1", "LlamaDecoderLayer")].input_args[2] is not None
    assert list(vllm[hf_key("layers.0.self_attn", "LlamaAttention")].input_kwargs) == ["positions", "hidden_states"]
    model = vllm["Module.model.LlamaModel.forward.0"]
    assert model.input_args[2:] == [None, None]
    assert "Module.lm_head" not in " ".join(vllm)


def test_sglang_structure_and_last_position_logits(hf):
    sg = run("sglang")
    attn = sg[hf_key("layers.0.self_attn.attn", "RadixAttention")]
    assert len(attn.input_args) == 4 and attn.input_args[3] is None
    out_obj = sg["Module.logits_processor.LogitsProcessor.forward.0"].output[0]
    assert out_obj["next_token_logits"].data.shape == (1, CFG.vocab)
    assert close(out_obj["next_token_logits"].data, out(hf, "Module.lm_head.Linear.forward.0")[0][-1:])
    assert sg[hf_key("layers.1", "LlamaDecoderLayer")].input_args[2] is None  # forward_batch


def test_megatron_matches_hf_and_uses_grouped_qkv(hf, megatron):
    cfg = CFG
    logits = out(megatron, "Module.output_layer.ColumnParallelLinear.forward.0")
    assert logits.shape == (cfg.seq_len, 1, cfg.vocab)
    assert close(logits[:, 0], out(hf, "Module.lm_head.Linear.forward.0")[0])
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    for i in range(cfg.layers):
        d = f"Module.decoder.layers.{i}"
        qkv = megatron[f"{d}.self_attention.linear_qkv.TELayerNormColumnParallelLinear.forward.0"]
        groups = qkv.parameters["weight"].data.reshape(cfg.kv_heads, (rep + 2) * hd, cfg.hidden)
        regrouped = np.concatenate([groups[:, :rep * hd].reshape(-1, cfg.hidden),
                                    groups[:, rep * hd:(rep + 1) * hd].reshape(-1, cfg.hidden),
                                    groups[:, (rep + 1) * hd:].reshape(-1, cfg.hidden)])
        hf_qkv = [hf[hf_key(f"layers.{i}.self_attn.{r}_proj", "Linear")].parameters["weight"].data
                  for r in "qkv"]
        assert np.array_equal(regrouped, np.concatenate(hf_qkv))
        assert np.array_equal(qkv.parameters["layer_norm_weight"].data,
                              hf[hf_key(f"layers.{i}.input_layernorm", "LlamaRMSNorm")].parameters["weight"].data)
        assert close(out(megatron, f"{d}.TransformerLayer.forward.0")[:, 0],
                     out(hf, hf_key(f"layers.{i}", "LlamaDecoderLayer"))[0])
        assert close(arg(megatron, f"{d}.mlp.linear_fc2.TERowParallelLinear.forward.0")[:, 0],
                     arg(hf, hf_key(f"layers.{i}.mlp.down_proj", "Linear"))[0])
        core = megatron[f"{d}.self_attention.core_attention.TEDotProductAttention.forward.0"]
        assert [a.data.shape for a in core.input_args[:3]] == [(cfg.seq_len, 1, cfg.heads, hd),
                                                               (cfg.seq_len, 1, cfg.kv_heads, hd)] + \
            [(cfg.seq_len, 1, cfg.kv_heads, hd)]
        assert megatron[f"{d}.TransformerLayer.forward.0"].output[1] is None
    assert "Module.decoder.final_layernorm.RMSNorm.forward.0" in megatron
    emb = megatron["Module.embedding.LanguageModelEmbedding.forward.0"].output[0].data
    assert emb.shape == (cfg.seq_len, 1, cfg.hidden)


def test_megatron_local_has_real_norm_modules(hf):
    local = run("megatron_local")
    d = "Module.decoder.layers.0"
    norm = local[f"{d}.input_layernorm.WrappedTorchNorm.forward.0"]
    assert close(norm.output[0].data[:, 0], out(hf, hf_key("layers.0.input_layernorm", "LlamaRMSNorm"))[0])
    assert list(local[f"{d}.self_attention.linear_qkv.ColumnParallelLinear.forward.0"].parameters) == ["weight"]
    assert f"{d}.self_attention.core_attention.DotProductAttention.forward.0" in local


def test_megatron_wrapper_prefix_and_float16module_output():
    ent = run("megatron", [F.HalfPrecision("train")], prefix="module.module.")
    keys = list(ent)
    assert all(k.startswith("Module.module.") for k in keys)
    assert keys[-2:] == ["Module.module.module.GPTModel.forward.0", "Module.module.Float16Module.forward.0"]
    gpt, f16 = ent[keys[-2]].output[0], ent[keys[-1]].output[0]
    assert gpt.dtype == "torch.bfloat16" and f16.dtype == "torch.float32"
    assert gpt.data.shape == (1, CFG.seq_len, CFG.vocab) and np.array_equal(gpt.data, f16.data)
    assert ent["Module.module.module.rotary_pos_emb.RotaryEmbedding.forward.0"].output[0].dtype == "torch.float32"


def test_hf_fsdp_names_wrappers_and_flat_params(hf):
    fsdp = run("hf_fsdp")
    assert all(k.startswith("Module._fsdp_wrapped_module.") for k in fsdp)
    root = "Module._fsdp_wrapped_module.model.layers.1"
    inner = f"{root}._fsdp_wrapped_module.LlamaDecoderLayer.forward.0"
    wrapper = f"{root}.FullyShardedDataParallel.forward.0"
    assert list(fsdp).index(inner) + 1 == list(fsdp).index(wrapper)
    assert np.array_equal(out(fsdp, wrapper), out(fsdp, inner))
    assert close(out(fsdp, inner), out(hf, hf_key("layers.1", "LlamaDecoderLayer")))
    assert list(fsdp)[-1] == "Module._fsdp_wrapped_module.LlamaForCausalLM.forward.0"

    ck = run("hf_fsdp", checkpoint=True, use_orig_params=False)
    body = f"{root}._fsdp_wrapped_module._checkpoint_wrapped_module"
    assert f"{root}._fsdp_wrapped_module.CheckpointWrapper.forward.0" in ck
    assert ck[f"{body}.self_attn.q_proj.Linear.forward.0"].parameters == {}
    flat = ck[f"{body}.LlamaDecoderLayer.forward.0"].parameters["_flat_param"].data
    lw = synth.init_weights(CFG).layers[1]
    assert np.array_equal(flat[:lw.q.size], lw.q.ravel()) and flat.ndim == 1
    assert flat.size == sum(w.size for w in vars(lw).values())


def test_pad_vocab():
    v = run("vllm", pad_vocab=True)
    assert v[hf_key("embed_tokens", "VocabParallelEmbedding")].parameters["weight"].data.shape[0] == 128
    small = synth.Config(vocab=100)
    v = run("vllm", cfg=small, pad_vocab=True)
    assert v[hf_key("embed_tokens", "VocabParallelEmbedding")].parameters["weight"].data.shape[0] == 128
    assert out(v, "Module.logits_processor.LogitsProcessor.forward.0").shape == (small.seq_len, 100)
    m = run("megatron", cfg=small, pad_vocab=True)
    logits = out(m, "Module.output_layer.ColumnParallelLinear.forward.0")
    assert logits.shape == (small.seq_len, 1, 128) and not logits[..., 100:].any()


# ---------------------------------------------------------------- faults

def test_corrupt_gate_touches_gate_half_of_fused_weight(vllm):
    bad = run("vllm", [F.CorruptWeight("rollout", "gate", 1)])
    key = hf_key("layers.1.mlp.gate_up_proj", "MergedColumnParallelLinear")
    w_bad, w_ok = bad[key].parameters["weight"].data, vllm[key].parameters["weight"].data
    i = CFG.intermediate
    assert not np.array_equal(w_bad[:i], w_ok[:i]) and np.array_equal(w_bad[i:], w_ok[i:])
    for k in list(vllm)[:list(vllm).index(key)]:  # everything before the fault is untouched
        assert all(np.array_equal(a.data, b.data) for a, b in zip(bad[k].output, vllm[k].output)
                   if a is not None)
    assert not close(out(bad, key), out(vllm, key), 1e-3)


@pytest.mark.parametrize("layout", ["vllm", "megatron"])
@pytest.mark.parametrize("mode", ["swap_qk", "shuffle"])
def test_permuted_qkv_keeps_fused_values_but_breaks_q_k(hf, layout, mode):
    clean = run(layout)
    bad = run(layout, [F.PermuteQKV("rollout", 2, mode)])
    if layout == "vllm":
        qkv_key = hf_key("layers.2.self_attn.qkv_proj", "QKVParallelLinear")
        consumer, layer1 = hf_key("layers.2.self_attn.rotary_emb", "RotaryEmbedding"), \
            hf_key("layers.1", "LlamaDecoderLayer")
        q_in, k_in = (arg(bad, consumer, i) for i in (1, 2))
        assert not close(q_in, out(hf, hf_key("layers.2.self_attn.q_proj", "Linear"))[0])
        assert not close(k_in, out(hf, hf_key("layers.2.self_attn.k_proj", "Linear"))[0])
    else:
        qkv_key = "Module.decoder.layers.2.self_attention.linear_qkv.TELayerNormColumnParallelLinear.forward.0"
        consumer = "Module.decoder.layers.2.self_attention.core_attention.TEDotProductAttention.forward.0"
        layer1 = "Module.decoder.layers.1.TransformerLayer.forward.0"
        q_in, k_in = (arg(bad, consumer, i) for i in (0, 1))
    assert not close(q_in, arg(clean, consumer, 0 if layout == "megatron" else 1))
    assert not close(k_in, arg(clean, consumer, 1 if layout == "megatron" else 2))
    # Every token row of the fused output holds the same values, only in another order.
    assert np.array_equal(np.sort(out(bad, qkv_key), axis=-1), np.sort(out(clean, qkv_key), axis=-1))
    sa, sb = synth.leaf_stats(bad[qkv_key].output[0]), synth.leaf_stats(clean[qkv_key].output[0])
    assert (sa["Max"], sa["Min"]) == (sb["Max"], sb["Min"]) and np.isclose(sa["Norm"], sb["Norm"], 1e-6)
    assert np.array_equal(out(bad, layer1), out(clean, layer1))


def test_permuted_qkv_rejected_on_unfused_layout():
    with pytest.raises(ValueError, match="no fused qkv"):
        run("hf", [F.PermuteQKV("train", 0)])


def test_norm_eps_all_and_one_layer(hf):
    all_bad = run("hf", [F.NormEps("train", 1e-1)])
    one_bad = run("hf", [F.NormEps("train", 1e-1, 2)])
    for i in range(CFG.layers):
        key = hf_key(f"layers.{i}.input_layernorm", "LlamaRMSNorm")
        assert not np.array_equal(out(all_bad, key), out(hf, key))
        assert np.array_equal(out(one_bad, key), out(hf, key)) == (i < 2)
    norm_in = arg(one_bad, hf_key("layers.2.input_layernorm", "LlamaRMSNorm"))
    assert np.array_equal(norm_in, arg(hf, hf_key("layers.2.input_layernorm", "LlamaRMSNorm")))


def test_rope_theta_changes_rotary_only(hf, vllm):
    bad_hf = run("hf", [F.RopeTheta("train", 500000.0)])
    bad_v = run("vllm", [F.RopeTheta("rollout", 500000.0)])
    rot = hf_key("rotary_emb", "LlamaRotaryEmbedding")
    assert not np.array_equal(out(bad_hf, rot), out(hf, rot))
    q = hf_key("layers.0.self_attn.q_proj", "Linear")
    assert np.array_equal(out(bad_hf, q), out(hf, q))
    vrot = hf_key("layers.0.self_attn.rotary_emb", "RotaryEmbedding")
    assert np.array_equal(arg(bad_v, vrot, 1), arg(vllm, vrot, 1))
    assert not close(out(bad_v, vrot), out(vllm, vrot), 1e-3)


def test_different_activation_changes_class_and_math(vllm):
    bad = run("vllm", [F.Activation("rollout", "gelu_tanh", 1)])
    assert hf_key("layers.1.mlp.act_fn", "GeluAndMul") in bad
    assert hf_key("layers.1.mlp.act_fn", "SiluAndMul") not in bad
    assert hf_key("layers.0.mlp.act_fn", "SiluAndMul") in bad
    down = hf_key("layers.1.mlp.down_proj", "RowParallelLinear")
    assert not close(arg(bad, down), arg(vllm, down), 1e-3)


def test_missing_activation_removes_act_module_on_train_only(tmp_path):
    train, rollout = synth.generate_pair(tmp_path, faults=[F.MissingActivation("train", 2)])
    t, r = load(train)["data"], load(rollout)["data"]
    assert hf_key("layers.2.mlp.act_fn", "SiLUActivation") not in t
    assert hf_key("layers.1.mlp.act_fn", "SiLUActivation") in t
    assert hf_key("layers.2.mlp.act_fn", "SiluAndMul") in r
    ent = run("hf", [F.MissingActivation("train", 2)])
    gate = out(ent, hf_key("layers.2.mlp.gate_proj", "Linear"))
    up = out(ent, hf_key("layers.2.mlp.up_proj", "Linear"))
    assert close(arg(ent, hf_key("layers.2.mlp.down_proj", "Linear")), gate * up)


@pytest.mark.parametrize("layout,act_key,down_key", [
    ("hf", None, hf_key("layers.1.mlp.down_proj", "Linear")),
    ("vllm", hf_key("layers.1.mlp.act_fn", "SiluAndMul"), hf_key("layers.1.mlp.down_proj", "RowParallelLinear")),
    ("megatron", None, "Module.decoder.layers.1.mlp.linear_fc2.TERowParallelLinear.forward.0"),
])
def test_extra_op_is_a_one_sided_module_before_down_proj(layout, act_key, down_key):
    ent = run(layout, [F.ExtraOp("rollout", 1, "scale", 0.5)])
    keys = list(ent)
    extra = [k for k in keys if ".extra_op." in k]
    assert len(extra) == 1 and ".layers.1.mlp.extra_op.Scale.forward.0" in extra[0]
    assert keys.index(extra[0]) + 1 == keys.index(down_key)
    e = ent[extra[0]]
    assert e.parent.endswith(("LlamaMLP.forward.0", "MLP.forward.0"))
    assert np.array_equal(e.output[0].data, e.input_args[0].data * np.float32(0.5))
    assert np.array_equal(arg(ent, down_key), e.output[0].data)
    if act_key:
        assert np.array_equal(e.input_args[0].data, out(ent, act_key))


def test_bf16_whole_side():
    ent = run("vllm", [F.HalfPrecision("rollout")])
    clean = run("vllm")
    for e in ent.values():
        for leaf in leaves(e):
            if leaf.dtype == "torch.int64":
                continue
            assert leaf.dtype == "torch.bfloat16", e.key
            assert np.array_equal(to_bf16(leaf.data), leaf.data), e.key
    key = "Module.logits_processor.LogitsProcessor.forward.0"
    assert not np.array_equal(out(ent, key), out(clean, key)) and close(out(ent, key), out(clean, key), 0.2)
    stats = synth.leaf_stats(ent[key].output[0])
    assert stats["Mean"] == float(to_bf16(np.array([stats["Mean"]], np.float32))[0])


@pytest.mark.parametrize("layout,key", [("hf", "Module.lm_head.Linear.forward.0"),
                                        ("vllm", "Module.logits_processor.LogitsProcessor.forward.0")])
def test_bf16_lm_head_only(layout, key):
    ent = run(layout, [F.HalfPrecision("train", "lm_head")])
    for k, e in ent.items():
        dtypes = {x.dtype for x in leaves(e) if x.dtype != "torch.int64"}
        assert dtypes == ({"torch.bfloat16"} if k == key else {"torch.float32"}), k


def test_kernel_noise_makes_clean_pair_not_bit_identical(hf):
    noisy = run("hf", [F.KernelNoise("train", 1e-6)])
    key = "Module.lm_head.Linear.forward.0"
    a, b = out(noisy, key), out(hf, key)
    assert not np.array_equal(a, b)
    assert np.max(np.abs(a - b)) / np.max(np.abs(b)) < 1e-4


FAULTS = [
    F.CorruptWeight("rollout", "embed"), F.CorruptWeight("rollout", "final_norm"),
    F.CorruptWeight("rollout", "lm_head"), F.CorruptWeight("rollout", "o", 0),
    F.CorruptWeight("rollout", "down", 3), F.CorruptWeight("rollout", "up", 0),
    F.CorruptWeight("rollout", "input_norm", 1), F.CorruptWeight("rollout", "post_norm", 1),
    F.PermuteQKV("rollout", 0), F.NormEps("rollout", 1e-1), F.RopeTheta("rollout", 1e6),
    F.Activation("rollout", "gelu_tanh"), F.MissingActivation("rollout", 0),
    F.ExtraOp("rollout", 0, "relu"), F.HalfPrecision("rollout"), F.HalfPrecision("rollout", "lm_head"),
    F.KernelNoise("rollout"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.describe())
@pytest.mark.parametrize("side,layout", [("rollout", "vllm"), ("rollout", "sglang"),
                                         ("train", "hf"), ("train", "hf_fsdp"),
                                         ("train", "megatron"), ("train", "megatron_local")])
def test_each_fault_changes_its_side_only(tmp_path, fault, side, layout):
    fault = dataclasses.replace(fault, side=side)
    if isinstance(fault, F.PermuteQKV) and layout.startswith("hf"):
        pytest.skip("no fused qkv weight in HF layouts")
    other = 0 if side == "rollout" else 1
    kwargs = {f"{side}_layout": layout}
    clean = synth.generate_pair(tmp_path / "clean", **kwargs)
    bad = synth.generate_pair(tmp_path / "bad", faults=[fault], **kwargs)
    assert (clean[other] / "dump.json").read_text() == (bad[other] / "dump.json").read_text()
    # The last entry holds the logits in every layout.
    logits = lambda d: json.dumps(list(load(d)["data"].values())[-1]["output"])  # noqa: E731
    assert logits(clean[1 - other]) != logits(bad[1 - other]), fault.describe()
    assert fault.describe().startswith(f"{side}: ")


def test_faults_can_be_combined():
    ent = run("vllm", [F.CorruptWeight("rollout", "q", 0), F.HalfPrecision("rollout"),
                       F.MissingActivation("rollout", 3)])
    assert hf_key("layers.3.mlp.act_fn", "SiluAndMul") not in ent
    assert ent["Module.logits_processor.LogitsProcessor.forward.0"].output[0].dtype == "torch.bfloat16"


# ---------------------------------------------------------------- fault syntax, CLI, speed

@pytest.mark.parametrize("text,expected", [
    ("corrupt:rollout:gate:1", F.CorruptWeight("rollout", "gate", 1)),
    ("corrupt:train:lm_head", F.CorruptWeight("train", "lm_head")),
    ("corrupt:train:q:0:2.0:7", F.CorruptWeight("train", "q", 0, 2.0, 7)),
    ("permute_qkv:rollout:1:shuffle", F.PermuteQKV("rollout", 1, "shuffle")),
    ("eps:rollout:1e-3", F.NormEps("rollout", 1e-3)),
    ("eps:rollout:1e-3:2", F.NormEps("rollout", 1e-3, 2)),
    ("rope_theta:train:500000", F.RopeTheta("train", 500000.0)),
    ("act:rollout:gelu_tanh", F.Activation("rollout", "gelu_tanh")),
    ("no_act:train:2", F.MissingActivation("train", 2)),
    ("extra_op:rollout:1:relu", F.ExtraOp("rollout", 1, "relu")),
    ("bf16:rollout:lm_head", F.HalfPrecision("rollout", "lm_head")),
    ("noise:train:1e-5", F.KernelNoise("train", 1e-5)),
])
def test_parse_fault(text, expected):
    assert synth.parse_fault(text) == expected
    assert expected.describe()


@pytest.mark.parametrize("text", ["bogus:train", "corrupt:both:q:0", "corrupt:train:q",
                                  "corrupt:train:nope:0", "act:train:tanh", "bf16:train:half",
                                  "no_act:train", "eps:train:1e-3:0:9"])
def test_parse_fault_rejects_bad_input(text):
    with pytest.raises(ValueError):
        synth.parse_fault(text)


def test_layer_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="out of range"):
        run("hf", [F.MissingActivation("train", CFG.layers)])


def test_cli_writes_pair(tmp_path, capsys):
    rc = cli_main(["--out", str(tmp_path), "--rollout-layout", "sglang", "--layers", "2",
                   "--fault", "corrupt:rollout:gate:1", "--train-layout", "hf_fsdp",
                   "--train-option", "checkpoint=true"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "rollout: gate weight of layer 1" in text
    train = load(tmp_path / "train" / "step0" / "rank0")["data"]
    assert any("_checkpoint_wrapped_module" in k for k in train)
    assert sum(".LlamaDecoderLayer." in k for k in train) == 2
    assert (tmp_path / "rollout" / "step0" / "rank0" / "construct.json").exists()


def test_generation_is_fast_and_deterministic(tmp_path):
    start = time.perf_counter()
    a = synth.generate_pair(tmp_path / "a", synth.Config(layers=4, hidden=64))
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    b = synth.generate_pair(tmp_path / "b", synth.Config(layers=4, hidden=64))
    assert (a[1] / "dump.json").read_text() == (b[1] / "dump.json").read_text()


def test_a_dump_streamed_call_by_call_is_the_one_written_from_copied_entries(tmp_path):
    """synth.stream cuts each entry into calls as its module finishes (tools/gendump.py at a real
    model's width): the same dump.json, byte for byte, and the same construct.json as cutting the
    finished forward's entries (synth.decode) and writing them."""
    from synth.decode import split_prefill_decode
    from synth.stream import CallDump

    cfg = synth.Config(seq_len=7)
    spans = [(0, 3)] + [(t, t + 1) for t in range(3, 7)]
    synth.write_dump(tmp_path / "copied", split_prefill_decode(synth.run_side(cfg, "vllm", grad=False), 7, 3))
    dump = CallDump(tmp_path / "streamed", 7, spans, lambda key, n: f"{key.rsplit('.', 1)[0]}.{n}")
    assert synth.run_side(cfg, "vllm", sink=dump.add) == [] and dump.modules > 0
    dump.write()
    assert (tmp_path / "streamed" / "dump.json").read_bytes() == (tmp_path / "copied" / "dump.json").read_bytes()
    construct = [json.loads((tmp_path / d / "construct.json").read_text()) for d in ("streamed", "copied")]
    assert construct[0] == construct[1]
    # Call by call, each call's modules in start order (the copied entries keep one start per module).
    calls = [int(k.rsplit(".", 1)[1]) for k in construct[0]]
    assert calls == sorted(calls) and len(set(calls)) == len(spans)


def test_a_side_with_a_corrupted_weight_leaves_the_other_sides_weights_alone():
    """Weights.copy shares the arrays (a fault replaces a weight, never writes into one): a clean side
    holds no second copy of the model, and a corrupted one still leaves the other side's weight alone."""
    weights = synth.init_weights(CFG)
    before = weights.layers[1].down.copy()
    bad = {e.key: e for e in synth.run_side(CFG, "hf", [F.CorruptWeight("train", "down", 1)], weights=weights)}
    good = {e.key: e for e in synth.run_side(CFG, "hf", weights=weights)}
    key = "Module.model.layers.1.mlp.down_proj.Linear.forward.0"
    assert np.array_equal(weights.layers[1].down, before)
    assert good[key].parameters["weight"].data is weights.layers[1].down
    assert not np.array_equal(bad[key].parameters["weight"].data, before)
