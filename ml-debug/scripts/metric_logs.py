#!/usr/bin/env python3
"""Read a training metrics log as it really is: mixed text, CSV exports, or TensorBoard events.

A text log (JSONL or not) is read line by line: a JSON object, a Python dict as the Hugging Face
Trainer prints it, `key=value` / `key: value` pairs, or `name value` fields between ` | `
separators each make a row (a launcher's `pid=`/`rank=` prefix is dropped and listed as
ignored); any other line (warnings, tqdm bars, tracebacks) is skipped and counted. A CSV may be a plain table, a Weights & Biases chart
export (`<run> - <metric>` columns with `__MIN`/`__MAX` companions) or an MLflow long table (one
row per key, value and step). TensorBoard event files are read when the optional `tensorboard`
package is installed. Axis columns (step, epoch, global_step, timestamp, _runtime ...) order the
rows and are never read as metrics. Run directly to list what a log holds.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from mldebug_common import (ANSI, SCHEMA_VERSION, InputError, ReadSummary, count_lines, flatten, make_parser,
                            read_records, read_text, run, sniff_format, to_float)

# Searched in this order; the trainer's own step comes before W&B's count of log calls.
STEP_KEYS = ("step", "global_step", "_step", "iteration", "iter", "it", "epoch")
AXIS_KEYS = frozenset(STEP_KEYS) | {"timestamp", "_timestamp", "_runtime", "wall_time", "walltime",
                                    "time_stamp", "relative_time"}
# Who wrote a line, not what was measured: Ray prefixes every line of a worker with
# `(TaskRunner pid=N, ip=...)`, torchrun and DeepSpeed with the rank.
IDENTITY_KEYS = frozenset({"pid", "ip", "rank", "local_rank", "global_rank", "node_rank", "tid", "port",
                           "worker_id", "node_id", "actor_id"})
IDENTITY_WHY = "who wrote the line (a launcher's prefix), not a measurement"
NOT_LOGS = {".py": "Python source", ".md": "Markdown", ".ipynb": "a notebook", ".yaml": "YAML",
            ".yml": "YAML", ".toml": "TOML", ".html": "HTML", ".pdf": "a PDF"}
# A `file.py:328` source location is not a metric, hence the look-behind after the key.
_KV = re.compile(r"(?<![\w./-])['\"]?([A-Za-z_][\w./-]*)(?<!\.py)['\"]?\s*[=:]\s*"
                 r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|infinity)"
                 r")(?![\w.:])", re.IGNORECASE)
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf)"
# `name value` inside fields a line separates with ' | ' (plain loops, fairseq): `epoch 0 step 5 | loss 0.54`.
_FIELD_PAIR = re.compile(rf"(?<![\w./-])([A-Za-z_][\w./-]*)\s+({_NUMBER})(?![\w.:%/\]])", re.IGNORECASE)
_PIPE = re.compile(r"\s\|\s")
_WANDB_COLUMN = re.compile(r"^(?P<run>.+?) - (?P<metric>.+)$")
_MLFLOW_KEY = ("key", "metric", "name", "tag")
# Python prints non-finite floats as bare nan/inf, which literal_eval rejects; quoted, to_float reads them.
_BARE_NONFINITE = re.compile(r"(?<![\w'\"])(-?(?:nan|inf))(?![\w'\"])")


# Logger groups under which an axis keeps its meaning (`train/global_step`, `trainer/global_step`);
# under any other group the name measures something (`timing_s/step` is seconds per step).
AXIS_GROUPS = frozenset({"", "train", "eval", "val", "validation", "test", "trainer", "charts", "global"})


def axis_name(key: str) -> str | None:
    """The axis a key names (`Step`, `train/global_step` -> step, global_step), else None."""
    group, _, name = key.lower().rpartition("/")
    return name if name in AXIS_KEYS and group in AXIS_GROUPS else None


def is_axis(key: str) -> bool:
    """True for a column that orders rows (step, epoch, time) rather than measuring anything."""
    return axis_name(key) is not None


def is_identity(key: str) -> bool:
    """True for a process or host id (pid, rank, ip ...) that a launcher writes on every line."""
    return key.lower() in IDENTITY_KEYS


@dataclass
class LogRow:
    """One log line (or CSV row, or TensorBoard step) that carried at least one numeric value."""

    line: int
    raw: str
    values: dict[str, float]


@dataclass
class MetricLog:
    """A parsed metrics log: its rows, the format, the lines read and the lines skipped."""

    path: str
    fmt: str
    rows: list[LogRow]
    n_lines: int
    skipped: int = 0
    first_skipped: tuple[int, str] | None = None
    notes: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)  # key dropped while parsing -> why

    def keys(self) -> list[str]:
        """Every numeric key, in order of first appearance."""
        seen: dict[str, None] = {}
        for row in self.rows:
            for k in row.values:
                seen.setdefault(k, None)
        return list(seen)

    def metrics(self, step_key: str | None) -> list[str]:
        """The measurements: keys other than the axes that appear on a row placed by the step key.

        A key seen only on rows without a step (a config echo, a banner) has no curve to read.
        """
        placed = {k for row in self.rows if step_key is None or step_key in row.values for k in row.values}
        return [k for k in self.keys() if k in placed and k != step_key and not is_axis(k)]

    def step_key(self, wanted: str | None = None) -> str | None:
        """The key that orders the rows: `wanted` if given and present, else a usual step name.

        Matching ignores case and a logger prefix, so `Step` and `train/global_step` are found.
        """
        keys = self.keys()
        if wanted:
            if wanted not in keys:
                raise InputError(f"{self.path}: step key '{wanted}' not found (keys: {', '.join(keys)})")
            return wanted
        for name in STEP_KEYS:
            found = next((k for k in keys if axis_name(k) == name), None)
            if found:
                return found
        return None

    def series(self, key: str, step_key: str | None) -> list[tuple[float, float, LogRow]]:
        """(step, value, row) for every row holding `key`.

        Without a step key the row index stands in for the step. With one, rows lacking it (a
        config line echoing lr=3e-4, say) are skipped because they have no place on the curve.
        """
        out = []
        for i, row in enumerate(self.rows):
            if key not in row.values or (step_key and step_key not in row.values):
                continue
            out.append((row.values[step_key] if step_key else float(i), row.values[key], row))
        return out

    def read_summary(self, step_key: str | None, names: list[str] | None = None) -> ReadSummary:
        """What was read as metrics (`names`, default all) and every key set aside, with the reason."""
        placed = self.metrics(step_key)
        names = placed if names is None else names
        ignored = dict(self.ignored)
        for k in self.keys():
            if k in names:
                continue
            if k == step_key:
                ignored[k] = "the step axis"
            elif is_axis(k):
                ignored[k] = "an axis, not a measurement"
            elif k not in placed:
                ignored[k] = f"only on rows without {step_key}"
            else:
                ignored[k] = "not asked for"
        return ReadSummary(self.path, self.fmt, self.n_lines, names, ignored)

    def skipped_text(self) -> str:
        """One sentence on the lines that held no metric, or '' when none were skipped."""
        if not self.skipped:
            return ""
        line, text = self.first_skipped
        text = text.strip()
        text = text if len(text) <= 80 else text[:80] + "\u2026"
        return f"skipped {self.skipped} line(s) holding no metric, the first at line {line}: '{text}'"


def numeric_fields(obj: dict) -> dict[str, float]:
    """Numeric values of a (possibly nested) record, keys joined with '/'."""
    return {k: f for k, v in flatten(obj).items() if (f := to_float(v)) is not None}


def dict_in_line(raw: str) -> dict | None:
    """The JSON object or Python dict literal a line holds (after any prefix), else None.

    `ast.literal_eval` evaluates literals only, so a crafted line cannot run code.
    """
    s = raw.strip()
    start = s.find("{")
    if start < 0 or not s.endswith("}"):
        return None
    body = s[start:]
    try:
        obj = json.loads(body)
    except ValueError:
        try:
            obj = ast.literal_eval(_BARE_NONFINITE.sub(r"'\1'", body))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    return obj if isinstance(obj, dict) else None


def line_values(raw: str) -> dict[str, float]:
    """Numeric values of one line: its dict, else its key=value / key: value pairs and its `| name value` fields."""
    obj = dict_in_line(raw)
    if obj is not None:
        return numeric_fields(obj)
    vals: dict[str, float] = {}
    # A tqdm bar ("45%|####  | 9/20") also has pipes, but never ' | ' between named fields.
    if len(_PIPE.split(raw)) >= 2 and "%|" not in raw:
        vals.update((m.group(1), float(m.group(2))) for m in _FIELD_PAIR.finditer(raw))
    vals.update((m.group(1), float(m.group(2))) for m in _KV.finditer(raw))
    return vals


def parse_text(path: str, text: str, fmt: str) -> MetricLog:
    """Mixed text: dict lines and key=value lines make rows; every other non-blank line is skipped.

    Lines are numbered as an editor numbers them; the parts a carriage return separates (a tqdm
    bar redrawn before a dict line) are read one by one, colour codes removed. Identity keys of a
    launcher's prefix are dropped and listed as ignored.
    """
    rows: list[LogRow] = []
    skipped, first = 0, None
    ignored: dict[str, str] = {}
    for i, line in enumerate(text.split("\n"), 1):
        for raw in ANSI.sub("", line).split("\r"):
            if not raw.strip():
                continue
            found = line_values(raw)
            vals = {k: v for k, v in found.items() if not is_identity(k)}
            ignored.update((k, IDENTITY_WHY) for k in found if k not in vals)
            if vals:
                rows.append(LogRow(i, raw, vals))
            else:
                skipped += 1
                first = first or (i, raw)
    return MetricLog(path, fmt, rows, count_lines(text), skipped, first, ignored=ignored)


def parse_csv(path: str, text: str) -> MetricLog:
    """A CSV table, a W&B chart export or an MLflow long table, as rows of numeric values."""
    records = read_records(path, text, "csv")
    header = list(records[0].fields) if records else []
    lower = {h.lower(): h for h in header}
    key_col = next((lower[k] for k in _MLFLOW_KEY if k in lower), None)
    notes: list[str] = []
    rows: list[LogRow] = []
    if key_col and "value" in lower:
        # MLflow's long form: one row per (key, value, step); pivot it into one row per step.
        notes.append(f"read as a long table: metric name in '{key_col}', value in '{lower['value']}'")
        for rec in records:
            value = to_float(rec.fields.get(lower["value"]))
            if value is None:
                continue
            vals = {str(rec.fields[key_col]).strip(): value}
            vals.update({h: f for h in header
                         if is_axis(h) and (f := to_float(rec.fields.get(h))) is not None})
            rows.append(LogRow(rec.line, rec.raw, vals))
        return MetricLog(path, "csv", rows, count_lines(text), notes=notes)
    rename = wandb_columns(header)
    ignored = {}
    if rename:
        notes.append("read as a W&B export: run prefixes dropped, __MIN/__MAX columns ignored")
        ignored = {h: "a W&B min/max band of a plotted metric" for h in header if h.endswith(("__MIN", "__MAX"))}
    skipped, first = 0, None
    for rec in records:
        vals = {rename.get(k, k): f for k, v in rec.fields.items()
                if not k.endswith(("__MIN", "__MAX")) and (f := to_float(v)) is not None}
        if vals:
            rows.append(LogRow(rec.line, rec.raw, vals))
        else:
            skipped += 1
            first = first or (rec.line, rec.raw)
    return MetricLog(path, "csv", rows, count_lines(text), skipped, first, notes, ignored)


def wandb_columns(header: list[str]) -> dict[str, str]:
    """Map `<run> - <metric>` columns to `<metric>` when every such column names one run."""
    matches = {h: _WANDB_COLUMN.match(h) for h in header}
    runs = {m.group("run") for m in matches.values() if m}
    if len(runs) != 1:
        return {}
    return {h: m.group("metric") for h, m in matches.items() if m}


def parse_tensorboard(path: str) -> MetricLog:
    """Scalars of a TensorBoard event file, one row per step (needs the optional tensorboard)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise InputError(f"{path}: a TensorBoard event file; reading it needs the optional "
                         "'tensorboard' package (pip install tensorboard), or export the scalars "
                         "to CSV") from None
    try:
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        tags = acc.Tags().get("scalars", [])
        by_step: dict[int, dict[str, float]] = {}
        for tag in tags:
            for event in acc.Scalars(tag):
                by_step.setdefault(int(event.step), {})[tag] = float(event.value)
    except Exception as exc:  # the reader raises many types on a damaged file; all mean "unreadable"
        raise InputError(f"{path}: cannot read TensorBoard events ({exc})") from None
    rows = []
    for n, step in enumerate(sorted(by_step), 1):
        vals = {"step": float(step), **by_step[step]}
        raw = " ".join(f"{k}={v:g}" for k, v in vals.items())
        rows.append(LogRow(n, raw, vals))
    return MetricLog(path, "tensorboard", rows, len(rows))


