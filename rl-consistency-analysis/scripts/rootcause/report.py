"""Write output_5_root_cause_report.json and print the short terminal summary.

The markdown report is the agent's job (SKILL.md, references/report_template.md), not this script's.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Callable

from . import answer, commands, explain, logprob_consistency, logprob_tokens, sides, triage
from .files import json_safe, write_text
from .evidence import Evidence
from .triage import Triage

# 3.0: next_checks are {check, command}; answer; confidence_text. 3.1: logprobs. 3.2: logprobs 2.0
# (noise, the one verdict on the log-probs; consistency of the dumps with the files). 3.3: one root
# cause per module, category and side; evidence.other_calls where it was found again.
SCHEMA_VERSION = "3.3"
REPORT = "output_5_root_cause_report.json"
# Written by the agent from REPORT; a new REPORT makes an existing one stale.
AGENT_REPORT = "output_5_root_cause_report.md"
HTML = "report.html"
_KEEP = ("rank", "category", "side", "side_reason", "missing_on", "op_module", "train_module", "rollout_module",
         "layer", "role", "confidence", "confidence_word", "confidence_notes", "evidence", "hypotheses",
         "next_checks", "side_evidence", "config_keys", "rules_fired")


def _finding(ev: Evidence, f: dict, reach: bool | None, argv: list[str]) -> dict:
    """A cause or candidate as output_5 shows it: the triage's fields plus its numbers (from the pair
    of the modules it names), what they already refute, its confidence in words and each next check
    with the command that runs it."""
    out = {k: f[k] for k in _KEEP if k in f}
    out["numbers"] = explain.numbers(ev, triage.own_pair(f))
    out["refuted"] = explain.refuted(f, out["numbers"], reach, ev.vocab)
    out["category_text"] = answer.CATEGORY_WORDS.get(f["category"], f["category"])
    out["confidence_text"] = answer.confidence_text(f.get("confidence"), f.get("confidence_word"))
    if "next_checks" in f:
        out["next_checks"] = commands.checks(f["next_checks"], argv)
    return out


def _suppressed(records: list[dict]) -> dict:
    """Structural pairs set aside, split by whether their values agree, with counts saying so."""
    split = {f"structural_{v}": [r for r in records if r["values"] == v]
             for v in ("clean", "different", "not_compared")}
    return {**split, "counts": {k: len(v) for k, v in split.items()}}


def build(ev: Evidence, tri: Triage, inputs: dict, input_notes: list[str] = (), logprob_files=None,
          logprob_triage: dict | None = None) -> dict:
    """The output_5 document; ``inputs["argv"]`` is this run's command line (for the commands of the
    next checks), ``input_notes`` the notes on the inputs (input_checks.py), which lead ``notes``,
    ``logprob_files`` the paired log-prob files with their paths ((Paired, (rollout, train))) or None,
    and ``logprob_triage`` their triage document (which then gives the noise verdict)."""
    reach = triage.reaches_output(ev)
    argv = list(inputs.get("argv") or [])
    doc = {
        "schema_version": SCHEMA_VERSION,
        "verdict": tri.verdict,
        "root_causes": [_finding(ev, f, reach, argv) for f in tri.root_causes],
        "suppressed": _suppressed(tri.suppressed),
        "first_divergence": ev.analysis.get("first_divergence"),
        "other_candidates": [_finding(ev, f, reach, argv) for f in tri.other_candidates],
        "precision": tri.precision,
        "notes": list(input_notes) + tri.notes,
        "partial": bool(ev.analysis.get("partial")),
        "comparability": ev.analysis.get("comparability"),
        "mode": ev.mode,
        "reference": sides.reference_section(ev),
        "reference_forward": sides.forward_section(ev),
        "inputs": inputs,
        "sides": explain.sides(ev),
        "logits": ev.compare.get("logprob"),
        "logprobs": logprob_tokens.section(ev.compare, ev.results, ev.mode, *(logprob_files or (None, None)),
                                           triage=logprob_triage),
        "reaches_output": reach,
        "summary": ev.mapping.get("summary"),
    }
    doc["glossary"] = explain.glossary(doc, ev.vocab, ev.analysis.get("rank_meanings"))
    doc["answer"] = answer.build(doc, argv, input_notes)
    return doc


def write(out_dir: Path, doc: dict) -> Path:
    """Write the report atomically inside ``out_dir`` and remove the agent's markdown of an older one.

    The compare step already removes both output_5 files when it rewrites output_1..4; this covers
    ``--reuse-outputs``, where it does not run.
    """
    text = json.dumps(json_safe(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    path = write_text(out_dir / REPORT, text)
    stale = out_dir / AGENT_REPORT
    if stale.is_symlink() or stale.is_file():
        stale.unlink()
    return path




def _forward_line(rf: dict) -> str:
    if not rf.get("ran"):
        return f"not run ({rf.get('reason')})"
    v = rf.get("verdict") or {}
    line = f"side {v.get('side')}: {v.get('reason')}"
    for h in rf.get("hypotheses") or []:
        line += (f"; {h['side']}: reproduced by {h['reproduced_by'][0]}" if h.get("reproduced_by") else
                 f"; {h['side']}: {len(h.get('candidates') or [])} simulated faults ruled out")
    return line


def _command_line(cmd: list[str] | None) -> list[str]:
    return [f"  run: {shlex.join(cmd)}"] if cmd else []


def _logits_line(lv: dict) -> str | None:
    """The logits' statistics comparison (tensor mode says more on the log-prob line)."""
    if lv.get("kind") == "logits_statistics" and isinstance(lv.get("error"), (int, float)):
        return (f"logits: {lv['status']}, relative error {lv['error']:.3g} against a tolerance of "
                f"{lv['tolerance']:.3g}")
    return None


