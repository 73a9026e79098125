"""The real msprobe acceptance pairs with known answers (tests/data/msprobe, or the shared copies)."""
import pytest


def test_llama_statistics_perturbed_down_proj(msprobe_samples, analyze_pair):
    """llama_L0_statistics vs the same run with noise in layer 1 down_proj.weight."""
    res = analyze_pair(msprobe_samples / "llama_L0_statistics", msprobe_samples / "llama_L0_statistics_perturbed")
    doc = res.doc
    assert doc["verdict"] == "root_cause_found"
    rc = doc["root_causes"][0]
    assert (rc["category"], rc["train_module"], rc["rollout_module"], rc["layer"]) == (
        "parameter_or_checkpoint_issue", "model.layers.1.mlp.down_proj", "model.layers.1.mlp.down_proj", 1)
    assert rc["side"] == "undetermined" and rc["side_reason"]
    assert any("down_proj.weight" in p or p.endswith("down.weight") for p in rc["evidence"]["differing_parameters"])
    assert doc["mode"] == "statistics"
    assert doc["comparability"]["comparable"] is True
    assert "model.layers.1.mlp.down_proj" in res.stdout


def test_consistent_check_rollout_bug_gate_up(msprobe_samples, analyze_pair):
    """FSDP-named HF train vs vLLM rollout whose layer-1 gate_up_proj.weight has half its rows x1.5."""
    base = msprobe_samples / "consistent_check_fsdp_vs_vllm_synthetic"
    doc = analyze_pair(base / "train", base / "rollout_bug").doc
    assert doc["verdict"] == "root_cause_found"
    rc = doc["root_causes"][0]
    assert rc["category"] == "parameter_or_checkpoint_issue"
    assert rc["train_module"] == ["model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"]
    assert rc["rollout_module"] == "model.layers.1.mlp.gate_up_proj"
    assert rc["layer"] == 1
    # wrappers (_fsdp_wrapped_module.) are stripped from every name in the report
    names = [str(f.get(k)) for f in doc["root_causes"] + doc["other_candidates"]
             + [s for k, v in doc["suppressed"].items() if k != "counts" for s in v]
             for k in ("train_module", "rollout_module")]
    assert not [n for n in names if "_fsdp_wrapped_module" in n or n.startswith("Module.")]


def test_consistent_check_synced_rollout_is_clean(msprobe_samples, analyze_pair):
    base = msprobe_samples / "consistent_check_fsdp_vs_vllm_synthetic"
    doc = analyze_pair(base / "train", base / "rollout").doc
    assert doc["verdict"] == "no_credible_divergence"
    assert doc["root_causes"] == []
    assert doc["suppressed"]["structural_clean"]
