"""A --model that is not the checkpoint of these dumps (issue 26): the compare step judges the fit
(output_4 ``reference_fit``, dumpcompare/reffit.py) and the root-cause skill names no side from a
checkpoint that matches neither side, saying so first (console, output_5 notes, report.html).

Wrong checkpoints: another family and size of names (``_models/qwen2``: attention biases the llama
dumps lack, other values), another family (``_models/qwen3``) and the same config with other weights
(a copy of ``_models/llama`` with every tensor perturbed, written here with numpy: a checkpoint
saved at another step). The right checkpoint keeps its answers: the rollout's linear weights are
empty prepacked tensors (vLLM CPU), judged by the visible rows only, and a train-side fault still
names the train side. (``_models/mistral`` holds the very bytes of ``_models/llama`` and the same
math, so it is the right checkpoint for the llama cases and is accepted.)
"""
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dumpcompare import reffit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
CORPUS = REPO / "tests" / "data" / "real_vllm"
MODELS = CORPUS / "_models"
REAL = REPO / "tests" / "data" / "real"
O_PROJ = "llama_stale_o_proj_stats_onestep"
SIDES = ("train", "rollout")


def perturbed_copy(src: Path, dst: Path, seed: int = 0) -> Path:
    """``src`` copied to ``dst`` with every floating tensor moved by noise: same config, names and
    shapes, other weights. safetensors: 8-byte header length, JSON header, raw little-endian data."""
    shutil.copytree(src, dst)
    rng = np.random.default_rng(seed)
    for f in dst.glob("*.safetensors"):
        raw = bytearray(f.read_bytes())
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = (base + o for o in info["data_offsets"])
            if info["dtype"] in ("F32", "F16", "F64"):
                dt = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}[info["dtype"]]
                x = np.frombuffer(bytes(raw[a:b]), dtype=dt).astype(np.float64)
                x = x + rng.normal(0.0, 0.05 * (x.std() or 1.0), x.shape)
                raw[a:b] = x.astype(dt).tobytes()
            elif info["dtype"] == "BF16":
                x = np.frombuffer(bytes(raw[a:b]), dtype="<u2")
                raw[a:b] = (x ^ rng.integers(1, 64, x.shape, dtype=np.uint16)).astype("<u2").tobytes()
        f.write_bytes(bytes(raw))
    return dst


def _run(case: Path, out: Path, model: Path, *extra: str):
    tokens = ["--token-ids", str(case / "tokens.json")] if (case / "tokens.json").exists() else []
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", str(case / "train"), "--rollout",
                           str(case / "rollout"), "--out-dir", str(out), "--model", str(model), *tokens, *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc4 = json.loads((out / "output_4_module_analysis.json").read_text(encoding="utf-8"))
    doc5 = json.loads((out / "output_5_root_cause_report.json").read_text(encoding="utf-8"))
    return proc, doc4, doc5


def _assert_refused(proc, doc4, doc5, out: Path) -> None:
    fit = doc4["reference_fit"]
    assert fit["fits"] is False and fit["reason"].startswith(reffit.NEITHER)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("note: " + reffit.NEITHER), proc.stdout
    assert doc5["notes"][0].startswith(reffit.NEITHER)
    assert reffit.NEITHER in (out / "report.html").read_text(encoding="utf-8")
    # Nothing drawn from the checkpoint: no side named, no reload of a tensor, no forward departure.
    assert doc4["reference_forward"]["verdict"]["side"] == "undetermined"
    for f in doc5["root_causes"] + doc5["other_candidates"]:
        # (an upstream_propagation finding is carried by both sides: a fact of the dumps, not the checkpoint's)
        assert f["category"] == "upstream_propagation" or f["side"] not in ("train", "rollout", "both"), f
        assert not any(c["check"].startswith("Reload") for c in f.get("next_checks") or []), f
        assert not any(e.get("kind") in ("reference_parameters", "reference_forward")
                       for e in f.get("side_evidence") or []), f
        assert "reference_" not in " ".join(f.get("rules_fired") or []), f
    assert doc5["answer"]["decide_side"] is None


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_another_family_matches_neither_side(tmp_path, family):
    proc, doc4, doc5 = _run(CORPUS / O_PROJ, tmp_path, MODELS / family)
    _assert_refused(proc, doc4, doc5, tmp_path)
    if family == "qwen2":       # its attention biases have no counterpart in the llama dumps
        assert any("L0.q.bias" in v["misfits"]["names"] for v in doc4["reference_fit"]["sides"].values())


