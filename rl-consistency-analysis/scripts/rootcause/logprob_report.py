"""The log-prob triage document (logprob_triage.json) and its markdown view (logprob_triage.md)."""
from __future__ import annotations

import html
import json
from pathlib import Path

from . import files
from .logprob_judgement import SCHEMA_VERSION, TOKENS_FILE, Triage, step_table

JSON_NAME = "logprob_triage.json"
MD_NAME = "logprob_triage.md"
HTML_NAME = "logprob_triage.html"
_SEVERITY = {"likely_bug": 2, "undetermined": 1, "precision_noise": 0}
_MD_METRICS = ("tokens", "sequences", "non_finite_tokens", "log_prob_abs_diff_mean", "log_prob_abs_diff_p99",
               "log_prob_abs_diff_max", "rollout_is_min", "rollout_is_max", "rollout_is_ratio_fraction_low",
               "rollout_is_ratio_fraction_high", "kl", "k3_kl", "seq_log_ratio_min", "seq_log_ratio_max",
               "log_ppl_diff", "top1_disagreement")


def _section(t: Triage) -> dict:
    return {"verdict": t.verdict, "reason": t.reason, "patterns": t.patterns, "metrics": t.metrics,
            "noise_band": t.noise, "next_dump": t.next_dump, "inputs": t.inputs, "notes": t.notes, "charts": t.charts}


def document(triages: list[Triage]) -> dict:
    """The JSON document: the worst step's triage at the top level, every step under ``steps``."""
    worst = max(range(len(triages)), key=lambda i: (_SEVERITY[triages[i].verdict], -i))
    doc = {"schema_version": SCHEMA_VERSION, **_section(triages[worst]), "next_dump_tokens": triages[worst].tokens}
    if len(triages) > 1:
        first_off = next((i for i, t in enumerate(triages) if t.verdict != "precision_noise"), None)
        doc["step_table"] = step_table(triages)
        doc["first_step_not_noise"] = first_off
        doc["reported_step"] = worst
        doc["steps"] = [_section(t) for t in triages]
    return doc


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "-" if x is None else str(x)


def markdown(doc: dict) -> str:
    """The human view of the document."""
    m = doc["metrics"]
    lines = ["# Log-prob triage", "", f"**verdict: {doc['verdict']}** — {doc['reason']}", "",
             f"Rollout `{doc['inputs']['rollout']['path']}` ({doc['inputs']['rollout']['format']}), train "
             f"`{doc['inputs']['train']['path']}` ({doc['inputs']['train']['format']}); paired by "
             f"{doc['inputs']['paired_by']}: {doc['inputs']['paired_sequences']} sequences, "
             f"{doc['inputs']['paired_tokens']} tokens.", "", "## Patterns", ""]
    if not doc["patterns"]:
        lines.append("None of the listed patterns fired.")
    for p in doc["patterns"]:
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in p["evidence"].items() if not isinstance(v, (list, dict)))
        lines += [f"- **{p['name']}** ({ev})", f"  - check: {p['check']}"]
    lines += ["", "## Metrics (names as verl's rollout_corr/...)", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(m.get(k))} |" for k in _MD_METRICS if k in m]
    sig = m.get("noise_signature") or {}
    if sig:
        lines += ["", "Noise signature: " + ", ".join(f"{k} {_fmt(v)}" for k, v in sig.items())]
    nb = doc["noise_band"]
    lines += ["", f"## Noise band ({nb['precision']}, {nb['source']})", "",
              "| surprisal from | p99 abs diff | tokens |", "|---|---|---|"]
    lines += [f"| {e} | {q:.3g} | {n} |" for e, q, n in zip(nb["surprisal_edges"], nb["abs_diff_p99"], nb["tokens"])]
    if m.get("worst_sequences"):
        lines += ["", "## Worst sequences", "", "| id | tokens | mean abs diff | max | at | positions past band |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {w['id']} | {w['tokens']} | {w['mean_abs_diff']:.3g} | {w['max_abs_diff']:.3g} | "
                  f"{w['max_at_position']} | {w['positions_past_band'][:10]} |" for w in m["worst_sequences"]]
    if doc.get("step_table"):
        lines += ["", "## Steps", "", "| step | verdict | patterns | tokens | mean abs diff | kl | k3_kl |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['verdict']} | {', '.join(r['patterns']) or '-'} | {r['tokens']} | "
                  f"{_fmt(r['log_prob_abs_diff_mean'])} | {_fmt(r['kl'])} | {_fmt(r['k3_kl'])} |"
                  for r in doc["step_table"]]
    lines += ["", "## Next", ""]
    for s in doc["next_dump"] or [{"why": "nothing to dump: the mismatch is the size precision gives",
                                    "commands": []}]:
        lines.append(f"- {s['why']}" + (f" (msprobe task {s['msprobe_task']}, {s['layer_scope']}; sequence "
                                        f"{s.get('sequence')}, positions {s.get('positions')})"
                                        if s.get("msprobe_task") else ""))
        lines += [f"  - `{c}`" for c in s["commands"]]
    for n in doc["notes"]:
        lines.append(f"- note: {n}")
    return "\n".join(lines) + "\n"


