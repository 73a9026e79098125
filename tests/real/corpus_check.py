"""Shared by the real-corpus tests: run the root-cause command as a user runs it (no step or rank
flag) and list where its report disagrees with a case.json's ``expected``."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "real"
SCRIPT = REPO / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
CLEAN_VERDICTS = ("no_credible_divergence", "precision_only")
REPORT = "output_5_root_cause_report.json"


def case_doc(name):
    """The case.json of corpus case ``name``."""
    return json.loads((CORPUS / name / "case.json").read_text(encoding="utf-8"))


def run_pair(train, rollout, out, *extra):
    """Run the root-cause command on one train/rollout pair of folders into ``out`` (``extra``
    options appended): (exit code, stderr, output_5 document or None)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train", str(train), "--rollout", str(rollout),
                           "--out-dir", str(out), "--quiet", *map(str, extra)], capture_output=True, text=True,
                          timeout=300)
    report = Path(out) / REPORT
    doc = json.loads(report.read_text(encoding="utf-8")) if proc.returncode == 0 and report.exists() else None
    return proc.returncode, proc.stderr.strip(), doc


def run_default_command(names, root, workers=4):
    """name -> (exit code, stderr, output_5 document or None), each case run into ``root/<name>``
    (a few at a time: each is a short subprocess)."""
    def run(name):
        return name, run_pair(CORPUS / name / "train", CORPUS / name / "rollout", Path(root) / name)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(run, names))


def _names(value):
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _top(doc):
    rc = (doc.get("root_causes") or [None])[0]
    return "none" if rc is None else f"{rc['category']} at {rc.get('rollout_module') or rc.get('train_module')}"


def default_expected(case):
    """What the default command (no --model) must answer on ``case``: its ``expected``, or
    ``expected_without_model`` where the fault shows only against the checkpoint's forward."""
    return case.get("expected_without_model") or case["expected"]


def _inconclusive(expected, doc):
    """An expected ``inconclusive``: never an all-clear, and the first divergence carried in
    (``status``) from no earlier than the fault (strictly after ``after_layer``)."""
    if doc["verdict"] != "inconclusive":
        return [f"verdict {doc['verdict']} (top: {_top(doc)})"]
    want, first = expected["first_divergence"], doc.get("first_divergence") or {}
    wrong = [f"first divergence status {first.get('status')}"] if first.get("status") != want["status"] else []
    if first.get("layer") is None or first["layer"] <= want["after_layer"]:
        wrong.append(f"first divergence layer {first.get('layer')}")
    return wrong


def disagreements(expected, code, stderr, doc):
    """What the report says that the case does not expect (empty when it agrees).  An expected
    side of None (the dumps cannot show it) is not checked."""
    if doc is None:
        return [f"exit {code}: {stderr.splitlines()[-1] if stderr else 'no report'}"]
    if expected["verdict"] == "clean":
        return [] if doc["verdict"] in CLEAN_VERDICTS else [
            f"verdict {doc['verdict']} (top: {_top(doc)})"]
    if expected["verdict"] == "inconclusive":
        return _inconclusive(expected, doc)
    if doc["verdict"] != "root_cause_found" or not doc["root_causes"]:
        return [f"verdict {doc['verdict']}"]
    rc = doc["root_causes"][0]
    wrong = []
    if rc["category"] != expected["category"]:
        wrong.append(f"category {rc['category']}")
    if expected["side"] is not None and rc.get("side") != expected["side"]:
        wrong.append(f"side {rc.get('side')}")
    for key in ("train", "rollout"):
        if _names(rc.get(f"{key}_module")) != expected[f"{key}_modules"]:
            wrong.append(f"{key} module {rc.get(f'{key}_module')}")
    if rc.get("layer") != expected["layer"]:
        wrong.append(f"layer {rc.get('layer')}")
    return wrong
