#!/usr/bin/env python3
"""Read a metrics log and print each metric at start, early, middle and end (P1 step 2).

Reads JSONL, CSV, or text lines holding `key=value` (or `key: value`) pairs. For every numeric
metric it prints the value at the first point, at 10% and 50% of the run, and at the last point,
and flags NaN/Inf values, spikes, flat stretches, divergence, and steps that go backwards (a
resumed or restarted run). With --p1-table it prints the P1 measurement table pre-filled with those
numbers and a quoted log line per metric; the risky part and expected columns stay for you to fill.
Exit 0 no anomaly, 1 anomalies found, 2 unreadable input.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mldebug_common import (Finding, InputError, LOWER_IS_BETTER, LogRow, MetricLog, fmt_num,
                            load_metric_log, make_parser, report, run)

TOOL = "read_curves"
POINTS = (("start", 0.0), ("early", 0.1), ("middle", 0.5), ("end", 1.0))
QUOTE_MAX = 160


@dataclass
class Curve:
    """One metric's four readings, its range and the anomalies found on it."""

    name: str
    n: int
    points: dict[str, tuple[float, float, LogRow]]
    minimum: tuple[float, float]
    maximum: tuple[float, float]
    findings: list[Finding] = field(default_factory=list)
    quote_row: LogRow | None = None  # the first anomaly's row, else the last row


def pick_points(steps: np.ndarray, by_step: bool) -> dict[str, int]:
    """Index of the logged point nearest to each fraction of the run (by step when steps ascend)."""
    n = len(steps)
    out = {}
    for name, frac in POINTS:
        if by_step and n > 1:
            target = steps[0] + frac * (steps[-1] - steps[0])
            out[name] = int(np.argmin(np.abs(steps - target)))
        else:
            out[name] = int(round(frac * (n - 1)))
    return out


def spikes(values: np.ndarray, z_limit: float) -> list[tuple[int, float]]:
    """Points far from the median of their neighbours: (index, robust z), largest first.

    A centred running median follows any monotone trend exactly, so a fast early descent or a step
    change leaves no residual; only a point that jumps away from both sides does.
    """
    half = 3
    n = len(values)
    if n < 2 * half + 3:
        return []
    resid = np.array([values[i] - np.median(values[i - half:i + half + 1]) for i in range(half, n - half)])
    value_range = float(np.ptp(values))
    # The floor keeps a noiseless curve's kinks (a warmup peak, a V) from counting as spikes.
    scale = max(1.4826 * float(np.median(np.abs(resid - np.median(resid)))), 1e-2 * value_range)
    if scale == 0:
        return []
    z = np.abs(resid) / scale
    hits = [(i + half, float(z[i])) for i in np.flatnonzero(z > z_limit)]
    return sorted(hits, key=lambda t: -t[1])


def flat_tail(values: np.ndarray) -> int:
    """Length of the run of identical values at the end of the series (tolerance 1e-9 relative)."""
    last = values[-1]
    tol = 1e-9 * max(abs(float(last)), 1e-12)
    k = 0
    for v in values[::-1]:
        if abs(v - last) > tol:
            break
        k += 1
    return k


