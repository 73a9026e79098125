#!/usr/bin/env python3
"""Read a metrics log and print each metric at start, early, middle and end (P1 step 2).

Reads logs as trainers write them: JSONL, Python dicts as the Hugging Face Trainer prints them,
`key=value` lines, and any mix of these with warnings and progress bars (other lines are skipped,
counted, and the first is shown); CSV, including W&B and MLflow exports; TensorBoard event files
when the optional tensorboard package is installed. Axis columns (step, epoch, timestamp ...) are
not metrics. For every metric it prints the value at the first point, at 10% and 50% of the run,
and at the last point, and flags NaN/Inf values, spikes, flat stretches, divergence (judged
against the metric's own size and step-to-step noise), and steps that go backwards (a resumed or
restarted run). Schedule values (learning rate, KL coefficient ...) and metrics named with
--expect-constant are reported but never called flat, spiking or diverging: the configuration
sets them. With --p1-table it prints the P1 measurement table pre-filled with those numbers and a
quoted log line per metric; the risky part and expected columns stay for you to fill.
Exit 0 no anomaly, 1 anomalies found, 2 unreadable input.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from metric_logs import LogRow, MetricLog, load_metric_log
from mldebug_common import Finding, InputError, LOWER_IS_BETTER, fmt_num, make_parser, report, run

TOOL = "read_curves"
POINTS = (("start", 0.0), ("early", 0.1), ("middle", 0.5), ("end", 1.0))
QUOTE_MAX = 160
FLAT_UNITS = 5  # a value held within this many units of a fixed printed resolution is not judged flat
FIXED_DECIMALS_MAX = 4
MAX_SPIKE_WIDTH = 2  # points; a wider excursion is a dip or a bump, see excursion_width
# Values a schedule or the configuration sets; matched against each '/'- or '_'-separated part.
SCHEDULED = re.compile(r"(?:^|[/_.])(?:lr|learning_rate|kl_coef|kl_ctl|beta|temperature|"
                       r"weight_decay|cliprange|clip_range|epsilon|momentum)(?:$|[/_.])", re.IGNORECASE)


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
    note: str = ""  # why a set value was not judged
    fault_step: float | None = None  # where a NONFINITE or DIVERGE finding starts, if any
    spikes: list[tuple[Finding, float]] = field(default_factory=list)  # each SPIKE finding and its step
    resolution: float = 0.0  # one unit of the last printed digit


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


def is_set_value(name: str, expect_constant: set[str]) -> bool:
    """True for a value the configuration sets: a schedule name or one the user marked constant."""
    return bool(SCHEDULED.search(name)) or name in expect_constant


def last_digit(value: float) -> float:
    """One unit of the last digit of the shortest decimal form of `value` (0.69 -> 0.01, 1.2e-05 -> 1e-06).

    A parsed float keeps the digits it was printed with (the shortest repr reproduces them), so
    this is the printed resolution, less any trailing zeros the printer wrote.
    """
    if value == 0:
        return 0.0  # zero says nothing about how many digits were printed
    text = repr(float(value)).lower()
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2].rstrip("0"))
    return 10.0 ** (int(exponent or 0) - decimals)


def printed_resolution(values: np.ndarray) -> float:
    """The resolution a metric was printed at: the finest last digit among its values.

    The finest, because a value that happens to end in zeros (0.50 printed, 0.5 read) shows a
    coarser digit than the printer used; full-precision floats give a negligible resolution.
    """
    units = [u for u in (last_digit(v) for v in values) if u > 0]
    return min(units) if units else 0.0


def fixed_decimals(log: MetricLog) -> float:
    """The resolution of a log whose printer writes a fixed number of decimals (verl's `{v:.3f}`), else 0.

    Such a log never shows more than k decimals in any value; a full-precision printer shows
    more than FIXED_DECIMALS_MAX somewhere, and a significant-digits one (the Trainer's 4) too.
    """
    units = [last_digit(v) for row in log.rows for v in row.values.values() if math.isfinite(v)]
    finest = min((u for u in units if u > 0), default=0.0)
    return finest if finest >= 10.0 ** -FIXED_DECIMALS_MAX else 0.0


def below_resolution(value: float, resolution: float) -> bool:
    """True when a held value is a few units of the log's fixed last digit, where rounding hides any motion."""
    return 0 < resolution < 1 and abs(value) <= FLAT_UNITS * resolution


def step_noise(values: np.ndarray, resolution: float = 0.0) -> float:
    """Robust size of the step-to-step noise: scaled MAD of first differences over sqrt(2).

    Values printed to a fixed resolution cannot show noise below it: the rounding error alone is
    uniform over one unit (standard deviation resolution / sqrt(12)), which is the floor.
    """
    if len(values) < 3:
        return 0.0
    d = np.diff(values)
    noise = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2)
    # Rounding in a smooth curve is not noise; below a billionth of the values' size it counts as none.
    negligible = 1e-9 * float(np.max(np.abs(values)))
    noise = noise if noise > negligible else 0.0
    floor = resolution / np.sqrt(12)
    return max(noise, floor if floor > negligible else 0.0)


def spikes(values: np.ndarray, z_limit: float, resolution: float = 0.0) -> list[tuple[int, float, float, float]]:
    """Points far from the median of their neighbours: (index, robust z, neighbours' median, scale).

    A centred running median follows any monotone trend exactly, so a fast early descent or a step
    change leaves no residual; only a point that jumps away from both sides does. The scale never
    falls below the printed `resolution`: on values printed to k decimals most residuals are exactly
    zero, so without the floor a move of one unit in the last digit would look enormous.
    """
    half = 3
    n = len(values)
    if n < 2 * half + 3:
        return []
    resid = np.array([values[i] - np.median(values[i - half:i + half + 1]) for i in range(half, n - half)])
    value_range = float(np.ptp(values))
    # The floor keeps a noiseless curve's kinks (a warmup peak, a V) from counting as spikes.
    scale = max(1.4826 * float(np.median(np.abs(resid - np.median(resid)))), 1e-2 * value_range, resolution)
    if scale == 0:
        return []
    local = np.maximum(local_noise(resid), scale)
    z = np.abs(resid) / local
    hits = [(i + half, float(z[i]), float(values[i + half] - resid[i]), float(local[i]))
            for i in np.flatnonzero(z > z_limit) if excursion_width(resid, int(i)) <= MAX_SPIKE_WIDTH]
    return sorted(hits, key=lambda t: -t[1])


def local_noise(resid: np.ndarray) -> np.ndarray:
    """Robust size of the residuals around each point, the point itself left out.

    The noise of a run is seldom one size: a single-batch loss jumps by half its value in the
    first fast descent and by a hundredth late on, so a point is judged against its own stretch
    of the run as well as against the whole.
    """
    n = len(resid)
    w = min(max(5, n // 20), 50)
    out = np.zeros(n)
    for i in range(n):
        around = np.concatenate([resid[max(0, i - w):i], resid[i + 1:i + 1 + w]])
        out[i] = 1.4826 * float(np.median(np.abs(around - np.median(around)))) if around.size else 0.0
    return out


def excursion_width(resid: np.ndarray, i: int) -> int:
    """Consecutive points around `i` that stand off the running median on the same side, by half as much.

    A spike is one or two points thrown off the curve and straight back; three or more form a
    dip or a bump the curve travels through (a policy's logits crossing zero, a learning-rate
    restart), which the readings show and which is no spike.
    """
    sign, half_size = np.sign(resid[i]), 0.5 * abs(resid[i])
    width, j = 1, i - 1
    while j >= 0 and np.sign(resid[j]) == sign and abs(resid[j]) > half_size:
        width, j = width + 1, j - 1
    j = i + 1
    while j < len(resid) and np.sign(resid[j]) == sign and abs(resid[j]) > half_size:
        width, j = width + 1, j + 1
    return width


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
            lower_better: bool, set_value: bool = False, fixed_resolution: float = 0.0) -> Curve | None:
    """Read one metric's curve and attach its anomaly findings (NaN/Inf only for a set value).

    `fixed_resolution` is the log's own fixed last digit (fixed_decimals), 0 when it has none.
    """
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
    lo, hi = int(np.argmin(fvals)), int(np.argmax(fvals))
    tail = flat_tail(fvals)
    resolution = printed_resolution(fvals)
    fault_step = float(steps[bad[0]]) if bad.size else None
    spike_steps: list[tuple[Finding, float]] = []
    note = ""
    if set_value:
        note = (f"{name} is a set value (schedule or --expect-constant): "
                + (f"held at {fmt_num(fvals[-1])} from step {fmt_num(fsteps[-tail])}" if tail > 1
                   else f"ranges {fmt_num(fvals[lo])} to {fmt_num(fvals[hi])}")
                + "; not judged for flat, spike or divergence")
    else:
        # A positive metric spanning a decade or more (a loss in its first descent) has noise in
        # proportion to its size, so its spikes are judged on the log scale, as ratios.
        ratios = bool(fvals.min() > 0 and fvals.max() >= 10 * fvals.min())
        judged = np.log(fvals) if ratios else fvals
        for i, z, around, scale in spikes(judged, spike_z, 0.0 if ratios else resolution)[:3]:
            noise = f"noise {np.expm1(scale):.0%} of its size" if ratios else f"noise scale {fmt_num(scale)}"
            findings.append(Finding(path, frows[i].line, "SPIKE",
                                    f"{name} jumps to {fmt_num(fvals[i])} at step {fmt_num(fsteps[i])} "
                                    f"against {fmt_num(np.exp(around) if ratios else around)} around it "
                                    f"(robust z {z:.0f}, {noise})"))
            spike_steps.append((findings[-1], float(fsteps[i])))
        if len(fvals) >= 5 and tail >= max(5, len(fvals) // 4):
            where = "for the whole run" if tail == len(fvals) else f"from step {fmt_num(fsteps[-tail])}"
            if below_resolution(fvals[-1], fixed_resolution):
                # 0.001 printed to three decimals may be anything from 0.0005 to 0.0015: the printer
                # hides whether it moves, so there is nothing to call flat, only a reading to redo.
                note = (f"{name} reads {fmt_num(fvals[-1])} {where}, within {FLAT_UNITS} units of the log's printed "
                        f"resolution {fmt_num(fixed_resolution)}: too coarse to see it move; log it with more digits")
            else:
                findings.append(Finding(path, frows[-tail].line, "FLAT",
                                        f"{name} stays exactly {fmt_num(fvals[-1])} {where} ({tail} points)"))
        diverged, onset = divergence(path, name, fsteps, fvals, frows, lower_better, resolution)
        findings += diverged
        if onset is not None:
            fault_step = onset if fault_step is None else min(fault_step, onset)
    by_line = {r.line: r for r in rows}
    quote_row = by_line[findings[0].line] if findings else frows[-1]
    return Curve(name, len(values), points, (float(fvals[lo]), float(fsteps[lo])),
                 (float(fvals[hi]), float(fsteps[hi])), findings, quote_row, note, fault_step, spike_steps,
                 resolution)


def after_the_fault(curves: list[Curve]) -> list[Curve]:
    """Curves without the SPIKEs that come at or after another metric's fault (NONFINITE or DIVERGE).

    Once one metric blows up or ends far above its best, the others move because of it (a reward
    dips, a gradient norm jumps): those moves are the fault seen again, not a second problem, and
    reporting them sends the reader after echoes. Each one set aside is named in the curve's note.
    """
    faults = [(c.fault_step, c.name) for c in curves if c.fault_step is not None]
    if not faults:
        return curves
    out = []
    for c in curves:
        earlier = [(step, name) for step, name in faults if name != c.name]
        if not earlier or not c.spikes:
            out.append(c)
            continue
        onset, cause = min(earlier)
        echoes = [(f, step) for f, step in c.spikes if step >= onset]
        if not echoes:
            out.append(c)
            continue
        kept = [f for f in c.findings if all(f is not e for e, _ in echoes)]
        steps = ", ".join(fmt_num(step) for _, step in echoes)
        note = "; ".join(n for n in (c.note, f"{c.name} moves at step(s) {steps}, after {cause}'s fault starts "
                                     f"at step {fmt_num(onset)}: read as its effect, not judged as a spike") if n)
        out.append(replace(c, findings=kept, note=note))
    return out


def divergence(path: str, name: str, steps: np.ndarray, values: np.ndarray, rows: list[LogRow],
               lower_better: bool, resolution: float = 0.0) -> tuple[list[Finding], float | None]:
    """Blow-up of magnitude at the end, or a lower-is-better metric ending clearly above its start.

    Returns the findings and the step where the fault starts (None when there is none): the last
    step still within twice the typical size for a blow-up, the best step for a rise.

    Both are judged against the metric's own scale and noise, so a loss that hovers around zero
    (GRPO's, say) is not diverging when it ends a little above where it started: the start and end
    are medians of a tenth of the run, and the rise must exceed four standard errors of their
    difference under the measured step-to-step noise.
    """
    n = len(values)
    if n < 5:
        return [], None
    w = max(1, n // 10)
    noise = step_noise(values, resolution)
    first_half = values[: max(1, n // 2)]
    head_scale = max(float(np.median(np.abs(first_half))),
                     1.4826 * float(np.median(np.abs(first_half - np.median(first_half)))), noise)
    peak = float(np.max(np.abs(values[-w:])))
    if head_scale > 0 and peak > 10 * head_scale:
        calm = np.flatnonzero(np.abs(values) <= 2 * head_scale)
        onset = float(steps[calm[-1]]) if calm.size else float(steps[0])
        return [Finding(path, rows[-1].line, "DIVERGE",
                        f"{name} reaches {fmt_num(peak)} in the last {w} point(s), {peak / head_scale:.0f}x "
                        f"its typical size in the first half ({fmt_num(head_scale)}, the larger of its "
                        f"median magnitude, spread and step-to-step noise)")], onset
    if not lower_better:
        return [], None
    start, end = float(np.median(values[:w])), float(np.median(values[-w:]))
    # Standard error of a median of w noisy points is about 1.25 noise / sqrt(w); of a difference, x sqrt(2).
    # One unit of the printed resolution is rounding of the two medians, not a rise.
    margin = max(4 * 1.25 * noise * np.sqrt(2 / w), 0.01 * abs(start), resolution)
    if end - start <= margin:
        return [], None
    best = int(np.argmin(values))
    noise_text = (f"{(end - start) / noise:.0f}x the rounding of its printed resolution {fmt_num(resolution)}"
                  if noise > 0 and noise == resolution / np.sqrt(12) else
                  f"{(end - start) / noise:.0f}x its step-to-step noise {fmt_num(noise)}" if noise > 0
                  else "with no step-to-step noise")
    return [Finding(path, rows[-1].line, "DIVERGE",
                    f"{name} ends at {fmt_num(end)} (median of the last {w} point(s)), "
                    f"{fmt_num(end - start)} above its start {fmt_num(start)} ({noise_text}), after "
                    f"reaching {fmt_num(values[best])} at step {fmt_num(steps[best])}")], float(steps[best])


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
    for extra in [log.skipped_text(), *log.notes, *(c.note for c in curves if c.note)]:
        if extra:
            head += "\n" + extra
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
    parser.add_argument("files", nargs="+", metavar="LOG",
                        help="metrics log (JSONL, CSV, key=value or mixed text, TensorBoard events)")
    parser.add_argument("--format", choices=("jsonl", "csv", "text", "tensorboard"),
                        help="override format detection (jsonl and text are read alike, line by line)")
    parser.add_argument("--step-key", help="key that orders rows (default: step, global_step, iter, epoch)")
    parser.add_argument("--metrics", help="comma-separated metrics to read (default: all numeric keys)")
    parser.add_argument("--spike-z", type=float, default=10.0,
                        help="robust z above which a point is a spike (default 10)")
    parser.add_argument("--lower-better", default="",
                        help="comma-separated metrics where lower is better, in addition to names "
                             "containing loss, error, nll, mse, mae or perplexity")
    parser.add_argument("--expect-constant", default="",
                        help="comma-separated metrics the configuration holds fixed, in addition to "
                             "schedule names (lr, learning_rate, beta, kl_coef, temperature ...)")
    parser.add_argument("--p1-table", action="store_true", help="print the pre-filled P1 table")
    args = parser.parse_args()
    findings: list[Finding] = []
    texts, per_file, reads = [], [], []
    extra_lower = {m.strip() for m in args.lower_better.split(",") if m.strip()}
    expect_constant = {m.strip() for m in args.expect_constant.split(",") if m.strip()}
    for path in args.files:
        log = load_metric_log(path, args.format)
        step_key = log.step_key(args.step_key)
        names = [m.strip() for m in args.metrics.split(",")] if args.metrics else log.metrics(step_key)
        missing = [m for m in names if m not in log.keys()]
        if missing:
            raise InputError(f"{path}: metric(s) not in log: {', '.join(missing)}")
        fixed = fixed_decimals(log)
        curves = after_the_fault([c for m in names if (c := analyse(
            log, m, step_key, args.spike_z, bool(LOWER_IS_BETTER.search(m)) or m in extra_lower,
            is_set_value(m, expect_constant), fixed))])
        reads.append(log.read_summary(step_key, names))
        file_findings = backwards_steps(log, step_key) + [f for c in curves for f in c.findings]
        findings += file_findings
        texts.append(p1_table(curves) if args.p1_table else summary_table(log, curves, step_key))
        per_file.append({"file": path, "lines": log.n_lines, "rows": len(log.rows), "format": log.fmt,
                         "step_key": step_key, "skipped_lines": log.skipped,
                         "first_skipped": log.first_skipped and {"line": log.first_skipped[0],
                                                                 "text": log.first_skipped[1]},
                         "notes": log.notes + [c.note for c in curves if c.note],
                         "metrics": {c.name: {"n": c.n, "min": c.minimum[0], "max": c.maximum[0],
                                              "printed_resolution": c.resolution,
                                              **{k: {"step": v[0], "value": v[1], "line": v[2].line}
                                                 for k, v in c.points.items()}} for c in curves},
                         "p1_table": p1_table(curves)})
    return report(TOOL, args.files, findings, args.json, {"logs": per_file}, "\n\n".join(texts), reads)


if __name__ == "__main__":
    run(TOOL, main)