def parse_metric_log(path: str, text: str, fmt: str | None = None) -> MetricLog:
    """Parse a metrics log's text; rows without any numeric value are counted as skipped."""
    fmt = fmt or sniff_format(path, text)
    if fmt == "csv":
        return parse_csv(path, text)
    if fmt in ("jsonl", "text"):
        return parse_text(path, text, fmt)
    raise InputError(f"{path}: unknown format '{fmt}' (use jsonl, csv, text or tensorboard)")


def load_metric_log(path: str, fmt: str | None = None) -> MetricLog:
    """Read and parse a metrics log, raising InputError when it is not one or holds no numbers."""
    p = Path(path)
    kind = NOT_LOGS.get(p.suffix.lower())
    if kind and fmt is None:
        raise InputError(f"{path}: this is {kind}, not a metrics log (JSONL, CSV, text or TensorBoard)")
    if fmt == "tensorboard" or (fmt is None and "tfevents" in p.name):
        log = parse_tensorboard(path)
    else:
        text = read_text(path)
        if not text.strip():
            raise InputError(f"{path}: empty file, expected a metrics log")
        log = parse_metric_log(path, text, fmt)
    if not log.rows:
        skipped = f"; {log.skipped_text()}" if log.skipped else ""
        raise InputError(f"{path}: no numeric values found (expected JSONL, CSV or key=value "
                         f"lines){skipped}")
    return log


def main() -> int:
    """List the format, step key, metrics and skipped lines of each log given."""
    parser = make_parser("metric_logs.py", __doc__, "Exit 0 read, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="LOG", help="metrics log")
    args = parser.parse_args()
    for path in args.files:
        log = load_metric_log(path)
        step = log.step_key()
        info = {"schema_version": SCHEMA_VERSION, "file": path, "format": log.fmt,
                "lines": log.n_lines, "rows": len(log.rows),
                "step_key": step, "metrics": log.metrics(step), "skipped": log.skipped_text(),
                "notes": log.notes}
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print("\n".join(f"{k}: {v}" for k, v in info.items()
                            if v not in ("", []) and k != "schema_version"))
    return 0


if __name__ == "__main__":
    run("metric_logs", main)