def _polyline(values: list, width: int, height: int, top: float, colour: str, dash: str = "") -> str:
    if not values:
        return ""
    step = width / max(1, len(values) - 1)
    pts = " ".join(f"{i * step:.1f},{height - min(v, top) / top * height:.1f}" for i, v in enumerate(values))
    dashes = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dashes} points="{pts}"/>'


def html_section(doc: dict) -> str:
    """The log-prob charts as an HTML fragment: |delta| per position of the worst sequences against
    the band's limit, and the histogram of the log importance ratio."""
    charts = doc.get("charts") or {}
    w, h = 600, 160
    parts = [f"<section id='logprob-triage'><h2>Log-prob triage: {html.escape(doc['verdict'])}</h2>",
             f"<p>{html.escape(doc['reason'])}</p>"]
    for s in charts.get("worst_sequences", []):
        top = max([*s["abs_diff"], *s["band_limit"], 1e-12])
        parts.append(f"<h3>|delta log-prob| per position, sequence {html.escape(str(s['id']))} "
                     f"(dashed: noise band limit; top {top:.3g})</h3>"
                     f"<svg width='{w}' height='{h}' style='border:1px solid #ccc'>"
                     + _polyline(s["abs_diff"], w, h, top, "#c0392b")
                     + _polyline(s["band_limit"], w, h, top, "#2c3e50", "4 3") + "</svg>")
    hist = charts.get("log_ratio_histogram")
    if hist:
        counts, edges = hist["counts"], hist["edges"]
        peak = max(counts) or 1
        bw = w / len(counts)
        bars = "".join(f"<rect x='{i * bw:.1f}' y='{h - c / peak * h:.1f}' width='{bw - 1:.1f}' "
                       f"height='{c / peak * h:.1f}' fill='#2980b9'/>" for i, c in enumerate(counts))
        parts.append(f"<h3>log importance ratio (train - rollout), {edges[0]} to {edges[-1]}, outer bins "
                     f"hold everything beyond</h3><svg width='{w}' height='{h}' style='border:1px solid #ccc'>"
                     f"{bars}</svg>")
    return "\n".join(parts) + "</section>\n"


def write(out_dir: Path, doc: dict) -> Path:
    """Write the JSON and its views (markdown, HTML charts) inside ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(files.json_safe(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
    path = files.write_text(out_dir / JSON_NAME, text)
    files.write_text(out_dir / MD_NAME, markdown(doc))
    if doc.get("next_dump_tokens"):
        files.write_text(out_dir / TOKENS_FILE, json.dumps(doc["next_dump_tokens"]) + "\n")
    files.write_text(out_dir / HTML_NAME, "<!doctype html><meta charset='utf-8'><title>Log-prob triage</title>"
                      f"<body>{html_section(doc)}</body>\n")
    return path
