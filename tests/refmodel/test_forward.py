"""The numpy reference forward against transformers' own outputs (recorded by
tools/make_refmodel_fixtures.py from each family's tiny checkpoint), resuming, injections."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dumpcompare import checkpoint
from dumpcompare.refmodel import Injection, family, final_logits, forward

DATA = Path(__file__).resolve().parents[1] / "data" / "refmodel"
ROOT = DATA.parents[2]
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen3_moe", "mixtral")
# A family's checkpoint recorded under another rope config, at positions where it matters.
VARIANTS = ("llama_rope_llama3", "qwen2_rope_linear", "phi3_partial_rotary")
FP32_TOL = 1e-5


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _recording(name: str):
    rec = np.load(DATA / f"{name}.npz", allow_pickle=False)
    return rec, checkpoint.load(ROOT / str(rec["model"]))


def _run(rec, ckpt, **kw):
    kw.setdefault("positions", rec["positions"])
    return list(forward(ckpt, json.loads(str(rec["config"])), rec["ids"], **kw))


def _against(rec, outputs, kind: str) -> dict[str, float]:
    """Relative error of every yielded module against the recording, in hook order (the rotary
    module of Gemma 3 runs once per attention type in an order transformers does not fix)."""
    names = [str(n) for n in rec["modules"]]
    assert [o.module for o in outputs] == names
    errors = {}
    for i, out in enumerate(outputs):
        want = rec[f"{kind}_{i:03d}"]
        if out.module == "model.rotary_emb":
            cands = [rec[f"{kind}_{j:03d}"] for j, n in enumerate(names) if n == out.module]
            errors[f"{out.module}#{i}"] = min(_rel(out.array, c) if c.shape == out.array.shape else np.inf
                                             for c in cands)
        else:
            assert out.array.shape == want.shape, out.module
            assert out.array.dtype == np.float32
            errors[out.module] = _rel(out.array, want)
    return errors


@pytest.mark.parametrize("name", FAMILIES + VARIANTS)
def test_fp32_forward_equals_transformers(name):
    rec, ckpt = _recording(name)
    assert family(ckpt.config) == name.split("_rope")[0].split("_partial")[0]
    errors = _against(rec, _run(rec, ckpt), "fp32")
    worst = max(errors, key=errors.get)
    assert errors[worst] < FP32_TOL, (worst, errors[worst])


@pytest.mark.parametrize("name", VARIANTS)
def test_rope_variants_matter_at_the_recorded_positions(name):
    """The variant's config is what made the recording: the checkpoint's own config, at the same
    positions, departs at the rotary tables (and everything after the first attention)."""
    rec, ckpt = _recording(name)
    errors = _against(rec, list(forward(ckpt, ckpt.config, rec["ids"], positions=rec["positions"])), "fp32")
    assert errors["model.layers.0.self_attn.o_proj"] > 1e-3
    assert errors["model.layers.0.input_layernorm"] < FP32_TOL


@pytest.mark.parametrize("name", FAMILIES + VARIANTS)
def test_bf16_rounding_points_are_transformers_own(name):
    """With dtype=bf16 the reference follows transformers loaded in bf16: bit for bit up to the
    attention core (embedding and its scale, rotary tables, norms, q/k/v and q/k norms), where the
    fp32 reference is visibly off, and to the logits within a few bf16 rounding flips (cos/sin
    from another libm), at least three times closer than the fp32 reference."""
    rec, ckpt = _recording(name)
    bf = _against(rec, _run(rec, ckpt, dtype="bf16"), "bf16")
    fp = _against(rec, _run(rec, ckpt), "bf16")
    names = list(bf)
    before_core = names[:next(i for i, n in enumerate(names) if n.endswith("o_proj"))]
    assert len(before_core) >= 4
    for module in before_core:
        assert bf[module] == 0.0 and fp[module] > 1e-4, (module, bf[module], fp[module])
    assert max(bf.values()) < 5e-3, max(bf, key=bf.get)
    assert bf["lm_head"] <= fp["lm_head"] / 3, (bf["lm_head"], fp["lm_head"])


def test_attention_kernels_round_differently_only_inside_attention():
    """The flash and fp32 kernels keep the scores (and, fp32, the probabilities) unrounded: the
    outputs leave the eager ones from the first o_proj on, by bf16 noise; in fp32 all agree."""
    rec, ckpt = _recording("gemma2")
    eager = _run(rec, ckpt, dtype="bf16")
    for kernel in ("flash", "fp32"):
        other = _run(rec, ckpt, dtype="bf16", attention=kernel)
        changed = _changed(eager, other)
        assert changed[0] == "model.layers.0.self_attn.o_proj", (kernel, changed[:2])
        assert max(_rel(a.array, b.array) for a, b in zip(other, eager)) < 2e-2
        assert _changed(_run(rec, ckpt), _run(rec, ckpt, attention=kernel)) == []


@pytest.mark.parametrize("fam", ["llama", "gemma2", "qwen3_moe", "phi3"])
def test_resume_from_a_layer_equals_the_full_run(fam):
    rec, ckpt = _recording(fam)
    full = list(forward(ckpt, ckpt.config, rec["ids"]))
    layer0 = next(o.array for o in full if o.module == "model.layers.0")
    resumed = list(forward(ckpt, ckpt.config, rec["ids"], start_layer=1, hidden=layer0))
    tail = full[[o.module for o in full].index("model.layers.0") + 1:]
    assert [o.module for o in resumed] == [o.module for o in tail]
    for a, b in zip(resumed, tail):
        np.testing.assert_array_equal(a.array, b.array, err_msg=a.module)


def _changed(clean, other) -> list[str]:
    assert [o.module for o in clean] == [o.module for o in other]
    return [a.module for a, b in zip(clean, other) if not np.array_equal(a.array, b.array)]


@pytest.mark.parametrize("inject", [
    Injection(config={"rms_norm_eps": 1e-1}, from_layer=1),
    Injection(config={"rope_theta": 100.0}, from_layer=1),
    Injection(config={"hidden_act": "gelu"}, from_layer=1),
    Injection(config={"attention_scale": 0.5}, from_layer=1),
    Injection(weights={"model.layers.1.self_attn.q_proj.weight": lambda w: w[::-1]}, from_layer=1),
])
def test_injection_changes_exactly_the_layers_from_from_layer(inject):
    rec, ckpt = _recording("llama")
    clean = list(forward(ckpt, ckpt.config, rec["ids"]))
    hurt = list(forward(ckpt, ckpt.config, rec["ids"], inject=inject))
    changed = _changed(clean, hurt)
    assert changed and all(m.startswith("model.layers.1") or m in ("model.norm", "lm_head") for m in changed)
    assert "model.layers.1" in changed and "lm_head" in changed


def test_injection_before_its_layer_changes_nothing():
    """A weight of layer 0 replaced with from_layer=1 is not applied (the fault starts later)."""
    rec, ckpt = _recording("llama")
    inject = Injection(weights={"model.layers.0.mlp.up_proj.weight": lambda w: 2 * w}, from_layer=1)
    assert _changed(list(forward(ckpt, ckpt.config, rec["ids"])),
                    list(forward(ckpt, ckpt.config, rec["ids"], inject=inject))) == []


def test_fused_and_split_names_reach_the_same_weight():
    """A fault named on the fused [q; k; v] equals the same fault named on k_proj (llama stores
    split), and on phi3 (stored fused) a split name reaches the part of qkv_proj."""
    rec, ckpt = _recording("llama")
    kv = 16

    def fused(w):
        w = w.copy()
        w[64:64 + kv] *= -1
        return w

    a = list(forward(ckpt, ckpt.config, rec["ids"],
                     inject=Injection(weights={"model.layers.1.self_attn.qkv_proj.weight": fused})))
    b = list(forward(ckpt, ckpt.config, rec["ids"],
                     inject=Injection(weights={"model.layers.1.self_attn.k_proj.weight": lambda w: -w})))
    assert "model.layers.1.self_attn.k_proj" in _changed(list(forward(ckpt, ckpt.config, rec["ids"])), a)
    assert _changed(a, b) == []
    rec, ckpt = _recording("phi3")
    c = list(forward(ckpt, ckpt.config, rec["ids"],
                     inject=Injection(weights={"model.layers.0.mlp.up_proj.weight": lambda w: 0 * w})))
    gate_up = next(o.array for o in c if o.module == "model.layers.0.mlp.gate_up_proj")
    assert np.all(gate_up[:, 128:] == 0) and np.any(gate_up[:, :128] != 0)


def test_untied_head_injection_on_a_tied_model():
    """Gemma 2 ties its head to the embedding; a stale head named lm_head.weight changes only the
    logits, and the head's softcapping is applied after the module."""
    rec, ckpt = _recording("gemma2")
    clean = list(forward(ckpt, ckpt.config, rec["ids"]))
    stale = list(forward(ckpt, ckpt.config, rec["ids"], inject=Injection(weights={"lm_head.weight": lambda w: w * 0.5})))
    assert _changed(clean, stale) == ["lm_head"]
    np.testing.assert_allclose(stale[-1].array, 0.5 * clean[-1].array, rtol=1e-5, atol=1e-6)
    capped = final_logits(ckpt.config, clean[-1].array)
    assert np.abs(capped).max() <= 2.0 and _rel(capped, 2.0 * np.tanh(clean[-1].array / 2.0)) < 1e-6


