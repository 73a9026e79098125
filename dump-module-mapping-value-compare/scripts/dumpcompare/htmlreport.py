"""report.html: one self-contained page (inline SVG, no script, no network) drawn from the outputs.

Standard library only and no package imports: the root-cause skill loads this file by path
from its sibling folder (rootcause/sibling.py) and adds its verdict, so both skills draw the
same charts from one copy of the code (chartwindow.py, beside it, says which outputs a chart of
many draws one by one). Input is the JSON form of the outputs (non-finite numbers
may be the strings "NaN"/"Infinity"). Every string read from a dump goes through :func:`text`
(safetext.html, the one escaping of every view, loaded from the file beside this one) and only
into element content, never into an attribute.
"""
from __future__ import annotations

import importlib.util
import math
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def _load_beside(name: str):
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"htmlreport_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SAFE = _load_beside("safetext")
_WIN = _load_beside("chartwindow")

REPORT = "report.html"
STATUS_CLASS = {"match": "match", "drift": "drift", "mismatch": "mismatch", "nonfinite": "nonfinite",
                "bounded": "bounded", "structural": "structural", "incomparable": "incomparable"}
# bounded (consistent, not verified) is drawn apart from match: it is not an agreement.
COLOURS = {"match": "#2e7d32", "drift": "#e6a100", "mismatch": "#c62828", "nonfinite": "#6a1b9a",
           "bounded": "#0277bd", "structural": "#757575", "incomparable": "#9e9e9e", "other": "#9e9e9e"}
GROUPS = (("attention", ("q", "k", "v", "q_rot", "k_rot", "q_normed", "k_normed", "attn_core_out", "attn_out")),
          ("mlp", ("gate", "up", "act_gate", "act_out", "mlp_out")),
          ("norms", ("attn_norm_out", "mlp_norm_out")))
GROUP_COLOURS = {"attention": "#1565c0", "mlp": "#ef6c00", "norms": "#6d4c41"}
FUSED_KINDS = ("composite", "by_design_difference", "cross_role")
# The statistics of output_3 ``stat_errors`` as a person names them.
STAT_WORDS = {"max_rel": "Max", "min_rel": "Min", "mean_rel": "Mean", "norm_rel": "Norm"}
LABEL_CHAR = 5.0     # width in pixels of one character of a 9px axis label (sans-serif, generous)
FLOOR = -12          # log10 of the smallest error drawn; exact zeros sit on this line


def text(value) -> str:
    """One dump-derived value as HTML element content (safetext.html: markup escaped, invisible
    characters such as bidi overrides shown as escapes)."""
    return _SAFE.html(str(value))


def num(v) -> float | None:
    """A number from the JSON form (strings 'NaN'/'Infinity' included), else None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(v)


def _digits(v) -> str:
    x = num(v)
    return fmt(v) if x is None or not math.isfinite(x) else f"{x:.7g}"


def fmt(v) -> str:
    x = num(v)
    if x is None:
        return "-"
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"


def _log(x: float | None) -> float:
    if x is None or math.isnan(x):
        return FLOOR
    if math.isinf(x):
        return 3.0
    return max(FLOOR, math.log10(x)) if x > 0 else FLOOR


class Axis:
    """A log10 y axis mapped onto pixel rows [top, bottom]."""

    def __init__(self, lo: float, hi: float, top: float, bottom: float):
        self.lo, self.hi = math.floor(lo), math.ceil(hi) if hi > lo else math.floor(lo) + 1
        self.top, self.bottom = top, bottom

    def y(self, value: float | None) -> float:
        v = min(max(_log(value), self.lo), self.hi)
        return round(self.bottom - (v - self.lo) / (self.hi - self.lo) * (self.bottom - self.top), 1)

    def draw(self, left: float, right: float, label: str) -> list[str]:
        out = [f'<g class="y-axis"><text x="{left - 44}" y="{self.top - 8}" font-size="11">{text(label)}</text>']
        step = max(1, (self.hi - self.lo) // 8)
        for e in range(int(self.lo), int(self.hi) + 1, step):
            y = self.bottom - (e - self.lo) / (self.hi - self.lo) * (self.bottom - self.top)
            # Smaller values, exact zeros included, are drawn on the bottom line.
            tick = f"≤1e{e}" if e == self.lo else f"1e{e}"
            out.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                       f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{tick}</text>')
        return out + ["</g>"]


def _span(values: list[float | None], extra: list[float | None] = ()) -> tuple[float, float]:
    logs = [_log(v) for v in list(values) + list(extra) if v is not None and num(v) is not None]
    finite = [x for x in logs if x > FLOOR] or [-6.0]
    return min(finite) - 1, max(finite) + 0.5


def _svg_open(width: float, height: float, cls: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">')


def _svg(width: float, height: float, cls: str, body: list[str]) -> str:
    return _svg_open(width, height, cls) + "".join(body) + "</svg>"


# -- the log-prob view ----------------------------------------------------------------------------

def logprob_section(lp: dict | None, result: dict | None) -> str:
    """The first section: per-token log-prob differences, or the logits' statistics difference."""
    head = "<h2>1. Log-probabilities of the tokens</h2>"
    if not lp:
        return head + "<p>No logits were compared (no logits module on one side, or not dumped).</p>"
    if lp.get("kind") == "per_token_logprob" and result and result.get("logprob"):
        return head + _logprob_tensor(lp, result["logprob"])
    return head + _logits_stats(lp)


