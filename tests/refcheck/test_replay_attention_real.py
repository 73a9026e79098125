"""Attention replays (dumpcompare/replay/attention.py) on real tensor-mode msprobe dumps.

The dumped tensors were computed by torch: transformers' eager attention (RoPE and the core
inline, checked against o_proj's input), the vLLM-structured ``Attention`` module and
megatron-core's ``core_attention`` (checked against their outputs). tests/data/replay holds real
pairs with a wrong attention scale on either side and a wrong rope_theta on the transformers side
(tools/make_replay_cases.py, tools/real_dumps/attention_faults.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dumpcompare.replay.kernels import rotate
from dumpcompare.replay.attention import SCALE, Problem, attend, fit, layer_window, scale_candidates
from refcheck.realcases import COMPARE, CORPUS, first_root_cause, run, run_pair

REPLAY = Path(__file__).resolve().parents[1] / "data" / "replay"
MODEL = CORPUS / "_models" / "llama"


def _attention(out, side=None):
    reps = json.loads((out / "output_3_value_compare.json").read_text())["replays"]
    return [r for r in reps if r["op"] == "attention" and side in (None, r["side"])]


def _residual(rec, value):
    return next(r for v, r in rec["residuals"] if v == value)


def test_the_composite_replay_equals_torchs_o_proj_input(tmp_path):
    """Clean fp32 dump: q/k/v outputs + RoPE from the positions and the config's theta + causal GQA
    softmax reproduce transformers' o_proj input to float32 rounding, in every layer; the other
    scales and thetas are far off. vLLM's attn module is reproduced from its inputs alike."""
    proc = run(COMPARE, "llama_tp1_tensor_clean", tmp_path)
    assert proc.returncode == 0, proc.stderr
    train = _attention(tmp_path, "train")
    assert {(r["module"], r["key"]) for r in train} == {
        (f"model.layers.{i}.self_attn", k) for i in (0, 1) for k in (SCALE, "rope_theta")}
    for r in train:
        assert r["source"].startswith("composite") and r["rope"] == "positions"
        assert r["reproduces_reference"] is True and r["residual_at_reference"] < 1e-6, r
        assert r["tokens"] == {"queries": 8, "keys": 8}
        if r["key"] == SCALE:
            assert r["reference_value"] == 0.25 and r["scale_from"] == "head_dim"
            assert r["reproducing_values"] == [0.25] and _residual(r, 1.0) > 0.1
        else:
            assert r["reference_value"] == 1e4 and r["reproducing_values"] == [1e4]
            assert _residual(r, 1e6) > 1e-3
    rollout = _attention(tmp_path, "rollout")
    assert {r["module"] for r in rollout} == {"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}
    assert all(r["key"] == SCALE and r["residual_at_reference"] < 1e-6 and r["rope"] == "applied before"
               for r in rollout)


def test_gemma2_attention_is_replayed_with_its_scale_soft_cap_and_window(tmp_path):
    """Clean bf16 Gemma 2 pair: the scale from query_pre_attn_scalar, the logit soft cap 1.0 and the
    window 4 of layer 0 reproduce both sides; without the cap or the window the replay is far off.
    Theta 1e5 is as good as 1e4 on layer 1 at bf16 precision, and is said to be."""
    proc = run_pair(COMPARE, REPLAY / "gemma2_tensor_clean", tmp_path, "--model", str(CORPUS / "_models" / "gemma2"))
    assert proc.returncode == 0, proc.stderr
    reps = _attention(tmp_path)
    by = {(r["side"], r["layer"], r["key"]): r for r in reps}
    assert set(by) == {(s, i, k) for s in ("train", "rollout") for i in (0, 1)
                       for k in (SCALE, "attn_logit_softcapping")} | {
        ("train", 0, "sliding_window"), ("rollout", 0, "sliding_window"), ("train", 0, "rope_theta"),
        ("train", 1, "rope_theta")}              # Gemma 2 slides on its even layers only
    assert all(r["reproduces_reference"] is True and r["dtype"] == "bfloat16" for r in reps)
    scale = by[("train", 0, SCALE)]
    assert scale["scale_from"] == "query_pre_attn_scalar" and scale["reference_value"] == 0.25
    for side in ("train", "rollout"):
        assert _residual(by[(side, 0, "attn_logit_softcapping")], 0.0) > 3 * by[(side, 0, SCALE)]["tolerance"]
        assert _residual(by[(side, 0, "sliding_window")], 0) > 0.1
    theta = by[("train", 1, "rope_theta")]
    assert theta["reproducing_values"] == [1e4, 1e5] and "cannot be told apart" in theta["indistinguishable"]


def test_a_decode_step_is_replayed_with_the_earlier_steps_keys_and_values(tmp_path):
    proc = run(COMPARE, "llama_gen_tensor_clean", tmp_path)
    assert proc.returncode == 0, proc.stderr
    decode = [r for r in _attention(tmp_path, "rollout") if r["call"] == 1]
    assert len(decode) == 2
    for r in decode:             # step1: one query at position 8 over the 8 prefill keys and its own
        assert r["tokens"] == {"queries": 1, "keys": 9}
        assert r["reproduces_reference"] is True and r["residual_at_reference"] < 1e-6


def test_a_decode_step_without_the_earlier_steps_is_skipped_with_its_reason(tmp_path):
    folder = CORPUS / "llama_gen_tensor_clean"
    proc = run_pair(COMPARE, folder, tmp_path, "--rollout-step", "1", "--model", str(MODEL))
    assert proc.returncode == 0, proc.stderr
    rollout = _attention(tmp_path, "rollout")
    assert rollout and all(r["skipped"] == "earlier_kv_missing" and "8 earlier positions" in r["reason"]
                           and "reproduces_reference" not in r for r in rollout)


def test_megatron_core_attention_is_replayed_from_its_sequence_first_inputs(tmp_path):
    proc = run(COMPARE, "megatron_tp1_tensor_clean", tmp_path)
    assert proc.returncode == 0, proc.stderr
    train = _attention(tmp_path, "train")
    assert {r["module"] for r in train} == {f"decoder.layers.{i}.self_attention.core_attention" for i in (0, 1)}
    assert all(r["residual_at_reference"] < 1e-6 and r["reproducing_values"] == [0.25] for r in train)


def test_without_model_attention_is_not_replayed_and_says_why(tmp_path):
    proc = run(COMPARE, "llama_tp1_tensor_clean", tmp_path, model=False)
    assert proc.returncode == 0, proc.stderr
    reps = _attention(tmp_path)
    assert len(reps) == 4 and {r["skipped"] for r in reps} == {"no_config"}


@pytest.mark.parametrize("case, key, wrong, right", [
    ("llama_tensor_attn_scale_train", SCALE, 1.0, 0.25),
    ("llama_tensor_attn_scale_rollout", SCALE, 1.0, 0.25),
    ("llama_tensor_rope_theta_train", "rope_theta", 1e6, 1e4),
])
def test_the_attention_replay_names_the_side_the_key_and_the_value_it_used(case, key, wrong, right, tmp_path):
    fault, rc = first_root_cause(REPLAY / case, tmp_path, MODEL)
    assert rc["category"] == "in_module_impl_difference" and rc["train_module"] == fault["target"]
    assert rc["side"] == fault["side"] and key in rc["config_keys"]
    ev = [e for e in rc["side_evidence"] if e["kind"] == "replay" and e["op"] == "attention"]
    bad = next(e for e in ev if e["side"] == fault["side"] and e["key"] == key)
    assert bad["reproduces_reference"] is False and bad["fitted"]["value"] == wrong
    assert bad["fitted"]["residual"] <= bad["tolerance"] < bad["residual_at_reference"]
    # every other fitted key of the faulty side, and every key of the other side, is the reference's
    assert all(e["reproduces_reference"] is True for e in ev if e is not bad)
    assert {e["side"] for e in ev} == {"train", "rollout"}
    assert rc["next_checks"][0]["check"].startswith(f"Set {key} to {right!r} on the {fault['side']} side")
    assert f"{key}={wrong!r}" in rc["side_reason"]


def test_bf16_eps_values_are_said_to_be_indistinguishable(tmp_path):
    """In bf16 (the attention-scale pair's dtype) eps 1e-6 and 1e-5 give the same RMSNorm output to
    the data's precision: both are listed and said to be indistinguishable (fp32 tells them apart:
    test_replay_real.py)."""
    proc = run_pair(COMPARE, REPLAY / "llama_tensor_attn_scale_train", tmp_path, "--model", str(MODEL))
    assert proc.returncode == 0, proc.stderr
    reps = json.loads((tmp_path / "output_3_value_compare.json").read_text())["replays"]
    final = next(r for r in reps if r["side"] == "train" and r["module"] == "model.norm")
    assert final["dtype"] == "bfloat16" and final["reproduces_reference"] is True
    assert {1e-6, 1e-5} <= set(final["reproducing_values"])
    assert "cannot be told apart" in final["indistinguishable"] and "1e-05" in final["indistinguishable"]


def test_attention_formulas():
    """attend, rotate, the window and scale rules, on numbers worked by hand."""
    v = np.array([[4.0, 0.0], [0.0, 8.0]])
    q = np.array([[0.0, 0.0], [math.log(3.0), 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 0.0]])
    # token 0 sees itself only; token 1 weighs its keys 3:1 (scores ln 3 and 0)
    assert np.allclose(attend(q, k, v, 2, 1.0, 0.0, 0), [[4.0, 0.0], [3.0, 2.0]])
    assert np.allclose(attend(q, k, v, 2, 1.0, 0.0, 1), v)                 # window 1: itself only
    w = math.exp(math.tanh(math.log(3.0)))                                 # cap 1: ln 3 -> tanh(ln 3)
    assert np.allclose(attend(q, k, v, 2, 1.0, 1.0, 0)[1], [4 * w / (w + 1), 8 / (w + 1)])
    assert np.allclose(attend(q[1:], k, v, 2, 1.0, 0.0, 0, kv_offset=1), [[3.0, 2.0]])   # a decode step
    two = attend(np.concatenate([q, q], 1), k, v, 2, 1.0, 0.0, 0)          # 2 query heads share the KV head
    assert np.allclose(two, np.concatenate([[[4.0, 0.0], [3.0, 2.0]]] * 2, 1))
    # one head of 4, rotary over the first 2 features, angle 1 radian
    c, s = np.cos(1.0), np.sin(1.0)
    assert np.allclose(rotate(np.array([[1.0, 0.0, 5.0, 6.0]]), np.array([[c]]), np.array([[s]]), 4), [[c, s, 5, 6]])
    gemma = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"], "query_pre_attn_scalar": 64,
             "num_attention_heads": 4, "hidden_size": 64}
    assert layer_window(gemma, 0) == 4 and layer_window(gemma, 1) == 0
    assert layer_window({"sliding_window": 4}, 1) == 4                   # Mistral: every layer
    assert layer_window({"sliding_window": 4096, "use_sliding_window": False}, 0) == 0
    cands, ref, source = scale_candidates(gemma, 16)
    assert (ref, source) == (0.125, "query_pre_attn_scalar") and cands["head_dim**-0.5"] == 0.25