def test_unknown_family_is_none():
    assert family({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}) is None
    assert family({}) is None
    assert family({"architectures": ["Qwen2ForCausalLM"]}) == "qwen2"
    assert family(json.loads((ROOT / "tests/data/real/_models/qwen3_moe/config.json").read_text())) == "qwen3_moe"


def test_checkpoint_rows_read_only_the_part_asked():
    _rec, ckpt = _recording("llama")
    name = "model.embed_tokens.weight"
    whole = ckpt.read(name)
    np.testing.assert_array_equal(ckpt.rows(name, np.array([7, 3, 7])), whole[[7, 3, 7]])
    np.testing.assert_array_equal(ckpt.rows(name, slice(290, 400)), whole[290:])


def test_stacked_experts_equal_per_expert_tensors(tmp_path):
    """Qwen3-MoE saved with stacked experts (experts.gate_up_proj [E, 2I, H], experts.down_proj
    [E, H, I], transformers 5's in-memory layout) runs the same forward as per-expert tensors."""
    from refcheck.test_checkpoint_reader import write_safetensors

    rec, ckpt = _recording("qwen3_moe")
    tensors = {}
    for name in ckpt.tensors:
        if ".experts." not in name:
            tensors[name] = ("F32", ckpt.read(name))
    for layer in range(2):
        base = f"model.layers.{layer}.mlp.experts"
        per = lambda e, n: ckpt.read(f"{base}.{e}.{n}.weight")  # noqa: E731
        tensors[f"{base}.gate_up_proj"] = ("F32", np.stack(
            [np.concatenate([per(e, "gate_proj"), per(e, "up_proj")]) for e in range(4)]))
        tensors[f"{base}.down_proj"] = ("F32", np.stack([per(e, "down_proj") for e in range(4)]))
    write_safetensors(tmp_path / "model.safetensors", tensors)
    (tmp_path / "config.json").write_text(json.dumps(ckpt.config))
    stacked = checkpoint.load(tmp_path)
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" not in stacked.tensors
    assert _changed(_run(rec, ckpt), _run(rec, stacked)) == []