def summary(doc: dict, out_dir: Path, visible: Callable[[str], str]) -> str:
    """The terminal view, for a person: notes on the inputs, the answer, the next check and its
    command, then the supporting lines and where the files are.

    ``visible`` is the sibling's safetext.visible: every line carries names from the dumps, so each
    is printed with control characters as visible escapes.
    """
    a = doc["answer"]
    lines = [f"note: {n}" for n in a["input_notes"]]
    if a["nothing_compared"]:
        why = a["nothing_compared"].removeprefix("nothing was compared").strip(" :()")
        lines.append(f"nothing was compared ({why}): this is not an all-clear")
    lines.append(f"verdict: {a['verdict']}")
    rc = a["root_cause"]
    if rc:
        lines.append(f"root cause: {rc['what']} at {rc['where']}, layer {rc['layer']}"
                     + (f", {rc['when']}" if rc.get("when") else ""))
        lines.append(f"side: {rc['side']}: {rc['why_this_side']}")
        lines.append(f"confidence: {rc['confidence']}")
        first = a["next_checks"][0] if a["next_checks"] else None
        if first:
            lines.append(f"next check: {first['check']}")
            lines += _command_line(first["command"])
        if a["decide_side"]:
            same = bool(first) and first["command"] == a["decide_side"]["command"]
            lines.append(f"to decide the side: {a['decide_side']['check']}" + (" (the command above)" if same else ""))
            lines += [] if same else _command_line(a["decide_side"]["command"])
        if rc["more"]:
            lines.append(f"{rc['more']} more root-cause candidate(s) in the report")
    fd = doc.get("first_divergence") or {}
    if fd.get("pair"):
        lines.append(f"first divergence: {answer.names(fd.get('train_modules'))} (train) <-> "
                     f"{answer.names(fd.get('rollout_modules'))} (rollout), tensor {fd.get('point')}")
    elif not a["nothing_compared"]:
        lines.append("first divergence: none beyond tolerance")
    logits = _logits_line(doc.get("logits") or {})
    if logits:
        lines.append(logits)
    if doc.get("logprobs"):
        lines.append(logprob_tokens.console_line(doc["logprobs"]))
        if doc["logprobs"]["consistency"]["verdict"] != "not_checked":
            lines.append(logprob_consistency.console_line(doc["logprobs"]["consistency"]))
    rf = doc.get("reference_forward") or {}
    if rf:
        lines.append("reference forward: " + _forward_line(rf))
    shown = set(a["input_notes"]) | {f"not comparable: {a['nothing_compared']}"}
    lines += [f"note: {n}" for n in doc["notes"] if n not in shown]
    s = doc.get("summary") or {}
    if s:
        lines.append(f"mapping: {s.get('pairs')} module pairs; train {s.get('mapped_train_modules')} of "
                     f"{s.get('train_modules')} modules mapped, rollout {s.get('mapped_rollout_modules')} of "
                     f"{s.get('rollout_modules')}; on one side only: train {s.get('train_only')}, "
                     f"rollout {s.get('rollout_only')}")
    n = doc["suppressed"]["counts"]
    lines.append(f"set aside as layout differences (fused or sharded pairs): {n['structural_different']} whose "
                 f"values differ, {n['structural_clean']} that agree, {n['structural_not_compared']} not "
                 f"comparable as stored")
    lines.append(f"report: {out_dir / HTML}")
    lines.append(f"evidence (JSON): {out_dir / REPORT}")
    return "\n".join(visible(line) for line in lines)
