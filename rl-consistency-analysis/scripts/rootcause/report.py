"""Write output_5_root_cause_report.json and print the short terminal summary.

The markdown report is the agent's job (references/report_template.md), not this script's.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from . import explain, sibling, sides, triage
from .evidence import Evidence
from .triage import Triage

SCHEMA_VERSION = "2.0"
REPORT = "output_5_root_cause_report.json"
# Written by the agent from REPORT; a new REPORT makes an existing one stale.
AGENT_REPORT = "output_5_root_cause_report.md"
HTML = "report.html"
_KEEP = ("rank", "category", "side", "side_reason", "missing_on", "op_module", "train_module", "rollout_module",
         "layer", "role", "confidence", "confidence_word", "confidence_notes", "evidence", "hypotheses",
         "next_checks", "side_evidence", "config_keys", "rules_fired")


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    return obj


def _finding(ev: Evidence, f: dict, reach: bool | None) -> dict:
    """A cause or candidate as output_5 shows it: the triage's fields plus its numbers and what
    they already refute."""
    out = {k: f[k] for k in _KEEP if k in f}
    pid = (f.get("evidence") or {}).get("suspect_pair") or {}
    pid = pid.get("pair") if isinstance(pid, dict) else None
    out["numbers"] = explain.numbers(ev, pid or f["evidence"]["pair"])
    out["refuted"] = explain.refuted(f, out["numbers"], reach)
    return out


def _suppressed(records: list[dict]) -> dict:
    """Structural pairs set aside, split by whether their values agree, with counts saying so."""
    split = {f"structural_{v}": [r for r in records if r["values"] == v]
             for v in ("clean", "different", "not_compared")}
    return {**split, "counts": {k: len(v) for k, v in split.items()}}


def build(ev: Evidence, tri: Triage, inputs: dict) -> dict:
    """The output_5 document."""
    reach = triage.reaches_output(ev)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "verdict": tri.verdict,
        "root_causes": [_finding(ev, f, reach) for f in tri.root_causes],
        "suppressed": _suppressed(tri.suppressed),
        "first_divergence": ev.analysis.get("first_divergence"),
        "other_candidates": [_finding(ev, f, reach) for f in tri.other_candidates],
        "precision": tri.precision,
        "notes": tri.notes,
        "partial": bool(ev.analysis.get("partial")),
        "comparability": ev.analysis.get("comparability"),
        "mode": ev.mode,
        "reference": sides.reference_section(ev),
        "reference_forward": sides.forward_section(ev),
        "inputs": inputs,
        "sides": explain.sides(ev),
        "logits": ev.compare.get("logprob"),
        "reaches_output": reach,
        "summary": ev.mapping.get("summary"),
    }
    doc["glossary"] = explain.glossary(doc, ev.analysis.get("rank_meanings"))
    return doc


def write(out_dir: Path, doc: dict) -> Path:
    """Write the report atomically inside ``out_dir`` and remove the agent's markdown of an older one.

    The compare step already removes both output_5 files when it rewrites output_1..4; this covers
    ``--reuse-outputs``, where it does not run.
    """
    text = json.dumps(_clean(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    path = write_text(out_dir / REPORT, text)
    stale = out_dir / AGENT_REPORT
    if stale.is_symlink() or stale.is_file():
        stale.unlink()
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically with the sibling's one writer (atomicfile.py)."""
    return sibling.load_atomicfile(sibling.SKILL_ROOT).write_text(path, text)


def _name(x) -> str:
    if x is None:
        return "-"
    return ", ".join(x) if isinstance(x, list) else str(x)


def _forward_line(rf: dict) -> str:
    if not rf.get("ran"):
        return f"not run ({rf.get('reason')})"
    v = rf.get("verdict") or {}
    line = f"side {v.get('side')}: {v.get('reason')}"
    for h in rf.get("hypotheses") or []:
        line += (f"; {h['side']}: reproduced by {h['reproduced_by'][0]}" if h.get("reproduced_by") else
                 f"; {h['side']}: {len(h.get('candidates') or [])} simulated faults ruled out")
    return line


def summary(doc: dict, out_dir: Path, visible: Callable[[str], str]) -> str:
    """A few lines for the terminal: verdict, top cause, where to look next.

    ``visible`` is the sibling's safetext.visible: every line carries names from the dumps, so each
    is printed with control characters as visible escapes.
    """
    lines = []
    s = doc.get("summary") or {}
    if s:
        lines.append(f"mapping: {s.get('pairs')} pairs; coverage train {s.get('mapped_train_modules')}/"
                     f"{s.get('train_modules')}, rollout {s.get('mapped_rollout_modules')}/{s.get('rollout_modules')}; "
                     f"one-sided train {s.get('train_only')}, rollout {s.get('rollout_only')}")
    fd = doc.get("first_divergence") or {}
    if fd.get("pair"):
        lines.append(f"first divergence: {_name(fd.get('train_modules'))} (train) <-> "
                     f"{_name(fd.get('rollout_modules'))} (rollout), tensor {fd.get('point')}")
    else:
        lines.append("first divergence: none beyond tolerance")
    lines.append(f"verdict: {doc['verdict']}")
    if doc["root_causes"]:
        top = doc["root_causes"][0]
        extra = f", missing on {top['missing_on']}" if top.get("missing_on") else ""
        paired = (top.get("evidence") or {}).get("aligned_by")
        extra += f", paired by {paired}" if paired in ("values", "order") else ""
        lines.append(f"top cause: {top['category']} at train={_name(top['train_module'])} "
                     f"rollout={_name(top['rollout_module'])} (layer {top['layer']}, side {top['side']}{extra}, "
                     f"confidence {top['confidence']} {top['confidence_word']})")
        if top.get("next_checks"):
            lines.append(f"look next: {top['next_checks'][0]}")
        if len(doc["root_causes"]) > 1:
            lines.append(f"{len(doc['root_causes']) - 1} more root-cause candidate(s) in the report")
    rf = doc.get("reference_forward") or {}
    if rf:
        lines.append("reference forward: " + _forward_line(rf))
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    n = doc["suppressed"]["counts"]
    lines.append(f"structural pairs set aside: {n['structural_different']} differing (put down to layout or "
                 f"carried from upstream, reasons in suppressed), {n['structural_clean']} agreeing, "
                 f"{n['structural_not_compared']} not comparable as stored")
    lv = doc.get("logits") or {}
    if lv.get("kind") == "per_token_logprob":
        first = lv.get("first_position_past_clean_level")
        lines.append(f"log-probs of the tokens: mean |diff| {lv['mean_abs_diff']:.3g}, max {lv['max_abs_diff']:.3g}; "
                     + (f"first position past the clean level: {first}" if first is not None
                        else "every position within the clean level"))
    elif lv.get("kind") == "logits_statistics" and isinstance(lv.get("error"), (int, float)):
        lines.append(f"logits statistics: {lv['status']}, error {lv['error']:.3g} vs tolerance {lv['tolerance']:.3g}")
    lines.append(f"evidence: {out_dir / REPORT}; write the final output_5_root_cause_report.md from "
                 f"references/report_template.md")
    lines.append(f"report: {out_dir / HTML}")
    return "\n".join(visible(line) for line in lines)