def test_bf16_rounding_is_torchs_round_to_nearest_even():
    from dumpcompare.refmodel.ops import bf16
    from dumpcompare.tensorio import bfloat16_bits, widen_bf16

    rng = np.random.default_rng(3)
    a = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.3895314e38, 1.00390625,
                                  1.01171875, -1.00390625], dtype=np.float32)])
    want = widen_bf16(bfloat16_bits(a))
    got = bf16(a)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[-3] == 1.0 and got[-2] == 1.015625      # ties go to the even mantissa


def test_unimplemented_features_are_named():
    from dumpcompare.refmodel import UnsupportedModel

    rec, ckpt = _recording("llama")
    config = {**ckpt.config, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}
    with pytest.raises(UnsupportedModel, match="yarn"):
        next(forward(ckpt, config, rec["ids"]))
    with pytest.raises(UnsupportedModel, match="gpt2"):
        next(forward(ckpt, {**ckpt.config, "model_type": "gpt2", "architectures": []}, rec["ids"]))
    with pytest.raises(ValueError, match="dtype"):
        next(forward(ckpt, ckpt.config, rec["ids"], dtype="fp16"))
    partial = checkpoint.Checkpoint(ckpt.folder, ckpt.files, {n: t for n, t in ckpt.tensors.items()
                                                              if n != "model.layers.1.mlp.down_proj.weight"}, ckpt.config)
    with pytest.raises(UnsupportedModel, match="model.layers.1.mlp.down_proj.weight"):
        list(forward(partial, ckpt.config, rec["ids"]))
    with pytest.raises(ValueError, match="0..299"):
        next(forward(ckpt, ckpt.config, np.array([1, 300])))
    with pytest.raises(ValueError, match="no token"):
        next(forward(ckpt, ckpt.config, np.array([], dtype=np.int64)))


