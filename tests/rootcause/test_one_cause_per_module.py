"""One root cause per module, category and side: a module whose calls are entries of their own in
the dumps (calls that do not fold) is a pair per call, and a fault in it is found at each call."""
import json
import subprocess
import sys
from pathlib import Path

from rootcause import triage

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"


def test_a_stale_weight_in_calls_that_do_not_fold_is_one_root_cause(tmp_path):
    """tools/manydump.py: 3 calls of a 4-layer model whose shapes alternate (no call folds), the
    rollout's layer 2 gate weight changed: one root cause at that module, found at all 3 calls."""
    sys.path.insert(0, str(ROOT / "tools"))
    import manydump
    pair = manydump.write_pair(tmp_path / "pair", calls=3, layers=4, faults=["corrupt:rollout:gate:2"])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", pair["train"], "--rollout", pair["rollout"],
                           "--out-dir", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "output_5_root_cause_report.json").read_text())
    assert doc["schema_version"] == "3.3"
    assert doc["verdict"] == "root_cause_found"
    assert len(doc["root_causes"]) == 1, [(c["evidence"]["pair"], c["category"]) for c in doc["root_causes"]]
    rc = doc["root_causes"][0]
    assert rc["category"] == "parameter_or_checkpoint_issue" and rc["layer"] == 2
    assert rc["train_module"] == ["model.layers.2.mlp.gate_proj", "model.layers.2.mlp.up_proj"]
    assert rc["rollout_module"] == "model.layers.2.mlp.gate_up_proj"
    doc4 = json.loads((out / "output_4_module_analysis.json").read_text())
    same = [m["pid"] for m in doc4["modules"] if m["train_modules"] == rc["train_module"]]
    assert len(same) == 3 and rc["evidence"]["pair"] == same[0]
    assert rc["evidence"]["other_calls"] == {"pairs": same[1:], "pairs_of_these_modules": 3}
    assert "found at 3 of the 3 calls of these modules" in proc.stdout
    assert "more root-cause candidate" not in proc.stdout


def _finding(pid, category="parameter_or_checkpoint_issue", side="undetermined", confidence=0.9):
    return ({"category": category, "side": side, "confidence": confidence, "confidence_notes": [],
             "train_module": "model.layers.1.mlp.down_proj", "rollout_module": "model.layers.1.mlp.down_proj",
             "evidence": {"pair": pid}}, {"pid": pid})


class _Ev:
    modules = [{"pid": p, "train_modules": ["model.layers.1.mlp.down_proj"],
                "rollout_modules": ["model.layers.1.mlp.down_proj"]} for p in ("P1", "P2", "P3")]


def test_the_most_confident_call_is_kept_and_other_statements_stay_apart():
    weak, strong = _finding("P1", confidence=0.6), _finding("P2", confidence=0.9)
    other_side = _finding("P3", side="rollout")
    other_category = _finding("P3", category="in_module_impl_difference")
    kept = triage._one_per_module(_Ev(), [weak, strong, other_side, other_category])
    assert [(f["evidence"]["pair"], f["side"], f["category"]) for f, _ in kept] == [
        ("P2", "undetermined", "parameter_or_checkpoint_issue"), ("P3", "rollout", "parameter_or_checkpoint_issue"),
        ("P3", "undetermined", "in_module_impl_difference")]
    assert kept[0][0]["evidence"]["other_calls"] == {"pairs": ["P1"], "pairs_of_these_modules": 3}
    assert "found the same at 1 other call(s)" in kept[0][0]["confidence_notes"][0]
    # A finding alone at its module is left as it was.
    assert kept[1][0]["evidence"]["other_calls"] is None and kept[1][0]["confidence_notes"] == []
