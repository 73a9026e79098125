"""Each side's parameters against the checkpoint the real corpus was built from (--model).

The corpus (tests/data/real, tools/make_real_dumps.py) holds real msprobe dumps of transformers
train sides and vLLM-structured rollouts, saved with the tiny checkpoints they loaded. Every
stale or wrongly sharded weight must be charged to the side that holds it, by md5, tensor or
statistics, and every other parameter must match on both sides.
"""
from __future__ import annotations

import json
import shutil

import pytest

from refcheck.realcases import COMPARE, CORPUS, ROOTCAUSE, case, references, report, run

# case -> (point of the faulty parameter, how it is known)
PARAMETER_FAULTS = {
    "llama_tp1_fp32_stale_rollout": ("L1.down.weight", "statistics"),
    "llama_tp1_fp32_stale_train": ("L0.o.weight", "statistics"),
    "llama_fsdp2_fp32_stale_train": ("L0.o.weight", "statistics"),
    "llama_tp1_bf16_stale_rollout": ("L1.down.weight", "statistics"),
    "llama_tp1_md5_stale_rollout": ("L1.down.weight", "md5"),
    "llama_tp1_tensor_stale_rollout": ("L1.down.weight", "tensor"),
    "llama_tp2_fp32_wrong_shard": ("L1.gate.weight+L1.up.weight", "statistics"),
    "llama_tp2_tensor_wrong_shard": ("L1.gate.weight+L1.up.weight", "tensor"),
    "phi3_tp2_fp32_stale_qkv": ("L1.q.weight+L1.k.weight+L1.v.weight", "statistics"),
    "qwen3_tp1_fp32_stale_k_norm": ("L1.k_norm.weight", "statistics"),
    "gemma2_tp1_fp32_stale_pre_ff_norm": ("L0.pre_ff_norm.weight",
                                          "statistics"),
    # stacked experts: transformers 5.x gate_up_proj against the checkpoint's per-expert tensors.
    # (qwen3_moe_tp2_fp32_stale_experts, a stale rollout w2_weight, left this table when the corpus
    # followed vLLM 0.32: the MoERunner's expert weights are in no dump entry, so nothing can show it.)
    "qwen3_moe_tensor_stale_expert_train": ("L0.experts.gate_up.weight", "tensor"),
}
# Points whose faulty parameter only the faulty side dumps.
UNPAIRED = {"L0.experts.gate_up.weight"}
# What the pipeline says instead (strict; the lead removes a line when a fix lands).
KNOWN_WRONG: dict[str, str] = {}


def _params(names):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[n])) if n in KNOWN_WRONG else n
            for n in names]


@pytest.mark.parametrize("name", _params(sorted(PARAMETER_FAULTS)))
def test_the_faulty_side_and_only_it_differs_from_the_checkpoint(name, tmp_path):
    point, how = PARAMETER_FAULTS[name]
    bad = case(name)["fault"]["side"]
    good = "train" if bad == "rollout" else "rollout"
    proc = run(COMPARE, name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    refs = references(tmp_path)
    assert refs[point][bad]["matches_reference"] is False
    assert refs[point][bad]["how"] == how and refs[point][bad]["exact"] is True
    if point in UNPAIRED:
        # vLLM 0.32's MoERunner holds no expert weight in any dump entry: only the train side's stacked
        # experts are there to judge, and they are (reference.<side>.unpaired_parameters).
        assert good not in refs[point] and refs[point][bad]["layout"] == "stacked per expert"
        assert len(refs[point][bad]["checkpoint_tensors"]) == 8    # 4 experts x (gate, up)
    else:
        assert refs[point][good]["matches_reference"] is True
    if case(name)["fault"]["rank"] is not None and how == "tensor":
        # tensor files say which rank's shard is wrong
        assert refs[point][bad]["detail"].endswith(f"only in the shard of rank(s) {case(name)['fault']['rank']}")
    others = {(p, s): r[s]["matches_reference"] for p, r in refs.items() if p != point for s in r}
    # every other parameter matches on both sides (the bias of a biased fused qkv included)
    assert others and set(others.values()) == {True}, {k: v for k, v in others.items() if v is not True}


def test_bf16_sides_are_checked_after_rounding_the_checkpoint(tmp_path):
    """The checkpoint is fp32, the sides bf16: only rounding the reference makes the clean weights equal."""
    proc = run(COMPARE, "llama_tp1_bf16_clean", tmp_path)
    assert proc.returncode == 0, proc.stderr
    refs = references(tmp_path)
    assert len(refs) >= 10
    assert {r[s]["matches_reference"] for r in refs.values() for s in r} == {True}


def test_md5_checks_the_padded_vocabulary_exactly(tmp_path):
    """vLLM pads the embedding to a multiple of 64 with zero rows: its CRC-32 is reproduced exactly."""
    run(COMPARE, "llama_tp1_md5_clean", tmp_path)
    emb = references(tmp_path)["M.embed.weight"]["rollout"]
    assert emb["matches_reference"] is True and emb["how"] == "md5" and "padded" in emb["layout"]


def test_replicated_kv_heads_under_tp2_are_found_in_the_merged_shards(tmp_path):
    """One KV head over 2 ranks: each rank holds it whole, so the merged qkv has 128 rows for 96."""
    run(COMPARE, "llama_tp2_tensor_clean", tmp_path)
    qkv = references(tmp_path)["L0.q.weight+L0.k.weight+L0.v.weight"]["rollout"]
    assert qkv["matches_reference"] is True and qkv["how"] == "tensor"
    assert qkv["layout"] == "per-rank concatenation of 2 shards"


def test_a_permuted_fused_weight_is_charged_to_its_side(tmp_path):
    """The real tensor dump with the rollout's gate_up rows swapped ([up; gate]): its statistics are
    unchanged, the trainer's parts match the checkpoint, the rollout's fused weight does not."""
    from dumpcompare import tensorio
    from synth import ptfile
    name = "llama_tp1_tensor_clean"
    work = tmp_path / name
    shutil.copytree(CORPUS / name, work)
    (data,) = (work / "rollout").glob("step0/*/dump_tensor_data")
    pt = data / "Module.model.layers.0.mlp.gate_up_proj.MergedColumnParallelLinear.forward.0.parameters.weight.pt"
    w = tensorio.load_tensor(pt)
    half = w.shape[0] // 2
    ptfile.save_pt(pt, w[list(range(half, 2 * half)) + list(range(half))])
    import subprocess
    import sys
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOTCAUSE), "--train", str(work / "train"), "--rollout",
                           str(work / "rollout"), "--out-dir", str(out), "--quiet", "--model",
                           str(CORPUS / "_models" / "llama")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ref = references(out)["L0.gate.weight+L0.up.weight"]
    assert ref["train"]["matches_reference"] is True
    assert ref["rollout"]["matches_reference"] is False and "another order" in ref["rollout"]["detail"]
    rc = report(out)["root_causes"][0]
    assert rc["category"] == "parameter_or_checkpoint_issue" and rc["side"] == "rollout"
    assert "model.layers.0.mlp.gate_proj.weight" in rc["next_checks"][0]["check"]