@pytest.mark.parametrize("case", ["llama_tp1_tensor_clean", "llama_gen_tensor_clean"])
def test_real_train_dump_statistics_equal_the_reference(case):
    """The real corpus: the transformers train side dumped in tensor mode (its input ids are
    dumped too). Every module's msprobe statistics (Max, Min, Mean, Norm of output.0) equal the
    reference forward's on the same ids, and the module set is the reference's."""
    import re

    from dumpcompare import tensorio

    folder = ROOT / "tests" / "data" / "real" / case / "train" / "step0" / "proc0"
    data = json.loads((folder / "dump.json").read_text())["data"]
    embed = data["Module.model.embed_tokens.Embedding.forward.0"]
    ids = tensorio.load_tensor(folder / "dump_tensor_data" / embed["input_args"][0]["data_name"]).reshape(-1)
    ckpt = checkpoint.load(ROOT / "tests" / "data" / "real" / "_models" / "llama")
    ref = {o.module: o.array.astype(np.float64) for o in forward(ckpt, ckpt.config, ids)}
    checked = 0
    for key, entry in data.items():
        module = re.fullmatch(r"Module\.(.+)\.\w+\.forward\.0", key).group(1)
        if module == "model":   # the model's output is a ModelOutput, not a tensor
            continue
        stats, a = entry["output"][0], ref[module]
        for name, value in (("Max", a.max()), ("Min", a.min()), ("Mean", a.mean()), ("Norm", np.linalg.norm(a))):
            assert abs(value - stats[name]) <= 1e-5 * max(abs(stats[name]), 1e-3), (module, name, value, stats[name])
        checked += 1
    assert checked == len(data) - 1 >= 25


def test_multimodal_gemma3_layout_reads_the_language_model(tmp_path):
    """A Gemma3ForConditionalGeneration folder nests the text config under text_config and
    stores the text model under model.language_model.: the same forward, the same outputs."""
    from refcheck.test_checkpoint_reader import write_safetensors

    rec, ckpt = _recording("gemma3")
    tensors = {name.replace("model.", "model.language_model.", 1): ("F32", ckpt.read(name)) for name in ckpt.tensors}
    tensors["model.vision_tower.patch.weight"] = ("F32", np.ones((2, 2), dtype=np.float32))
    write_safetensors(tmp_path / "model.safetensors", tensors)
    text = json.loads(str(rec["config"]))
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": {**text, "model_type": "gemma3_text"}, "vision_config": {"hidden_size": 2}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    nested = checkpoint.load(tmp_path)
    assert family(config) == "gemma3"
    assert _changed(_run(rec, ckpt), list(forward(nested, config, rec["ids"], positions=rec["positions"]))) == []
