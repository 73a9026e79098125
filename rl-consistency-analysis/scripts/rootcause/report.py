"""Write output_5_root_cause_report.json and print the short terminal summary.

The markdown report is the agent's job (references/report_template.md), not this script's.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

from . import sides
from .evidence import Evidence
from .triage import Triage

SCHEMA_VERSION = "2.0"
_UMASK = os.umask(0)
os.umask(_UMASK)
REPORT = "output_5_root_cause_report.json"
# Written by the agent from REPORT; a new REPORT makes an existing one stale.
AGENT_REPORT = "output_5_root_cause_report.md"
_KEEP = ("rank", "category", "side", "side_reason", "missing_on", "op_module", "train_module", "rollout_module",
         "layer", "role", "confidence", "confidence_word", "confidence_notes", "evidence", "hypotheses",
         "next_checks", "side_evidence", "config_keys")


def _clean(obj):
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    return obj


def build(ev: Evidence, tri: Triage, inputs: dict) -> dict:
    """The output_5 document."""
    causes = [{k: f[k] for k in _KEEP if k in f} for f in tri.root_causes]
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": tri.verdict,
        "root_causes": causes,
        "suppressed": tri.suppressed,
        "first_divergence": ev.analysis.get("first_divergence"),
        "other_candidates": [{k: f[k] for k in _KEEP if k in f} for f in tri.other_candidates],
        "precision": tri.precision,
        "notes": tri.notes,
        "partial": bool(ev.analysis.get("partial")),
        "comparability": ev.analysis.get("comparability"),
        "mode": ev.mode,
        "reference": sides.reference_section(ev),
        "inputs": inputs,
        "summary": ev.mapping.get("summary"),
    }


def write(out_dir: Path, doc: dict) -> Path:
    """Write the report atomically inside ``out_dir`` and remove the agent's markdown of an older one.

    The compare step already removes both output_5 files when it rewrites output_1..4; this covers
    ``--reuse-outputs``, where it does not run.
    """
    path = out_dir / REPORT
    fd, tmp = tempfile.mkstemp(prefix=f".{REPORT}.", suffix=".tmp", dir=out_dir)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)      # mkstemp makes 0600; the report is an ordinary file
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:
            json.dump(_clean(doc), fh, indent=1, ensure_ascii=False, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    stale = out_dir / AGENT_REPORT
    if stale.is_symlink() or stale.is_file():
        stale.unlink()
    return path


def _name(x) -> str:
    if x is None:
        return "-"
    return ", ".join(x) if isinstance(x, list) else str(x)


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
        lines.append(f"top cause: {top['category']} at train={_name(top['train_module'])} "
                     f"rollout={_name(top['rollout_module'])} (layer {top['layer']}, side {top['side']}{extra}, "
                     f"confidence {top['confidence']} {top['confidence_word']})")
        if top.get("next_checks"):
            lines.append(f"look next: {top['next_checks'][0]}")
        if len(doc["root_causes"]) > 1:
            lines.append(f"{len(doc['root_causes']) - 1} more root-cause candidate(s) in the report")
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    lines.append(f"suppressed as structural: {len(doc['suppressed'])}")
    lines.append(f"evidence: {out_dir / REPORT}; write the final output_5_root_cause_report.md from "
                 f"references/report_template.md")
    return "\n".join(visible(line) for line in lines)
