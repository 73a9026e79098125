"""Shared by the real-vLLM corpus test and tools/score_real_vllm.py: the ways a user runs the
root-cause command on a case of tests/data/real_vllm/, and what the report says against the case's
``expected``.

Variants (every one passes ``--model``, the committed checkpoint both sides started from):
    ids_list     ``--token-ids`` as a JSON list (prompt + response)
    tokens_file  ``--token-ids tokens.json`` (``{"prompt_ids", "response_ids"}``, as dump_vllm.py writes it)
    no_ids       no ``--token-ids`` (tensor mode only: the ids are in the embedding's input)
"""
from __future__ import annotations

import json
from pathlib import Path

from real.corpus_check import disagreements, run_pair

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "real_vllm"
KNOWN_WRONG = Path(__file__).resolve().parent / "known_wrong.json"
FAST_VARIANT = "ids_list"


def case_names():
    """Every generated case (a folder holding case.json)."""
    return sorted(p.parent.name for p in CORPUS.glob("*/case.json"))


def case_doc(name):
    return json.loads((CORPUS / name / "case.json").read_text(encoding="utf-8"))


def variants(name):
    """The variant names that apply to case ``name``."""
    out = ["ids_list", "tokens_file"]
    return out + ["no_ids"] if case_doc(name)["mode"] == "tensor" else out


def _options(name, variant):
    doc = case_doc(name)
    case = CORPUS / name
    opts = ["--model", REPO / "tests" / "data" / "real_vllm" / "_models" / doc["family"]]
    if variant == "ids_list":
        tokens = json.loads((case / "tokens.json").read_text(encoding="utf-8"))
        opts += ["--token-ids", json.dumps(tokens["prompt_ids"] + tokens["response_ids"])]
    elif variant == "tokens_file":
        opts += ["--token-ids", case / "tokens.json"]
    return opts


def got(doc):
    """(verdict, category, rollout module, side) of a report, for printing."""
    if doc is None:
        return {"verdict": "error"}
    rc = (doc.get("root_causes") or [None])[0] or {}
    return {"verdict": doc.get("verdict"), "category": rc.get("category"),
            "module": rc.get("rollout_module") or rc.get("train_module"), "side": rc.get("side"),
            "from_call": (rc.get("evidence") or {}).get("first_call")}


def _call_disagreement(expected, doc):
    """A finding that names the forward call it starts from must name the injected one."""
    rc = ((doc or {}).get("root_causes") or [None])[0] or {}
    ev = rc.get("evidence") or {}
    if expected.get("from_call") is None or "first_call" not in ev or ev["first_call"] == expected["from_call"]:
        return []
    return [f"from call {ev['first_call']}"]


def judge(name, variant, out):
    """Run one variant into ``out``: (list of disagreements with ``expected``, what the report said)."""
    code, stderr, doc = run_pair(CORPUS / name / "train", CORPUS / name / "rollout", out, *_options(name, variant))
    expected = case_doc(name)["expected"]
    wrong = disagreements(expected, code, stderr, doc)
    wrong += _call_disagreement(expected, doc) if not wrong else []
    return wrong, (
        got(doc) if doc is not None else {"verdict": f"exit {code}", "error": stderr.splitlines()[-1:]})


def known_wrong():
    """``"case/variant"`` -> the wrong answer seen when it was listed."""
    if not KNOWN_WRONG.exists():
        return {}
    return json.loads(KNOWN_WRONG.read_text(encoding="utf-8"))