def test_scales_the_data_cannot_tell_apart_are_said_to_be_so():
    """Keys that all score the same (zero queries): every scale gives the same uniform weights,
    so no scale can be preferred and the record says so instead of picking one."""
    rng = np.random.default_rng(0)
    k, v = rng.normal(size=(4, 2)), rng.normal(size=(4, 2))
    q = np.zeros((4, 2))
    target = attend(q, k, v, 2, 0.7, 0.0, 0).astype(np.float32).astype(np.float64)
    cfg = {"num_attention_heads": 1, "hidden_size": 2, "head_dim": 2}
    rec = fit(Problem(q, k, v, target, 2, "float32"), cfg, 0, 1e-6, with_theta=False)[0]
    assert rec["key"] == SCALE and rec["reproduces_reference"] is True
    assert set(rec["reproducing_values"]) == {round(2 ** -0.5, 9), 1.0}
    assert "cannot be told apart" in rec["indistinguishable"]


def test_a_long_prefill_is_replayed_on_its_leading_tokens(monkeypatch):
    """Under the causal mask the first n queries need only the first n keys: a prefill over the score
    budget is replayed on its leading tokens, and still decides."""
    import dumpcompare.replay.attention as ra

    monkeypatch.setattr(ra, "MAX_SCORES", 16)            # one head: 4 x 4 scores
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(10, 2)) for _ in range(3))
    target = attend(q, k, v, 2, 1.0, 0.0, 0)
    cfg = {"num_attention_heads": 1, "hidden_size": 2, "head_dim": 2}
    rec = fit(Problem(q, k, v, target, 2, "float64"), cfg, 0, 1e-12, with_theta=False)[0]
    assert rec["tokens"] == {"queries": 4, "keys": 4}
    assert rec["reproduces_reference"] is False and rec["fitted"]["value"] == 1.0


def test_with_another_rope_scaling_the_dumped_cos_sin_are_used(tmp_path):
    """A config whose rope_scaling is not the default: its frequencies are not rebuilt, so the
    composite applies transformers' dumped cos/sin tables (and fits no theta); they are the tables
    the dump was computed with, so the replay still equals o_proj's input."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_type": "linear", "factor": 2.0}
    (model / "config.json").write_text(json.dumps(cfg))
    proc = run_pair(COMPARE, CORPUS / "llama_tp1_tensor_clean", tmp_path / "out", "--model", str(model))
    assert proc.returncode == 0, proc.stderr
    train = _attention(tmp_path / "out", "train")
    assert {r["key"] for r in train} == {SCALE}
    assert all(r["rope"] == "dumped cos/sin" and r["residual_at_reference"] < 1e-6 for r in train)
