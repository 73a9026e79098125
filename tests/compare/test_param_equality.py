"""Parameter equality (compare/params.py): Max and Min of a parameter are exact, so a stale bf16
weight whose Max moved by one bf16 step is a parameter difference, not a match."""
import json
import shutil
from pathlib import Path

from dumpcompare.compare import params as P
from dumpcompare.compare.stats import Stats
from rootcause.cli import main as rootcause_main

REAL = Path(__file__).resolve().parents[1] / "data" / "msprobe" / "llama_L0_statistics" / "step0" / "proc0"
DOWN = "Module.model.layers.0.mlp.down_proj.Linear.forward.0"


def _bf16(x):
    return P._round_to(x, "bfloat16")


def _write(root, edit):
    root.mkdir(parents=True)
    doc = json.loads((REAL / "dump.json").read_text())
    edit(doc["data"][DOWN]["parameters"]["weight"])
    (root / "dump.json").write_text(json.dumps(doc))
    return root


def test_rounding_to_bf16_is_round_to_nearest_even():
    assert _bf16(1.0) == 1.0 and _bf16(1.0 + 2 ** -9) == 1.0 and _bf16(1.0 + 3 * 2 ** -9) == 1.0 + 2 ** -7
    assert _bf16(-3.0e-3) == -0.0030059814453125       # the nearest bf16 value


def test_one_bf16_step_in_max_proves_different_weights(tmp_path):
    def as_bf16(w, step=0):
        w["dtype"] = "torch.bfloat16"
        w["Max"] = _bf16(w["Max"]) * (1 + step * 2 ** -7)
        w["Min"] = _bf16(w["Min"])
    train = _write(tmp_path / "train", as_bf16)
    rollout = _write(tmp_path / "rollout", lambda w: as_bf16(w, 1))
    out = tmp_path / "out"
    assert rootcause_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out), "--quiet"]) == 0
    res = next(r for r in json.loads((out / "output_3_value_compare.json").read_text())["results"]
               if r["point"] == "L0.down.weight")
    assert res["status"] == "mismatch" and res["error"] < res["tolerance"]     # below the statistics tolerance
    assert res["param_equality"]["equal"] is False and res["param_equality"]["exact"]
    rc = json.loads((out / "output_5_root_cause_report.json").read_text())["root_causes"][0]
    assert (rc["category"], rc["train_module"]) == ("parameter_or_checkpoint_issue", "model.layers.0.mlp.down_proj")


def test_fp32_master_against_bf16_copy_compares_after_rounding():
    t = Stats(0.055044025182724, -0.06771055608987808, 5e-4, 0.4558, 512, "float32")
    same = Stats(_bf16(t.max), _bf16(t.min), 5e-4, 0.4558, 512, "bfloat16")
    assert P.by_statistics(t, same, "float32", "bfloat16", True)["equal"] is True
    moved = Stats(_bf16(t.max) * (1 + 2 ** -7), _bf16(t.min), 5e-4, 0.4558, 512, "bfloat16")
    eq = P.by_statistics(t, moved, "float32", "bfloat16", True)
    assert (eq["equal"], eq["exact"]) == (False, True)


def test_equal_statistics_are_not_called_exact():
    s = Stats(0.5, -0.5, 0.0, 3.0, 16, "bfloat16")
    eq = P.by_statistics(s, s, "bfloat16", "bfloat16", True)
    assert (eq["equal"], eq["exact"]) == (True, False) and "md5" in eq["detail"]


def test_md5_digests_decide_when_present():
    from dumpcompare.records import Leaf
    a, b = Leaf("parameters.weight", "torch.bfloat16", (4,), checksum="aa"), Leaf("parameters.weight", "torch.bfloat16", (4,), checksum="ab")
    assert P.by_checksum([a], [a])["equal"] is True and P.by_checksum([a], [b])["equal"] is False
    assert P.by_checksum([a, a], [b]) is None