def _logprob_tensor(lp: dict, full: dict) -> str:
    diff, clean = full["abs_diff"], full["clean_level"]
    vals, levels, bucket = diff["values"], clean["values"], diff["bucket"]
    first = full["first_position"]
    left, top, w, h = 70, 30, max(600, 8 * len(vals)), 260
    ax = Axis(*_span(vals, levels), top, top + h)
    xs = [left + (i + 0.5) * w / len(vals) for i in range(len(vals))]
    body = ax.draw(left, left + w, "|logprob rollout - train|")
    body.append('<polyline class="clean-level" fill="none" stroke="#2e7d32" stroke-dasharray="5,3" points="'
                + " ".join(f"{x:.1f},{ax.y(num(v))}" for x, v in zip(xs, levels)) + '"/>')
    body.append('<polyline class="diff" fill="none" stroke="#1565c0" points="'
                + " ".join(f"{x:.1f},{ax.y(num(v))}" for x, v in zip(xs, vals)) + '"/>')
    # Every dot one colour: the dashed bound is a note, not the noise verdict (the root-cause skill
    # judges the tokens against the measured noise band and says so beside this chart).
    for i, (x, v, c) in enumerate(zip(xs, vals, levels)):
        pos = first + i * bucket
        body.append(f'<circle class="token" cx="{x:.1f}" cy="{ax.y(num(v))}" r="3" fill="#1565c0"><title>position '
                    f'{pos}{"-" + str(pos + bucket - 1) if bucket > 1 else ""}: |diff| {fmt(v)}, analytic bound '
                    f'{fmt(c)}</title></circle>')
    marks = [(lp["prompt_tokens"], "response starts", "#555")] if lp.get("prompt_tokens") else []
    for k, (pos, label, colour) in enumerate(marks):
        x = left + ((pos - first) / bucket + 0.5) * w / len(vals)
        body.append(f'<g class="mark position"><line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + h}" '
                    f'stroke="{colour}" stroke-dasharray="2,2"/><text x="{x + 3:.1f}" y="{top + 12 + 14 * k}" '
                    f'font-size="11" fill="{colour}">{text(label)} ({pos})</text></g>')
    for i in range(0, len(vals), max(1, len(vals) // 10)):
        body.append(f'<text x="{xs[i]:.1f}" y="{top + h + 16}" font-size="10" text-anchor="middle">'
                    f'{first + i * bucket}</text>')
    body.append(f'<text x="{left + w / 2}" y="{top + h + 34}" font-size="11" text-anchor="middle">token position'
                f'{f" (max over {bucket} tokens per point)" if bucket > 1 else ""}</text>')
    svg = _svg(left + w + 20, top + h + 44, "chart logprob", body)
    rows = [("positions compared", lp.get("positions")), ("mean |diff|", fmt(lp.get("mean_abs_diff"))),
            ("max |diff|", f"{fmt(lp.get('max_abs_diff'))} at position {lp.get('max_at_position')}"),
            ("analytic bound (median / max)", f"{fmt(lp.get('clean_level_median'))} / {fmt(lp.get('clean_level_max'))}"),
            ("first half / second half mean |diff|",
             f"{fmt(lp.get('first_half_mean_abs_diff'))} / {fmt(lp.get('second_half_mean_abs_diff'))}"),
            ("sum of log-prob differences (sequence)", fmt(lp.get("sequence_logprob_diff")))]
    if lp.get("prompt_tokens"):
        rows.append(("prompt / response mean |diff|",
                     f"{fmt(lp.get('prompt_mean_abs_diff'))} / {fmt(lp.get('response_mean_abs_diff'))}"))
    else:
        rows.append(("prompt / response", "not known (the dump does not separate prefill and decode calls)"))
    return ('<p>Log-probability each side gives to the dumped next token, from its logits. The dashed line is '
            'the analytic bound: the largest change logits within their dtype\'s element tolerance could cause, '
            'a worst case shown as a note. Whether the differences are precision noise is judged against the '
            'noise band measured on real engines (the root-cause skill\'s log-prob verdict).</p>'
            + _figure(svg) + _table(("", "value"), rows) + _token_table(full.get("tokens") or []))


# A page stays readable: the first tokens are listed, output_3 holds them all.
TOKEN_ROWS = 200


def _token_table(tokens: list[dict]) -> str:
    """One row per response token: both log-probs of the sampled token and their difference, with a
    bar of |train - rollout| scaled to the largest one."""
    if not tokens:
        return ""
    finite = [abs(d) for d in (num(t.get("delta")) for t in tokens) if d is not None and math.isfinite(d)]
    largest = max(finite, default=0.0) or 1.0
    rows = []
    for t in tokens[:TOKEN_ROWS]:
        d = num(t.get("delta"))
        width = 80 * abs(d) / largest if d is not None and math.isfinite(d) else 0.0
        bar = (f'<svg xmlns="http://www.w3.org/2000/svg" class="token-delta" width="84" height="10"><rect x="0" y="1" width="{width:.1f}" height="8" fill="#1565c0"/>'
               '</svg>')
        # The chart above and the max |diff| line count a token at its own position; output_3's
        # ``position`` is the logits row that scores it, one before.
        pos = t.get("position")
        # Seven digits: two log-probs that agree to 1e-6 still read as two numbers.
        rows.append((pos + 1 if isinstance(pos, int) else pos, t.get("token_id"), _digits(t.get("train")), _digits(t.get("rollout")),
                     fmt(d), bar))
    more = f" (the first {TOKEN_ROWS} of {len(tokens)})" if len(tokens) > TOKEN_ROWS else ""
    return (f"<p>Per response token{more}: the log-probability of the sampled token at that position, the raw "
            "log-softmax of the logits row before it on each side, before any temperature (both dumps hold "
            "the logits before it).</p>"
            + _table(("token position", "token id", "train", "rollout", "train - rollout", "|train - rollout|"),
                     [tuple(text(v) for v in r[:5]) + (r[5],) for r in rows], escaped=True))


def _logits_stats(lp: dict) -> str:
    se = lp.get("stat_errors") or {}
    names = [k for k in STAT_WORDS if num(se.get(k)) is not None]
    tol = num(lp.get("tolerance"))
    left, top, h, bw = 70, 30, 200, 70
    values = [abs(num(se[k])) for k in names]
    ax = Axis(*_span(values, [tol]), top, top + h)
    body = ax.draw(left, left + bw * max(1, len(names)), "relative difference")
    for i, (k, v) in enumerate(zip(names, values)):
        bad = tol is not None and v > tol
        y = ax.y(v)
        body.append(f'<rect class="bar {"past" if bad else "within"}" x="{left + i * bw + 12}" y="{y}" '
                    f'width="{bw - 24}" height="{max(0.5, top + h - y):.1f}" fill="{"#c62828" if bad else "#2e7d32"}">'
                    f'<title>{STAT_WORDS[k]}: {fmt(v)}</title></rect>'
                    f'<text x="{left + i * bw + bw / 2}" y="{top + h + 16}" font-size="11" '
                    f'text-anchor="middle">{STAT_WORDS[k]}</text>')
    if tol is not None:
        y = ax.y(tol)
        body.append(f'<g class="tolerance"><line x1="{left}" x2="{left + bw * len(names)}" y1="{y}" y2="{y}" '
                    f'stroke="#2e7d32" stroke-dasharray="5,3"/><text x="{left + bw * len(names) + 4}" y="{y + 4}" '
                    f'font-size="11">tolerance {fmt(tol)}</text></g>')
    svg = _svg(left + bw * max(1, len(names)) + 120, top + h + 30, "chart logits-statistics", body)
    if lp.get("status") == "incomparable":
        why = ("" if lp.get("mode") != "statistics"
               else "Statistics mode: the dump holds no tensors, so per-token log-probs cannot be computed. ")
        return (f"<p>{why}The logits ({text(lp.get('point'))}) were not compared: {text(lp.get('reason'))}.</p>")
    why = ("Statistics mode: the dump holds no tensors, so per-token log-probs cannot be computed. "
           if lp.get("mode", "statistics") == "statistics" else
           "The logits could not be turned into per-token log-probs; their statistics were compared. ")
    return (f"<p>{why}"
            f"The logits ({text(lp.get('point'))}) differ by {fmt(lp.get('error'))} against a tolerance of "
            f"{fmt(lp.get('tolerance'))} for {text(' / '.join(str(d) for d in lp.get('dtypes') or []))} "
            f"(status {text(lp.get('status'))}, {fmt(lp.get('margin'))} times the tolerance).</p>" + _figure(svg))


# -- the divergence along execution order ---------------------------------------------------------

@dataclass(slots=True)
class _Item:
    """One compared output point of the execution chart (a page of many modules holds tens of
    thousands: slots, not dicts)."""
    cid: str
    point: str
    module: str
    rollout: str
    status: str
    error: float | None
    tol: float | None
    strict: float | None
    structural_clean: bool


def _items(compare: dict, analysis: dict) -> tuple[list[_Item], dict]:
    """One item per compared output point in execution order; pid -> index of its first item."""
    results = {r["cid"]: r for r in compare.get("results", [])}
    # The statuses that agree: output_4 ``vocabulary.statuses.clean`` (none for an output_4 without it).
    clean = ((analysis.get("vocabulary") or {}).get("statuses") or {}).get("clean") or ()
    items, seen, where = [], {}, {}
    for m in analysis.get("modules", []):
        for p in m["points"]["out"]:
            r = results.get(p.get("cid"))
            if r is None:
                continue
            if p["point"] in seen:
                where.setdefault(m["pid"], seen[p["point"]])
                continue
            seen[p["point"]] = len(items)
            where.setdefault(m["pid"], len(items))
            items.append(_Item(r["cid"], p["point"], (m["train_modules"] or m["rollout_modules"] or ["?"])[0],
                               ", ".join(m["rollout_modules"]), r["status"], num(r.get("error")),
                               num(r.get("tolerance")), num(r.get("strict_tolerance")),
                               m["kind"] in FUSED_KINDS and r["status"] in clean))
    return items, where


def _short(name: str, limit: int = 38) -> str:
    name = name.removeprefix("model.")
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def _marks(analysis: dict, root: dict | None, where: dict, merge: bool = False) -> list[tuple[int, str, str, str]]:
    """(item index, label, class, colour) of the first divergence and of each root cause whose
    module has a compared output. With ``merge``, the root causes at one output are one mark: a
    run of many calls has a root cause per call at the same point, and ten labels on one line
    cannot be read."""
    fd = analysis.get("first_divergence") or {}
    marks = []
    if fd.get("pair") in where:
        marks.append((where[fd["pair"]], "first divergence", "first-divergence", "#6a1b9a"))
    causes: list[tuple[int, list]] = []
    for c in (root or {}).get("root_causes", []):
        ev = c.get("evidence") or {}
        pid = ev.get("finding_pair") or (ev.get("suspect_pair") or {}).get("pair") or ev.get("pair")
        if pid in where:
            causes.append((where[pid], [c.get("rank")]))
    if merge:
        at: dict[int, list] = {}
        for k, ranks in causes:
            at.setdefault(k, []).extend(ranks)
        causes = list(at.items())
    return marks + [(k, f"root cause {ranks[0]}" if len(ranks) == 1 else
                     f"root causes {', '.join(str(r) for r in ranks)}", "root-cause", "#c62828") for k, ranks in causes]


def _window(count: int, marks: list[tuple[int, str, str, str]], analysis: dict) -> tuple[range, str]:
    """The items drawn one by one and what they are drawn around: the first mark (the first
    divergence, else the first root cause), else the start of the run."""
    if not marks:
        why = "the first divergence has no compared output" if analysis.get("first_divergence") else "nothing diverged"
        return _WIN.window(count, None), f"from the start ({why})"
    k, label, cls, _colour = marks[0]
    return _WIN.window(count, k), f"around the {label}" if cls == "first-divergence" else f"around {label}"


def _drawn_sentence(win: range, count: int, around: str) -> str:
    """What a chart of many outputs draws, so that nothing reads as silently dropped."""
    return (f"<p class=\"drawn\"><b>{len(win)} of {count} compared outputs drawn</b> one by one "
            f"(outputs {win.start + 1}-{win.stop} in execution order) {around}; all of them are in "
            "output_3_value_compare.csv.</p>")


def execution_section(compare: dict, analysis: dict, root: dict | None) -> Iterator[str]:
    """Error of every compared output against its tolerance, in execution order, with the marks:
    the section's HTML in pieces (a point and its label each), so that a chart of many modules is
    written as it is drawn and never held whole. Past chartwindow.LIMIT outputs, an overview of the
    whole run in bins, then the window around the first divergence drawn one by one."""
    items, where = _items(compare, analysis)
    head = "<h2>2. Divergence along execution order</h2>"
    if not items:
        yield head + "<p>No module output was compared.</p>"
        return
    marks = _marks(analysis, root, where, merge=len(items) > _WIN.LIMIT)
    how = ("in execution order (train side names; hover a point for both sides). Errors above the dashed "
           "line are beyond tolerance.</p>")
    win, around = _window(len(items), marks, analysis)
    if len(win) < len(items):
        diverged = ((analysis.get("vocabulary") or {}).get("statuses") or {}).get("diverged") or ()
        yield (head + _drawn_sentence(win, len(items), around) + _overview(items, marks, win, diverged)
               + f"<h3>Outputs {win.start + 1}-{win.stop}, one by one</h3><p>Each compared module output " + how)
        items = items[win.start:win.stop]
        marks = [(k - win.start, *rest) for k, *rest in marks if k in win]
    else:
        yield head + "<p>Every compared module output " + how
    yield from _execution_chart(items, marks)
    yield "</svg></div>" + layer_section(compare, point_forms(analysis))


def _execution_chart(items: list[_Item], marks: list[tuple[int, str, str, str]]) -> Iterator[str]:
    """The legend and the chart of ``items`` one by one, up to its last element (the caller closes
    the svg and its figure)."""
    longest = max(len(_short(i.module)) + len(i.point) + 3 for i in items)
    # The labels are rotated 60 degrees and end at their point: the first ones reach left of the
    # plot by about half their length, so the margin grows with the longest label.
    left, top, h, step = max(70, round(LABEL_CHAR * longest / 2) + 12), 60, 280, 16
    w = step * len(items)
    ax = Axis(*_span([i.error for i in items], [i.tol for i in items]), top, top + h)
    x = [left + (k + 0.5) * step for k in range(len(items))]
    label_room = 16 + LABEL_CHAR * 0.9 * longest
    yield (_execution_legend(items, ax)
           + '<div class="figure">' + _svg_open(left + w + 160, top + h + label_room, "chart execution"))
    yield from ax.draw(left, left + w, "error (log scale)")
    # Tolerance band: strict..pair tolerance is the drift zone, above the pair tolerance is beyond.
    for k, it in enumerate(items):
        if it.tol is None:
            continue
        yt, ys = ax.y(it.tol), ax.y(it.strict or it.tol)
        yield (f'<rect class="band drift-zone" x="{x[k] - step / 2:.1f}" y="{yt}" width="{step}" '
               f'height="{max(0.0, ys - yt):.1f}" fill="#fff3cd"/>')
    yield ('<polyline class="tolerance" fill="none" stroke="#2e7d32" stroke-dasharray="5,3" points="'
           + " ".join(f"{x[k]:.1f},{ax.y(it.tol)}" for k, it in enumerate(items) if it.tol is not None)
           + '"/>')
    for k, it in enumerate(items):
        cls = STATUS_CLASS.get(it.status, "other")
        colour = COLOURS[cls]
        tip = (f"<title>{text(it.point)}: {text(it.module)} (train) / {text(it.rollout)} (rollout); "
               f"{text(it.status)}, error {fmt(it.error)}, tolerance {fmt(it.tol)}"
               f"{'; structural pair, values agree' if it.structural_clean else ''}</title>")
        y = ax.y(it.error) if it.error is not None else top + h
        if it.structural_clean:
            dot = (f'<circle class="pt {cls} structural-clean" cx="{x[k]:.1f}" cy="{y}" r="4.5" fill="white" '
                   f'stroke="{colour}" stroke-width="2">{tip}</circle>')
        elif it.error is None:
            dot = f'<rect class="pt {cls}" x="{x[k] - 4:.1f}" y="{y - 8}" width="8" height="8" fill="{colour}">{tip}</rect>'
        else:
            dot = f'<circle class="pt {cls}" cx="{x[k]:.1f}" cy="{y}" r="4" fill="{colour}">{tip}</circle>'
        yield (dot + f'<text class="module-label" font-size="9" text-anchor="end" '
               f'transform="translate({x[k] + 3:.1f},{top + h + 8}) rotate(-60)">{text(_short(it.module))}'
               f' · {text(it.point)}</text>')
    for n, (k, label, cls, colour) in enumerate(marks):
        y = top - 8 - 14 * (n % 3)
        yield (f'<g class="mark {cls}"><line x1="{x[k]:.1f}" x2="{x[k]:.1f}" y1="{y + 2}" y2="{top + h}" '
               f'stroke="{colour}" stroke-dasharray="3,2"/><circle cx="{x[k]:.1f}" cy="{ax.y(items[k].error)}"'
               f' r="8" fill="none" stroke="{colour}" stroke-width="2"/><text x="{x[k] + 4:.1f}" y="{y}" '
               f'font-size="11" fill="{colour}">{text(label)}: {text(items[k].point)}</text></g>')


def _ratio(it: _Item) -> float | None:
    """Error over tolerance; a non-finite error or one over a zero tolerance is infinitely far."""
    if it.error is None or it.tol is None:
        return None
    if math.isnan(it.error) or it.tol <= 0:
        return math.inf if it.error != 0 else 0.0
    return it.error / it.tol


@dataclass(slots=True)
class _Bin:
    """One bar of the overview: consecutive items, their worst status and worst error ratio."""
    first: int
    last: int
    status: str | None = None
    ratio: float | None = None
    at: str = ""
    diverged: int = 0


def _bins(items: list[_Item], diverged: tuple | list) -> list[_Bin]:
    """The overview's bars (chartwindow.bin_of) with what each shows; ``diverged``: output_4
    ``vocabulary.statuses.diverged``, the statuses counted in a bar's tooltip."""
    out: list[_Bin] = []
    for k, it in enumerate(items):
        b = _WIN.bin_of(k, len(items))
        if b == len(out):
            out.append(_Bin(k, k))
        cur = out[b]
        cur.last = k
        cur.status = _WIN.worse(cur.status, it.status)
        cur.diverged += it.status in diverged
        r = _ratio(it)
        if r is not None and (cur.ratio is None or r > cur.ratio):
            cur.ratio, cur.at = r, it.point
    return out


def _overview(items: list[_Item], marks: list[tuple[int, str, str, str]], win: range, diverged) -> str:
    """The whole run in bars of consecutive outputs, each its worst status and its worst error over
    tolerance, with the marks in their bars and the window drawn one by one shaded."""
    bins = _bins(items, diverged)
    left, top, h, width = 70, 74, 160, _WIN.WIDTH
    bw = width / len(bins)
    ax = Axis(*_span([b.ratio for b in bins], [1.0]), top, top + h)
    x0 = lambda b: left + b * bw      # noqa: E731
    body = [_window_band(win, len(items), x0, top, h), *ax.draw(left, left + width, "worst error / tolerance")]
    yt = ax.y(1.0)
    body.append(f'<line class="tolerance" x1="{left}" x2="{left + width}" y1="{yt}" y2="{yt}" stroke="#2e7d32" '
                f'stroke-dasharray="5,3"/>')
    for b, bn in enumerate(bins):
        colour = COLOURS[STATUS_CLASS.get(bn.status, "other")]
        tip = (f"<title>outputs {bn.first + 1}-{bn.last + 1} ({text(items[bn.first].point)} to "
               f"{text(items[bn.last].point)}): worst {text(bn.status)}, {bn.diverged} diverged"
               + (f"; worst error / tolerance {fmt(bn.ratio)} at {text(bn.at)}" if bn.ratio is not None else "")
               + "</title>")
        cls = f"bin {STATUS_CLASS.get(bn.status, 'other')}"
        if bn.ratio is None:
            body.append(f'<rect class="{cls}" x="{x0(b):.1f}" y="{top + h - 6}" width="{max(1.0, bw - 1):.1f}" '
                        f'height="6" fill="{colour}">{tip}</rect>')
        else:
            # Axis draws an infinite error at 1e3; a non-finite output is the worst of the run.
            y = top if math.isinf(bn.ratio) else ax.y(bn.ratio)
            body.append(f'<rect class="{cls}" x="{x0(b):.1f}" y="{y}" width="{max(1.0, bw - 1):.1f}" '
                        f'height="{max(1.0, top + h - y):.1f}" fill="{colour}">{tip}</rect>')
    for n, (k, label, cls, colour) in enumerate(marks):
        # Above the axis title; a mark in the right half is labelled to its left, inside the chart.
        xm, y = x0(_WIN.bin_of(k, len(items))) + bw / 2, top - 22 - 14 * (n % 3)
        tx, anchor = (xm - 4, "end") if xm > left + width / 2 else (xm + 4, "start")
        body.append(f'<g class="mark {cls}"><line x1="{xm:.1f}" x2="{xm:.1f}" y1="{y + 2}" y2="{top + h}" '
                    f'stroke="{colour}" stroke-dasharray="3,2"/><text x="{tx:.1f}" y="{y}" font-size="11" '
                    f'fill="{colour}" text-anchor="{anchor}">{text(label)}: {text(items[k].point)} '
                    f'(output {k + 1})</text></g>')
    for b in range(0, len(bins), max(1, len(bins) // 10)):
        body.append(f'<text x="{x0(b):.1f}" y="{top + h + 14}" font-size="10">{bins[b].first + 1}</text>')
    per = len(items) / len(bins)
    body.append(f'<text x="{left + width / 2}" y="{top + h + 32}" font-size="11" text-anchor="middle">compared outputs '
                f'in execution order, {per:.3g} per bar on average (each bar the worst of its outputs)</text>')
    statuses = [s for s in _WIN.SHOWN_FIRST if any(bn.status == s for bn in bins)]
    legend = ('<p class="legend">Overview of the whole run: ' + " ".join(
        f'<span style="color:{COLOURS[STATUS_CLASS.get(s, "other")]}">&#9646; {s}</span>' for s in statuses)
        + ' <span style="background:#e3f2fd">drawn one by one below</span>'
        ' <span style="color:#2e7d32">- - tolerance</span></p>')
    return legend + _figure(_svg(left + width + 20, top + h + 44, "chart execution-overview", body))


def _execution_legend(items: list[_Item], ax: Axis) -> str:
    """A legend entry only for what the execution chart draws."""
    dots = {it.status for it in items if not it.structural_clean and it.error is not None}
    squares = {it.status for it in items if not it.structural_clean and it.error is None}
    order = ("match", "drift", "mismatch", "nonfinite", "bounded", "structural", "incomparable")
    words = {"bounded": "bounded (consistent, not verified)"}
    entries = [f'<span style="color:{COLOURS[STATUS_CLASS.get(s, "other")]}">&#9679; {words.get(s, s)}</span>'
               for s in order if s in dots]
    entries += [f'<span style="color:{COLOURS[STATUS_CLASS.get(s, "other")]}">&#9632; {s}, no error value</span>'
                for s in order if s in squares]
    if any(it.structural_clean for it in items):
        entries.append("<span>&#9675; structural pair (fused/by-design), values agree</span>")
    # The band is drawn where the strict tolerance lies below the pair's.
    if any(ax.y(it.strict or it.tol) - ax.y(it.tol) > 0 for it in items if it.tol is not None):
        entries.append('<span style="background:#fff3cd">drift zone</span>')
    if any(it.tol is not None for it in items):
        entries.append('<span style="color:#2e7d32">- - tolerance</span>')
    return '<p class="legend">' + " ".join(entries) + "</p>"


REF_LINES = (("train vs rollout", None, "#455a64", ""), ("train vs reference", "train", "#1565c0", "6,3"),
             ("rollout vs reference", "rollout", "#ef6c00", "2,2"))


def reference_section(compare: dict, analysis: dict, root: dict | None = None) -> str:
    """Three error lines along execution order: train vs reference, rollout vs reference, train vs
    rollout; then the tokens the reference ran, each side's departure and the simulated faults.
    Past chartwindow.LIMIT outputs, the three lines in bins, then the window of section 2."""
    rf = compare.get("reference_forward")
    head = "<h2>Reference forward: each side against the checkpoint</h2>"
    if not rf:
        return ""
    if not rf.get("ran"):
        return head + f"<p>The reference forward did not run: {text(rf.get('reason'))}</p>"
    items, where = _items(compare, analysis)
    pts = rf.get("points") or {}
    lines = [[it.error if side is None else num((pts.get(it.cid, {}).get(side) or {}).get("error"))
              for it in items] for _label, side, _c, _d in REF_LINES]
    win, around = _window(len(items), _marks(analysis, root, where), analysis)
    drawn = ""
    if len(win) < len(items):
        drawn = _drawn_sentence(win, len(items), around) + _ref_overview(lines, win)
        items, lines = items[win.start:win.stop], [ln[win.start:win.stop] for ln in lines]
    left, top, h, step = 70, 30, 240, 16
    w = step * max(1, len(items))
    ax = Axis(*_span([v for ln in lines for v in ln], [it.tol for it in items]), top, top + h)
    body = ax.draw(left, left + w, "error (log scale)")
    x = [left + (k + 0.5) * step for k in range(len(items))]
    for (label, side, colour, dash), ln in zip(REF_LINES, lines):
        coords = " ".join(f"{x[k]:.1f},{ax.y(v)}" for k, v in enumerate(ln) if v is not None)
        body.append(f'<polyline class="ref-line {text(side or "pair")}" fill="none" stroke="{colour}" '
                    f'stroke-width="2" stroke-dasharray="{dash}" points="{coords}"><title>{text(label)}</title></polyline>')
        for k, v in enumerate(ln):
            if v is not None:
                body.append(f'<circle cx="{x[k]:.1f}" cy="{ax.y(v)}" r="2.5" fill="{colour}"><title>{text(label)}: '
                            f'{text(items[k].point)} error {fmt(v)}</title></circle>')
    for k, it in enumerate(items):
        body.append(f'<text font-size="9" text-anchor="end" transform="translate({x[k] + 3:.1f},{top + h + 8}) '
                    f'rotate(-60)">{text(it.point)}</text>')
    svg = _svg(left + w + 40, top + h + 90, "chart reference", body)
    legend = ('<p class="legend">' + " ".join(f'<span style="color:{c}">&#9473; {text(lab)}</span>'
                                              for (lab, _s, c, _d), ln in zip(REF_LINES, lines)
                                              if any(v is not None for v in ln)) + "</p>")
    rows = []
    for side in ("train", "rollout"):
        sd, tok = (rf.get("sides") or {}).get(side) or {}, (rf.get("tokens") or {}).get(side) or {}
        dep = sd.get("departure")
        where = (f"departs at {dep['point']} (error {fmt(dep['error'])}, tolerance {fmt(dep['tolerance'])})"
                 if dep else "matches everywhere" if sd.get("ran") else str(sd.get("reason")))
        rows.append((side, f"{tok.get('how')}: {tok.get('detail')}",
                     f"{sd.get('matching', '-')}/{sd.get('points', '-')}", where))
    verdict = rf.get("verdict") or {}
    hyp = "".join(f"<li>{text(hy['side'])} at {text(hy['point'])}: "
                  + (f"reproduced by {text(', '.join(hy['reproduced_by']))}" if hy["reproduced_by"] else
                     f"no candidate reproduces it ({len(hy['candidates'])} ruled out; closest "
                     f"{text(hy['candidates'][0]['candidate'])}, residual {fmt(hy['candidates'][0]['residual'])})"
                     if hy["candidates"] else "no candidate tried") + "</li>"
                  for hy in rf.get("hypotheses") or [])
    return (head + f"<p>Verdict: <b>{text(verdict.get('side'))}</b>: {text(verdict.get('reason'))}</p>" + drawn
            + legend + _figure(svg) + _table(("side", "tokens", "points matching", "first departure"), rows)
            + (f"<p>Faults simulated in the reference:</p><ul>{hyp}</ul>" if hyp else ""))


def _window_band(win: range, count: int, x0, top: float, h: float) -> str:
    """The shaded bars of an overview (``x0``: a bar's left edge) that the window draws one by one."""
    a, b = x0(_WIN.bin_of(win.start, count)), x0(_WIN.bin_of(win.stop - 1, count) + 1)
    return (f'<rect class="window" x="{a:.1f}" y="{top}" width="{b - a:.1f}" height="{h}" fill="#e3f2fd">'
            f'<title>outputs {win.start + 1}-{win.stop}: drawn one by one below</title></rect>')


def _ref_overview(lines: list[list[float | None]], win: range) -> str:
    """The reference chart's three lines over the whole run, each bar of consecutive outputs drawn
    at its largest error (chartwindow's bars), with the window drawn one by one shaded."""
    count = len(lines[0])
    worst: list[list[float | None]] = [[None] * _WIN.bin_count(count) for _ in lines]
    for ln, out in zip(lines, worst):
        for k, v in enumerate(ln):
            b = _WIN.bin_of(k, count)
            if v is not None and (out[b] is None or _log(v) > _log(out[b])):
                out[b] = v
    left, top, h, width = 70, 30, 160, _WIN.WIDTH
    bw = width / len(worst[0])
    ax = Axis(*_span([v for ln in worst for v in ln]), top, top + h)
    body = [_window_band(win, count, lambda b: left + b * bw, top, h),
            *ax.draw(left, left + width, "largest error (log scale)")]
    for (label, side, colour, dash), ln in zip(REF_LINES, worst):
        coords = " ".join(f"{left + (b + 0.5) * bw:.1f},{ax.y(v)}" for b, v in enumerate(ln) if v is not None)
        body.append(f'<polyline class="ref-line {text(side or "pair")}" fill="none" stroke="{colour}" '
                    f'stroke-width="2" stroke-dasharray="{dash}" points="{coords}"><title>{text(label)}</title></polyline>')
    body.append(f'<text x="{left + width / 2}" y="{top + h + 20}" font-size="11" text-anchor="middle">compared '
                f'outputs 1-{count} in execution order, {count / len(worst[0]):.3g} per point on average (the '
                f'largest error of each)</text>')
    return _figure(_svg(left + width + 20, top + h + 32, "chart reference-overview", body))


def point_forms(analysis: dict) -> dict:
    """output_4 ``vocabulary.points``: the parsed form of each point name (the compare skill's
    points.form; this file parses no names itself). Empty for an output_4 without it."""
    return (analysis.get("vocabulary") or {}).get("points") or {}


def _group(form: dict | None) -> tuple[int, str] | None:
    """(layer, attention|mlp|norms) of a layer's activation point from its published form: every
    part in the same layer, none a parameter or a later call; a fused point counts by its first part."""
    if not form:
        return None
    parts = form["parts"]
    first = parts[0]
    if any(p["scope"] != "layer" or p["layer"] != first["layer"] or p["parameter"] or p["call"] is not None
           for p in parts):
        return None
    for name, members in GROUPS:
        if first["name"] in members:
            return first["layer"], name
    return None


def layer_section(compare: dict, forms: dict) -> str:
    """Per layer, the worst error in attention, MLP and norm outputs (``forms``: point_forms)."""
    worst: dict[int, dict[str, tuple[float, float | None]]] = {}
    for r in compare.get("results", []):
        g = _group(forms.get(r["point"])) if r.get("pair") is None else None
        e = num(r.get("error"))
        if g is None or e is None:
            continue
        layer, name = g
        cur = worst.setdefault(layer, {}).get(name)
        if cur is None or _log(e) > _log(cur[0]):
            worst[layer][name] = (e, num(r.get("tolerance")))
    if not worst:
        return ""
    layers = sorted(worst)
    left, top, h, gw = 70, 30, 200, 66
    vals = [v[0] for d in worst.values() for v in d.values()]
    tols = [v[1] for d in worst.values() for v in d.values()]
    ax = Axis(*_span(vals, tols), top, top + h)
    body = ax.draw(left, left + gw * len(layers), "worst error per layer")
    for i, layer in enumerate(layers):
        for j, (name, _) in enumerate(GROUPS):
            if name not in worst[layer]:
                continue
            e, tol = worst[layer][name]
            y = ax.y(e)
            bx = left + i * gw + 8 + j * 17
            body.append(f'<rect class="bar {name}" x="{bx}" y="{y}" width="15" height="{max(0.5, top + h - y):.1f}" '
                        f'fill="{GROUP_COLOURS[name]}"><title>layer {layer} {name}: worst error {fmt(e)}, '
                        f'tolerance {fmt(tol)}</title></rect>')
            if tol is not None:
                yt = ax.y(tol)
                body.append(f'<line class="tolerance" x1="{bx - 1}" x2="{bx + 16}" y1="{yt}" y2="{yt}" '
                            f'stroke="#2e7d32" stroke-width="2"/>')
        body.append(f'<text x="{left + i * gw + gw / 2}" y="{top + h + 16}" font-size="11" '
                    f'text-anchor="middle">L{layer}</text>')
    svg = _svg(left + gw * len(layers) + 20, top + h + 30, "chart layers", body)
    present = {name for d in worst.values() for name in d}
    legend = ('<p class="legend">' + " ".join(f'<span style="color:{GROUP_COLOURS[n]}">&#9632; {n}</span>'
                                              for n, _ in GROUPS if n in present) + ' <span style="color:#2e7d32">&#8212; tolerance</span></p>')
    return "<h3>Worst error per layer: attention, MLP, norms</h3>" + legend + _figure(svg)


# -- token x layer heatmap ------------------------------------------------------------------------

def heatmap_section(compare: dict) -> str:
    """Tensor mode: the per-token relative error of each layer's output, coloured against its tolerance."""
    rows = [r for r in compare.get("results", []) if r.get("pair") is None
            and ((r.get("tensor_metrics") or {}).get("per_token") or {}).get("values")]
    head = "<h2>3. Token x layer error</h2>"
    if not rows:
        return head + ("<p>Statistics mode: per-token errors need a tensor dump.</p>"
                       if compare.get("mode") != "tensor" else "<p>No per-token errors were recorded.</p>")
    drawn = ""
    if len(rows) > _WIN.LIMIT:
        # A row per compared layer output (and call): a run of many is drawn, like the execution
        # chart, around where it matters, the first row with a token beyond its tolerance.
        anchor = next((i for i, r in enumerate(rows) if _beyond(r)), None)
        win = _WIN.window(len(rows), anchor)
        around = ("from the start (no token beyond its tolerance)" if anchor is None
                  else "around the first with a token beyond its tolerance")
        drawn = (f"<p class=\"drawn\"><b>{len(win)} of {len(rows)} layer outputs drawn</b> (rows {win.start + 1}-"
                 f"{win.stop} in execution order) {around}; every row's per-token errors are in "
                 "output_3_value_compare.json (<code>tensor_metrics.per_token</code>).</p>")
        rows = rows[win.start:win.stop]
    ncol = max(len(r["tensor_metrics"]["per_token"]["values"]) for r in rows)
    cell, row = max(4, min(22, 900 // max(1, ncol))), 16
    left, top = 150, 20
    body = []
    for i, r in enumerate(rows):
        pt = r["tensor_metrics"]["per_token"]
        tol = num(r.get("tolerance")) or 1.0
        for j, v in enumerate(pt["values"]):
            ratio = (num(v) or 0.0) / tol
            body.append(f'<rect class="cell" x="{left + j * cell}" y="{top + i * row}" width="{cell}" '
                        f'height="{row}" fill="{_heat(ratio)}"><title>{text(r["point"])}, token '
                        f'{j * pt["bucket"]}: error {fmt(v)} ({fmt(ratio)} x tolerance)</title></rect>')
        body.append(f'<text x="{left - 6}" y="{top + i * row + row * 0.75:.1f}" font-size="10" '
                    f'text-anchor="end">{text(r["point"])}</text>')
    bucket = rows[0]["tensor_metrics"]["per_token"]["bucket"]
    for j in range(0, ncol, max(1, ncol // 12)):
        body.append(f'<text x="{left + j * cell + cell / 2}" y="{top + len(rows) * row + 14}" font-size="10" '
                    f'text-anchor="middle">{j * bucket}</text>')
    body.append(f'<text x="{left + ncol * cell / 2}" y="{top + len(rows) * row + 30}" font-size="11" '
                f'text-anchor="middle">token</text>')
    svg = _svg(left + ncol * cell + 20, top + len(rows) * row + 40, "chart heatmap", body)
    scale = " ".join(f'<span style="background:{_heat(x)};padding:0 6px">{lab}</span>' for x, lab in
                     ((0.01, "≤0.01"), (0.5, "0.5"), (1.0, "1 = tolerance"), (10, "10"), (1000, "≥1000")))
    return (head + drawn + "<p>Relative L2 error of each token's row, as a multiple of the tolerance "
            "(green within, red beyond).</p><p class=\"legend\">" + scale + "</p>" + _figure(svg))


def _beyond(result: dict) -> bool:
    """Whether a heat-map row holds a token beyond its tolerance (a non-finite error is; a missing
    one is drawn as no error)."""
    tol = num(result.get("tolerance")) or 1.0
    return any((n := num(v)) is not None and not n <= tol for v in result["tensor_metrics"]["per_token"]["values"])


def _heat(ratio: float) -> str:
    """Green shades up to the tolerance, orange to red beyond it (log scale, saturating at 1000x)."""
    if math.isnan(ratio):
        return "#6a1b9a"
    if ratio <= 1:
        f = max(0.0, min(1.0, (math.log10(max(ratio, 1e-3)) + 3) / 3))
        return f"rgb({int(232 - 60 * f)},{int(245 - 20 * f)},{int(233 - 80 * f)})"
    f = max(0.0, min(1.0, math.log10(ratio) / 3))
    return f"rgb({int(255 - 57 * f)},{int(183 - 143 * f)},{int(77 - 37 * f)})"


# -- the answer (root-cause skill) ------------------------------------------------------------------

ERROR_WORDS = {
    "statistics": "the largest relative difference between the two sides' Max, Min, Mean and Norm of the "
                  "tensor (statistics mode: the dump holds four numbers per tensor, not the tensor)",
    "tensor": "the relative L2 distance between the two sides' tensors, |rollout - train| / |train| "
              "(tensor mode), or for a tensor read as statistics only, the largest relative difference of "
              "its Max, Min, Mean and Norm",
}


def _command(cmd) -> str:
    return f"<pre class=\"command\">{text(shlex.join(str(a) for a in cmd))}</pre>" if cmd else ""


def answer_section(root: dict | None, mode: str | None) -> str:
    """First on the page: notes on the inputs, the verdict, root cause, side, confidence and the
    next checks with their commands; then what "error" means in this page."""
    defs = (f"<p class=\"defs\"><b>error</b> in this page: {text(ERROR_WORDS.get(mode or 'statistics'))}. "
            "<b>tolerance</b>: the error a clean pair of these dtypes may show; above it a tensor is beyond "
            "tolerance.</p>")
    if root is None or not root.get("answer"):
        return defs
    a = root["answer"]
    out = ["<h2>Answer</h2>"]
    out += [f"<p class=\"note input-note\"><b>Check the inputs:</b> {text(n)}</p>" for n in a.get("input_notes") or []]
    if a.get("nothing_compared"):
        out.append(f"<p class=\"note nothing-compared\"><b>Nothing was compared</b>: "
                   f"{text(a['nothing_compared'])}. This is not an all-clear.</p>")
    out.append(f"<p class=\"verdict\"><b>Verdict:</b> {text(a.get('verdict'))}</p>")
    rc = a.get("root_cause")
    if rc:
        where = f"{rc.get('where')}, layer {rc.get('layer')}" + (f", {rc['when']}" if rc.get("when") else "")
        out.append("<table class=\"answer\">" + "".join(
            f"<tr><th>{label}</th><td>{text(v)}</td></tr>" for label, v in (
                ("root cause", rc.get("what")), ("where", where),
                ("side", rc.get("side")), ("why this side", rc.get("why_this_side")),
                ("confidence", rc.get("confidence")))) + "</table>")
    checks = a.get("next_checks") or []
    if checks:
        out.append(f"<p class=\"next-check\"><b>Next check:</b> {text(checks[0].get('check'))}</p>"
                   + _command(checks[0].get("command")))
    side = a.get("decide_side")
    if side:
        same = bool(checks) and checks[0].get("command") == side.get("command")
        out.append(f"<p class=\"decide-side\"><b>To decide the side:</b> {text(side.get('check'))}"
                   + (" (the command above)</p>" if same else "</p>" + _command(side.get("command"))))
    if len(checks) > 1:
        out.append("<p><b>All next checks</b>, in order:</p><ol class=\"next-checks\">" + "".join(
            f"<li>{text(c.get('check'))}{_command(c.get('command'))}</li>" for c in checks) + "</ol>")
    if rc and rc.get("more"):
        out.append(f"<p>{text(rc['more'])} more root-cause candidate(s) in the verdict section below.</p>")
    return "".join(out) + defs


# -- verdict ----------------------------------------------------------------------------------------

def _names(x) -> str:
    if x is None:
        return "-"
    return ", ".join(x) if isinstance(x, list) else str(x)


# Rows of each table of structural pairs: a run of many calls holds thousands (the many-module
# bench pair, 5,591 rows, 1.3 MB of page); the committed pairs hold at most 23.
SUPPRESSED_ROWS = 200


def verdict_section(analysis: dict, root: dict | None) -> str:
    """The root-cause verdict with its evidence (root-cause skill), or the ranked modules (compare skill)."""
    head = "<h2>4. Verdict</h2>"
    if root is None:
        top = [m for m in analysis.get("modules", []) if m.get("module_priority_rank") in (1, 2)]
        rows = [(m["module_priority_rank"], ", ".join(m["train_modules"]), ", ".join(m["rollout_modules"]),
                 m["status"], m["rank_reason"]) for m in top[:20]]
        return (head + "<p>Module compare only: the candidates below are ranked, not explained. Run the "
                "rl-consistency-analysis skill for a root cause.</p>"
                + _table(("rank", "train", "rollout", "status", "why"), rows))
    out = [head, f"<p><b>{text((root.get('answer') or {}).get('verdict') or root.get('verdict'))}</b></p>"]
    for n in root.get("notes", []):
        out.append(f"<p>note: {text(n)}</p>")
    for c in root.get("root_causes", []):
        out.append(f"<h3>Root cause {text(c.get('rank'))}: {text(c.get('category_text') or c.get('category'))}</h3>"
                   f"<p>train {text(_names(c.get('train_module')))} / rollout {text(_names(c.get('rollout_module')))}"
                   f", layer {text(c.get('layer'))}, side {text(c.get('side'))} ({text(c.get('side_reason'))}); "
                   f"confidence {text(c.get('confidence_text') or c.get('confidence'))}</p>")
        nums = c.get("numbers") or {}
        rows = [(io, text(x["point"]), text(x["status"]), fmt(x["error"]), fmt(x.get("tolerance")))
                for io, x in nums.items() if isinstance(x, dict)]
        out.append(_table(("tensor", "point", "status", "error", "tolerance"), rows, escaped=True))
        if c.get("refuted"):
            out.append("<p>Already refuted by the numbers:</p><ul>" + "".join(
                f"<li>{text(r['hypothesis'])}: {text(r['because'])}</li>" for r in c["refuted"]) + "</ul>")
        if c.get("hypotheses"):
            out.append(_table(("hypothesis", "confirmed if", "refuted if"),
                              [(h["statement"], h["confirm_if"], h["refute_if"]) for h in c["hypotheses"]]))
    sup = root.get("suppressed") or {}
    for key, title in (("structural_different", "Structural pairs whose values differ"),
                       ("structural_not_compared", "Structural pairs not comparable as stored"),
                       ("structural_clean", "Structural pairs whose values agree")):
        recs = sup.get(key) or []
        more = (f"<p>The first {SUPPRESSED_ROWS} of {len(recs)}; output_5_root_cause_report.json "
                f"<code>suppressed.{key}</code> holds them all.</p>" if len(recs) > SUPPRESSED_ROWS else "")
        out.append(f"<details><summary>{text(title)}: {len(recs)}</summary>" + _table(
            ("train", "rollout", "reason"),
            [(_names(s.get("train_module")), _names(s.get("rollout_module")), s.get("reason"))
             for s in recs[:SUPPRESSED_ROWS]]) + more + "</details>")
    return "".join(out)


def _table(header, rows, escaped: bool = False) -> str:
    cell = (lambda v: str(v)) if escaped else text
    return ("<table><tr>" + "".join(f"<th>{text(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows) + "</table>")


def _figure(svg: str) -> str:
    return f'<div class="figure">{svg}</div>'


STYLE = ("body{font-family:sans-serif;margin:24px;max-width:1400px;color:#222}"
         ".figure{overflow-x:auto;border:1px solid #ddd;margin:8px 0 16px}"
         "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
         "font-size:13px;text-align:left;vertical-align:top}.legend span{margin-right:14px;font-size:13px}"
         ".note{background:#fff3cd;border-left:4px solid #e6a100;padding:6px 10px}"
         "pre.command{background:#f5f5f5;padding:6px 10px;white-space:pre-wrap;word-break:break-all;font-size:12px}"
         ".defs{font-size:13px;color:#444}table.answer th{width:120px}")


def _more_files(source: dict) -> str:
    n = len(source.get("files") or [])
    return f" (+{n - 1} more: steps {source.get('steps')}, ranks {source.get('ranks')})" if n > 1 else ""


def pieces(compare: dict, analysis: dict, sources: dict, root: dict | None = None, extra: str = "") -> Iterator[str]:
    """The whole page from output_3, output_4, output_1's sources and, optionally, output_5, in
    pieces in order: a writer writes each as it comes, so the page of a pair of many modules (a
    chart point per compared output) is never whole in memory. ``extra`` is a finished HTML
    fragment of the caller's (the root-cause skill's log-prob triage), placed beside the log-prob
    section it belongs with."""
    lp = compare.get("logprob")
    logits = next((r for r in compare.get("results", []) if lp and r["cid"] == lp.get("cid")), None)
    # One row per side; a side read from several files (ranks, steps) shows how many.
    sides = "".join(f"<tr><td>{side}</td><td>{text(s.get('family'))}</td><td>{text(s.get('path'))}"
                    f"{text(_more_files(s))}</td><td>{text(s.get('task'))}</td><td>{text(s.get('level'))}</td></tr>"
                    for side, s in sources.items() if side in ("train", "rollout"))
    yield ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>train vs rollout divergence</title>"
           f"<style>{STYLE}</style></head><body><h1>Train vs rollout divergence</h1>"
           + answer_section(root, compare.get("mode"))
           + "<h2>Inputs</h2><table><tr><th>side</th><th>family</th><th>dump</th><th>task</th><th>level</th></tr>"
           f"{sides}</table><p>mode: {text(compare.get('mode'))}</p>"
           + logprob_section(lp, logits) + extra)
    yield from execution_section(compare, analysis, root)
    yield (reference_section(compare, analysis, root) + heatmap_section(compare) + verdict_section(analysis, root)
           + "</body></html>\n")