@pytest.mark.parametrize("name", ["llama_tp1_fp32_stale_rollout", "llama_tp1_fp32_stale_train",
                                  "llama_tp1_md5_stale_rollout"])
def test_root_cause_names_the_side_with_its_evidence(name, tmp_path):
    proc = run(ROOTCAUSE, name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = report(tmp_path)
    rc = doc["root_causes"][0]
    bad = case(name)["fault"]["side"]
    assert rc["category"] == "parameter_or_checkpoint_issue" and rc["side"] == bad
    ev = [e for e in rc["side_evidence"] if e["kind"] == "reference_parameters"]
    assert ev and ev[0][bad]["matches_reference"] is False
    target = case(name)["fault"]["target"]
    assert rc["next_checks"][0]["check"].startswith(f"Reload {target}.weight on the {bad} side")
    assert doc["reference"]["train"]["files"] == ["model.safetensors"]
    assert doc["reference"][bad]["taken_as"] == "initial"


def test_without_model_nothing_changes(tmp_path):
    """No --model: no reference anywhere, and the side stays what the dumps alone say."""
    name = "llama_tp1_fp32_stale_rollout"
    proc = run(ROOTCAUSE, name, tmp_path, model=False)
    assert proc.returncode == 0, proc.stderr
    doc = report(tmp_path)
    assert doc["reference"] is None
    rc = doc["root_causes"][0]
    assert rc["side"] == "undetermined" and "side_evidence" not in rc
    assert json.loads((tmp_path / "output_3_value_compare.json").read_text())["reference"] is None


@pytest.mark.parametrize("name, key, wrong, right", [
    ("llama_tp1_fp32_norm_eps", "rms_norm_eps", 1e-2, 1e-6),
    ("llama_tp1_fp32_act_swap", "hidden_act", "gelu_pytorch_tanh", "silu"),
])
def test_a_resolved_config_that_differs_from_the_checkpoint_names_the_side(name, key, wrong, right, tmp_path):
    """--rollout-config is the config the rollout engine really resolved (the fault of these cases);
    a governing key that differs from the checkpoint's config names that side and the key to fix
    (the dumps alone say undetermined)."""
    side = case(name)["fault"]["side"]
    cfg = json.loads((CORPUS / "_models" / "llama" / "config.json").read_text())
    cfg[key] = wrong
    (tmp_path / "resolved.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    proc = run(ROOTCAUSE, name, out, f"--{side}-config", str(tmp_path / "resolved.json"))
    assert proc.returncode == 0, proc.stderr
    rc = report(out)["root_causes"][0]
    assert rc["category"] == "in_module_impl_difference"
    assert rc["side"] == side and key in rc["config_keys"]
    ev = [e for e in rc["side_evidence"] if e["kind"] == "config_value"]
    assert ev == [{"kind": "config_value", "key": key, "train": wrong if side == "train" else right,
                   "rollout": wrong if side == "rollout" else right, "checkpoint": right,
                   "differs_from_checkpoint": side}]
    assert rc["next_checks"][0]["check"] == f"Set {key} to {right!r} on the {side} side (it resolved {wrong!r})."


def test_each_side_can_name_its_own_checkpoint(tmp_path):
    """--train-model / --rollout-model: each side is checked against the folder it loaded."""
    name = "llama_tp1_fp32_stale_rollout"
    own = tmp_path / "rollout_model"
    shutil.copytree(CORPUS / "_models" / "llama", own)
    out = tmp_path / "out"
    proc = run(COMPARE, name, out, "--train-model", str(CORPUS / "_models" / "llama"), "--rollout-model", str(own),
               model=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "output_3_value_compare.json").read_text())
    assert doc["reference"]["rollout"]["folder"] == str(own)
    assert doc["reference"]["train"]["folder"] == str(CORPUS / "_models" / "llama")
    assert references(out)["L1.down.weight"]["rollout"]["matches_reference"] is False


def test_a_side_config_without_a_model_is_a_usage_error(tmp_path):
    proc = run(COMPARE, "llama_tp1_fp32_clean", tmp_path / "out", "--rollout-config",
               str(CORPUS / "_models" / "llama" / "config.json"), model=False)
    assert proc.returncode == 2 and "--rollout-config needs --model" in proc.stderr