def test_same_config_other_weights_matches_neither_side(tmp_path):
    model = perturbed_copy(MODELS / "llama", tmp_path / "model")
    proc, doc4, doc5 = _run(CORPUS / O_PROJ, tmp_path / "out", model)
    _assert_refused(proc, doc4, doc5, tmp_path / "out")
    rollout = doc4["reference_fit"]["sides"]["rollout"]
    assert rollout["not_visible"] > 0 and rollout["matching"] == 0


def test_other_weights_with_both_sides_visible_names_no_reload(tmp_path):
    """Weights visible on both sides (older corpus, tensor mode): every parameter differs from the
    perturbed copy on both sides, which used to read as 'both sides differ; reload'."""
    case = REAL / "llama_tp1_tensor_stale_rollout"
    model = perturbed_copy(REAL / "_models" / "llama", tmp_path / "model", seed=1)
    proc, doc4, doc5 = _run(case, tmp_path / "out", model)
    _assert_refused(proc, doc4, doc5, tmp_path / "out")


def test_right_checkpoint_with_prepacked_rollout_weights_is_accepted(tmp_path):
    proc, doc4, doc5 = _run(CORPUS / O_PROJ, tmp_path, MODELS / "llama")
    fit = doc4["reference_fit"]
    assert fit["fits"] is True
    assert fit["sides"]["rollout"]["not_visible"] > 0 and fit["sides"]["rollout"]["fits"] is True
    assert not any(n.startswith(reffit.NEITHER) for n in doc5["notes"])
    top = doc5["root_causes"][0]
    assert top["side"] == "rollout" and top["rollout_module"] == "model.layers.1.self_attn.o_proj"


def test_train_side_fault_still_names_the_train_side(tmp_path):
    proc, doc4, doc5 = _run(CORPUS / "llama_stale_train_input_norm_stats_onestep", tmp_path, MODELS / "llama")
    train = doc4["reference_fit"]["sides"]["train"]
    assert doc4["reference_fit"]["fits"] is True and train["differing"] == 1 and train["fits"] is True
    assert doc5["root_causes"][0]["side"] == "train"


def _counts(matching, differing, not_visible=0, names=()):
    return {"judged": matching + differing, "matching": matching, "differing": differing,
            "not_visible": not_visible, "unknown": 0, "misfits": {"names": list(names), "shapes": [], "layers": []}}


def test_the_rule_tolerates_a_few_stale_tensors():
    assert reffit._side_fits(_counts(19, 1)) is True           # one stale tensor
    assert reffit._side_fits(_counts(7, 1, not_visible=12)) is True   # a stale norm of a prepacked rollout
    assert reffit._side_fits(_counts(1, 0, not_visible=12)) is True   # only the embedding visible
    assert reffit._side_fits(_counts(1, 19)) is False          # another model: most differ
    assert reffit._side_fits(_counts(0, 8, not_visible=12)) is False
    assert reffit._side_fits(_counts(0, 0, not_visible=12)) is None   # nothing visible: unjudged
    assert reffit._side_fits(_counts(200, 20)) is True and reffit._side_fits(_counts(200, 30)) is False
    doc = reffit._decide({"train": {**_counts(1, 19), "fits": False}, "rollout": {**_counts(0, 0), "fits": None}})
    assert doc["fits"] is False and doc["reason"].startswith(reffit.NEITHER)
    doc = reffit._decide({"train": {**_counts(0, 0), "fits": None}})
    assert doc["fits"] == "unknown"