def analyse(log: MetricLog, name: str, step_key: str | None, spike_z: float,
            lower_better: bool) -> Curve | None:
    """Read one metric's curve and attach its anomaly findings."""
    series = log.series(name, step_key)
    if not series:
        return None
    path = log.path
    steps = np.array([s for s, _, _ in series], dtype=float)
    values = np.array([v for _, v, _ in series], dtype=float)
    rows = [r for _, _, r in series]
    finite = np.isfinite(values)
    findings: list[Finding] = []
    bad = np.flatnonzero(~finite)
    if bad.size:
        first = int(bad[0])
        findings.append(Finding(path, rows[first].line, "NONFINITE",
                                f"{name} is {values[first]} at step {fmt_num(steps[first])} "
                                f"({bad.size} non-finite of {len(values)}); read the rows before it"))
    fsteps, fvals = steps[finite], values[finite]
    frows = [r for r, ok in zip(rows, finite) if ok]
    if fvals.size == 0:
        return Curve(name, len(values), {}, (float("nan"), 0), (float("nan"), 0), findings, rows[0])
    ascending = bool(np.all(np.diff(fsteps) >= 0))
    idx = pick_points(fsteps, ascending)
    points = {k: (float(fsteps[i]), float(fvals[i]), frows[i]) for k, i in idx.items()}
    for i, z in spikes(fvals, spike_z)[:3]:
        findings.append(Finding(path, frows[i].line, "SPIKE",
                                f"{name} jumps to {fmt_num(fvals[i])} at step {fmt_num(fsteps[i])} "
                                f"(robust z {z:.0f} against its neighbours)"))
    tail = flat_tail(fvals)
    if len(fvals) >= 5 and tail >= max(5, len(fvals) // 4):
        where = "for the whole run" if tail == len(fvals) else f"from step {fmt_num(fsteps[-tail])}"
        findings.append(Finding(path, frows[-tail].line, "FLAT",
                                f"{name} stays exactly {fmt_num(fvals[-1])} {where} ({tail} points)"))
    findings += divergence(path, name, fsteps, fvals, frows, lower_better)
    lo, hi = int(np.argmin(fvals)), int(np.argmax(fvals))
    by_line = {r.line: r for r in rows}
    quote_row = by_line[findings[0].line] if findings else frows[-1]
    return Curve(name, len(values), points, (float(fvals[lo]), float(fsteps[lo])),
                 (float(fvals[hi]), float(fsteps[hi])), findings, quote_row)


def divergence(path: str, name: str, steps: np.ndarray, values: np.ndarray, rows: list[LogRow],
               lower_better: bool) -> list[Finding]:
    """Blow-up of magnitude in the last tenth, or a lower-is-better metric ending above its start."""
    n = len(values)
    if n < 5:
        return []
    out = []
    tail = values[-max(1, n // 10):]
    head_scale = float(np.median(np.abs(values[: max(1, n // 2)])))
    if head_scale > 0 and float(np.max(np.abs(tail))) > 10 * head_scale:
        out.append(Finding(path, rows[-1].line, "DIVERGE",
                           f"{name} grows to {fmt_num(float(np.max(np.abs(tail))))} in the last tenth, "
                           f"over 10x its typical early size {fmt_num(head_scale)}"))
    elif lower_better and values[0] > values.min() and values[-1] > values[0] + 0.01 * abs(values[0]):
        best = int(np.argmin(values))
        out.append(Finding(path, rows[-1].line, "DIVERGE",
                           f"{name} ends at {fmt_num(values[-1])}, above its start {fmt_num(values[0])}, "
                           f"after reaching {fmt_num(values[best])} at step {fmt_num(steps[best])}"))
    return out


def backwards_steps(log: MetricLog, step_key: str | None) -> list[Finding]:
    """Steps that go backwards mean a resumed or restarted run sharing one log."""
    if not step_key:
        return []
    out, last = [], None
    for row in log.rows:
        step = row.values.get(step_key)
        if step is None:
            continue
        if last is not None and step < last:
            out.append(Finding(log.path, row.line, "STEP-BACK",
                               f"{step_key} goes back from {fmt_num(last)} to {fmt_num(step)}; a resume "
                               "or restart shares this log, so read each segment separately"))
        last = step
    return out


def quote(row: LogRow) -> str:
    """The row's raw log line as a Markdown code span safe inside a table cell."""
    text = row.raw.strip()
    if len(text) > QUOTE_MAX:
        text = text[:QUOTE_MAX] + "\u2026"
    text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence}{text}{fence}"


def p1_table(curves: list[Curve]) -> str:
    """The P1 measurement table with the four readings and a quoted line filled in per metric."""
    lines = ["| risky part | expected | start | early | middle | end | quoted line |",
             "|---|---|---|---|---|---|---|"]
    for c in curves:
        cells = []
        for key, _ in POINTS:
            if key in c.points:
                step, value, _ = c.points[key]
                cells.append(f"{fmt_num(value)} (step {fmt_num(step)})")
            else:
                cells.append("unknown: no finite value logged")
        lines.append(f"| <risky part read by {c.name}> | <what you expected before reading> | "
                     + " | ".join(cells) + f" | {quote(c.quote_row)} |")
    return "\n".join(lines)


def summary_table(log: MetricLog, curves: list[Curve], step_key: str | None) -> str:
    """Plain-text overview: the file, its length, and one line per metric."""
    head = (f"{log.path}: {log.n_lines} lines read, {len(log.rows)} with metrics, format {log.fmt}, "
            f"step key {step_key or '(row order)'}")
    rows = [("metric", "n", "start", "early", "middle", "end", "min (step)", "max (step)")]
    for c in curves:
        vals = [fmt_num(c.points[k][1]) if k in c.points else "-" for k, _ in POINTS]
        rows.append((c.name, str(c.n), *vals, f"{fmt_num(c.minimum[0])} ({fmt_num(c.minimum[1])})",
                     f"{fmt_num(c.maximum[0])} ({fmt_num(c.maximum[1])})"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    body = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
    return head + "\n" + body


def main() -> int:
    """Parse arguments, read each log, print the readings and anomalies, return the exit code."""
    parser = make_parser("read_curves.py", __doc__,
                         "Exit 0 no anomaly, 1 anomalies found, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="LOG", help="metrics log (JSONL, CSV or key=value text)")
    parser.add_argument("--format", choices=("jsonl", "csv", "text"), help="override format detection")
    parser.add_argument("--step-key", help="key that orders rows (default: step, global_step, iter, epoch)")
    parser.add_argument("--metrics", help="comma-separated metrics to read (default: all numeric keys)")
    parser.add_argument("--spike-z", type=float, default=10.0,
                        help="robust z above which a point is a spike (default 10)")
    parser.add_argument("--lower-better", default="",
                        help="comma-separated metrics where lower is better, in addition to names "
                             "containing loss, error, nll, mse, mae or perplexity")
    parser.add_argument("--p1-table", action="store_true", help="print the pre-filled P1 table")
    args = parser.parse_args()
    findings: list[Finding] = []
    texts, per_file = [], []
    extra_lower = {m.strip() for m in args.lower_better.split(",") if m.strip()}
    for path in args.files:
        log = load_metric_log(path, args.format)
        step_key = log.step_key(args.step_key)
        names = [m.strip() for m in args.metrics.split(",")] if args.metrics else \
            [k for k in log.keys() if k != step_key]
        missing = [m for m in names if m not in log.keys()]
        if missing:
            raise InputError(f"{path}: metric(s) not in log: {', '.join(missing)}")
        curves = [c for m in names if (c := analyse(log, m, step_key, args.spike_z,
                                                      bool(LOWER_IS_BETTER.search(m)) or m in extra_lower))]
        file_findings = backwards_steps(log, step_key) + [f for c in curves for f in c.findings]
        findings += file_findings
        texts.append(p1_table(curves) if args.p1_table else summary_table(log, curves, step_key))
        per_file.append({"file": path, "lines": log.n_lines, "rows": len(log.rows), "format": log.fmt,
                         "step_key": step_key,
                         "metrics": {c.name: {"n": c.n, "min": c.minimum[0], "max": c.maximum[0],
                                              **{k: {"step": v[0], "value": v[1], "line": v[2].line}
                                                 for k, v in c.points.items()}} for c in curves},
                         "p1_table": p1_table(curves)})
    return report(TOOL, args.files, findings, args.json, {"logs": per_file}, "\n\n".join(texts))


if __name__ == "__main__":
    run(TOOL, main)
