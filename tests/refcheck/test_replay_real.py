"""Replaying standard modules from each side's own tensors, on real tensor-mode msprobe dumps.

The dumped outputs were computed by torch (transformers modules on the train side, the
vLLM-structured torch modules on the rollout side), so a replay that reproduces them to a few
float32 roundings equals torch's output. tests/data/replay (tools/make_replay_cases.py) holds real
dumps with an eps or activation fault on one side; the corpus's checkpoint is their reference.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dumpcompare.replay.kernels import activation, norm, rope, softcap
from refcheck.realcases import COMPARE, CORPUS, ROOTCAUSE, report, run

REPLAY = Path(__file__).resolve().parents[1] / "data" / "replay"
MODEL = CORPUS / "_models" / "llama"


def _replays(out):
    return json.loads((out / "output_3_value_compare.json").read_text())["replays"]


def _run(script, folder, out, *extra):
    import subprocess
    import sys
    return subprocess.run([sys.executable, str(script), "--train", str(folder / "train"), "--rollout",
                           str(folder / "rollout"), "--out-dir", str(out), "--quiet", *extra],
                          capture_output=True, text=True, timeout=300)


def test_every_standard_module_replays_to_torchs_output(tmp_path):
    """Clean real tensor dump: each norm, activation, linear and embedding on both sides is reproduced
    by the checkpoint config's math within 1e-6 (fp32), and a wrong value is far off."""
    proc = run(COMPARE, "llama_tp1_tensor_clean", tmp_path)
    assert proc.returncode == 0, proc.stderr
    reps = _replays(tmp_path)
    ops = {(r["side"], r["op"]) for r in reps}
    assert ops == {(s, o) for s in ("train", "rollout") for o in ("norm", "act", "linear", "embed", "attention")} | {
        ("rollout", "head"), ("rollout", "rope")}      # transformers applies RoPE and the head's cap inline
    for r in reps:
        assert r["reproduces_reference"] is True and r["residual_at_reference"] < 1e-6, r
    vllm_norm = next(r for r in reps if r["side"] == "rollout" and r["module"] == "model.layers.1.input_layernorm")
    assert vllm_norm["class"] == "RMSNorm"          # fused add + norm: input + residual normalised
    act = next(r for r in reps if r["side"] == "rollout" and r["op"] == "act")
    assert act["gated"] is True and act["reproducing_values"] == ["silu"]
    # vLLM's logits processor, with the checkpoint's lm_head: no softcapping in Llama, and a cap of 30
    # would be far off
    head = next(r for r in reps if r["op"] == "head")
    assert head["reference_value"] == 0.0 and head["reproducing_values"] == [0.0]
    # vLLM's rotary_emb module: theta 1e4 from the config, and no other candidate theta fits
    rot = next(r for r in reps if r["op"] == "rope")
    assert rot["reference_value"] == 10000.0 and rot["reproducing_values"] == [10000.0]


def test_eps_values_fp32_cannot_tell_apart_are_said_to_be_indistinguishable(tmp_path):
    run(COMPARE, "llama_tp1_tensor_clean", tmp_path)
    final = next(r for r in _replays(tmp_path) if r["side"] == "train" and r["module"] == "model.norm")
    assert 1e-6 in final["reproducing_values"] and 1e-5 not in final["reproducing_values"]
    assert 1e-8 in final["reproducing_values"] and "cannot be told apart" in final["indistinguishable"]


@pytest.mark.parametrize("case, key, wrong, right", [
    ("llama_tensor_norm_eps_rollout", "rms_norm_eps", 1e-2, 1e-6),
    ("llama_tensor_norm_eps_train", "rms_norm_eps", 1e-2, 1e-6),
    ("llama_tensor_act_swap_rollout", "hidden_act", "gelu_tanh", "silu"),
    ("llama_tensor_act_swap_train", "hidden_act", "gelu_tanh", "silu"),
])
def test_the_replay_names_the_side_the_key_and_the_value_it_used(case, key, wrong, right, tmp_path):
    folder = REPLAY / case
    fault = json.loads((folder / "case.json").read_text())["fault"]
    proc = _run(ROOTCAUSE, folder, tmp_path, "--model", str(MODEL))
    assert proc.returncode == 0, proc.stderr
    rc = report(tmp_path)["root_causes"][0]
    assert rc["category"] == "in_module_impl_difference" and rc["train_module"] == fault["target"]
    assert rc["side"] == fault["side"] and key in rc["config_keys"]
    ev = [e for e in rc["side_evidence"] if e["kind"] == "replay"]
    bad = next(e for e in ev if e["side"] == fault["side"])
    good = next(e for e in ev if e["side"] != fault["side"])
    assert bad["reproduces_reference"] is False and bad["fitted"]["value"] == wrong
    assert bad["fitted"]["residual"] < 1e-6 < 1e-2 < bad["residual_at_reference"]
    assert good["reproduces_reference"] is True and good["fitted"]["value"] == right
    assert rc["next_checks"][0]["check"].startswith(f"Set {key} to {right!r} on the {fault['side']} side")


def test_without_model_the_replay_reports_what_the_sides_disagree_on(tmp_path):
    proc = _run(ROOTCAUSE, REPLAY / "llama_tensor_norm_eps_train", tmp_path)
    assert proc.returncode == 0, proc.stderr
    rc = report(tmp_path)["root_causes"][0]
    assert rc["side"] == "undetermined" and rc["config_keys"] == ["rms_norm_eps"]
    assert "rms_norm_eps: train behaves as 0.01, rollout as 1e-06" in rc["next_checks"][0]["check"]


def test_norm_and_activation_formulas():
    """The formulas themselves, on numbers worked by hand."""
    x = np.array([[3.0, 4.0]])
    rms = np.sqrt(12.5 + 0.5)
    assert np.allclose(norm("rms", x, np.array([1.0, 2.0]), None, 0.5), [[3 / rms, 8 / rms]])
    assert np.allclose(norm("gemma_rms", x, np.array([0.0, 1.0]), None, 0.5), [[3 / rms, 8 / rms]])
    assert np.allclose(norm("layer", x, np.ones(2), np.array([1.0, 1.0]), 0.0), [[0.0, 2.0]])
    assert activation("silu", np.array([0.0]))[0] == 0.0
    assert np.isclose(activation("gelu", np.array([1.0]))[0], 0.8413447460685429)
    assert np.isclose(activation("gelu_tanh", np.array([1.0]))[0], 0.8411919906082768)
    assert np.allclose(softcap(np.array([0.0, 30.0]), 30.0), [0.0, 30.0 * np.tanh(1.0)])
    # one head of 4 (rotary over the first 2 features): position 1, theta 1 -> a rotation by 1 radian
    x = np.array([[1.0, 0.0, 5.0, 6.0]])
    c, s_ = np.cos(1.0), np.sin(1.0)
    assert np.allclose(rope(x, np.array([1]), 4, 2, 1.0), [[c, s_, 5.0, 6.0]])
    y = np.array([[1.0, 0.0, 0.0, 1.0]])        # interleaved pairs (0, 1), (2, 3), all rotary
    assert np.allclose(rope(y, np.array([1]), 4, 4, 1.0, interleaved=True), [[c, s_, -s_, c]])

    assert np.array_equal(softcap(np.array([100.0]), 0.0), [100.0])
