"""Helpers shared by the ml-debug checkers.

One place for the things every checker needs: the credence scale, reading a file or failing with
exit 2, Markdown table parsing, JSONL/CSV rows, and the common human/JSON report format (metric
logs are read by metric_logs.py). Standard library only, so the checkers run wherever the training
code runs. Run directly to print the credence scale the checkers enforce.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

SCHEMA_VERSION = 1

# The seven words and their ranges, in percent (Kesselman 2008), defined once in
# credence_scale.json (the root-cause skill ships an identical copy). Longest phrase first, so that a
# regex alternation tries "highly likely" before "likely".
CREDENCE_SCALE: tuple[tuple[str, int, int], ...] = tuple(sorted(
    ((d["word"], d["low"], d["high"])
     for d in json.loads(Path(__file__).with_name("credence_scale.json").read_text(encoding="utf-8"))["scale"]),
    key=lambda t: -len(t[0])))
CREDENCE_RANGES = {word: (lo, hi) for word, lo, hi in CREDENCE_SCALE}
_WORD_ALT = "|".join(re.escape(w).replace(r"\ ", r"\s+") for w, _, _ in CREDENCE_SCALE)
_PCT = r"(\d{1,3}(?:\.\d+)?)\s*%"
# "likely, 60%", "likely (60%)", "highly likely: 80 %"
# "even chance, 50%" and "even odds (50%)": Kesselman's phrase for the middle word.
_WORD_THEN_NUM = re.compile(
    rf"\b({_WORD_ALT})\b(?:\s+(?:chance|odds))?[\s,:;(\[\-\u2013\u2014]*(?:about\s+|~\s*)?{_PCT}", re.IGNORECASE)
# "60% (likely)", "60%, likely", "60% likely"
_NUM_THEN_WORD = re.compile(rf"{_PCT}[\s,:;(\[\-\u2013\u2014]*\b({_WORD_ALT})\b", re.IGNORECASE)
_WORD_ONLY = re.compile(rf"\b({_WORD_ALT})\b", re.IGNORECASE)
# Colour and cursor codes that consoles (Ray, rich, colorlog) put around text.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PCT_ONLY = re.compile(_PCT)


class InputError(Exception):
    """Raised when a file cannot be read or is not the kind of input a checker accepts (exit 2)."""


@dataclass
class Finding:
    """One problem found in a checked file: where it is, which rule, and what to do."""

    file: str
    line: int
    rule: str
    message: str

    def human(self) -> str:
        """Format as `file:line: RULE: message`, the form editors and grep understand."""
        return f"{self.file}:{self.line}: {self.rule}: {self.message}"


@dataclass
class Credence:
    """A credence found in text: the word, the number in percent, and where it sits."""

    word: str
    number: float
    start: int
    end: int


def normalize_word(word: str) -> str:
    """Lower-case a credence phrase and collapse inner whitespace ("Highly  likely" -> "highly likely")."""
    return " ".join(word.lower().split())


def word_for_number(number: float) -> str | None:
    """Return the credence word whose range holds `number` (rounded to a whole percent), else None."""
    n = round(number)
    for word, lo, hi in CREDENCE_SCALE:
        if lo <= n <= hi:
            return word
    return None


def number_fits_word(word: str, number: float) -> bool:
    """True when `number` (percent, rounded) lies inside the range of credence `word`."""
    lo, hi = CREDENCE_RANGES[normalize_word(word)]
    return lo <= round(number) <= hi


def scale_text() -> str:
    """The scale as one line, for messages: "almost certain 86-99, ..., remote 1-15"."""
    ordered = sorted(CREDENCE_SCALE, key=lambda t: -t[2])
    return ", ".join(f"{w} {lo}-{hi}" for w, lo, hi in ordered)


def find_credences(text: str) -> list[Credence]:
    """Find every word-and-number credence pair in `text`, in either order, without overlaps."""
    found: list[Credence] = []
    taken: list[tuple[int, int]] = []
    for rx, word_group, num_group in ((_WORD_THEN_NUM, 1, 2), (_NUM_THEN_WORD, 2, 1)):
        for m in rx.finditer(text):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            taken.append((m.start(), m.end()))
            found.append(Credence(normalize_word(m.group(word_group)), float(m.group(num_group)),
                                  m.start(), m.end()))
    found.sort(key=lambda c: c.start)
    return found


def credence_problem(word: str, number: float) -> str | None:
    """Explain why a word/number pair breaks the scale, or return None when it agrees."""
    if not 1 <= round(number) <= 99:
        return (f"{number:g}% is off the credence scale (1-99); certainty is never 0 or 100, "
                f"use remote or almost certain")
    if number_fits_word(word, number):
        return None
    lo, hi = CREDENCE_RANGES[word]
    fits = word_for_number(number)
    hint = f"; {number:g}% is '{fits}'" if fits else ""
    return f"'{word}' means {lo}-{hi}% but the number given is {number:g}%{hint}"


def check_credence_cell(text: str) -> str | None:
    """Check a cell or field that must hold a credence: one word and one matching number.

    Returns a message when the word or the number is missing or they disagree, else None.
    """
    pairs = find_credences(text)
    if pairs:
        for c in pairs:
            problem = credence_problem(c.word, c.number)
            if problem:
                return problem
        return None
    if _WORD_ONLY.search(text):
        return "credence has a word but no number; give both, e.g. 'likely, 60%'"
    if _PCT_ONLY.search(text):
        return f"credence has a number but no word; pair it with its word ({scale_text()})"
    return f"no credence found; give a word and a number, e.g. 'likely, 60%' ({scale_text()})"


def count_lines(text: str) -> int:
    """Lines as editors and `wc -l` count them: newline-separated, so a tqdm carriage return is not one."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def line_of(text: str, offset: int) -> int:
    """1-based line number of character `offset` in `text`."""
    return text.count("\n", 0, offset) + 1


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file, or raise InputError naming the file and the problem."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if b"\x00" in data:
        raise InputError(f"{path}: looks binary (contains NUL bytes), expected text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None


# ---------------------------------------------------------------------------------------------
# Markdown tables

# Stand-ins that say nothing: dashes, question marks, n/a, none, xx, (blank), ..., tbd, <fill in>.
_PLACEHOLDER = re.compile(r"^(?:-+|\u2014|\u2013|\?+|tbd|tba|todo|n/?a|none|null|nil|x+|\(?blank\)?|"
                          r"\.\.\.|\u2026|<[^<>]*>)?\.?$", re.IGNORECASE)
_UNKNOWN = re.compile(r"^\W*unknown\b(.*)$", re.IGNORECASE | re.DOTALL)
# "unknown: same", "unknown: same as the start column", "unknown: ditto", "unknown: as above".
_BACK_REFERENCE = re.compile(r"^\W*(?:same|ditto|as above)(?:\s+as\s+(?:the\s+)?(?P<column>[\w ?()/:-]+?)"
                             r"(?:\s+column)?)?\W*$", re.IGNORECASE)


@dataclass
class Table:
    """A pipe table: normalised header names, raw header text, rows of cells and their lines."""

    header: list[str]
    raw_header: list[str]
    rows: list[list[str]]
    line: int
    row_lines: list[int] = field(default_factory=list)

    def column(self, name: str) -> int | None:
        """Index of the column whose normalised header equals `name`, else None."""
        try:
            return self.header.index(name)
        except ValueError:
            return None


def split_row(line: str) -> list[str]:
    """Split one table row into cells, honouring `\\|` escapes and pipes inside code spans."""
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells, buf, in_code, i = [], [], False, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] == "|":
            buf.append("|")
            i += 2
            continue
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(buf).strip())
            buf = []
        else:
            buf.append(ch)
        i += 1
    cells.append("".join(buf).strip())
    return cells


def normalize_header(cell: str) -> str:
    """Lower-case a header cell, drop emphasis markers and collapse whitespace."""
    return " ".join(cell.replace("*", "").replace("_", " ").lower().split())


_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


def parse_tables(text: str) -> list[Table]:
    """Find every pipe table (header row, separator row, body rows) outside code fences."""
    lines = text.splitlines()
    tables: list[Table] = []
    in_fence = False
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith(("```", "~~~")):
            in_fence = not in_fence
            i += 1
            continue
        if (not in_fence and stripped.startswith("|") and i + 1 < len(lines)
                and _SEPARATOR.match(lines[i + 1])):
            raw = split_row(lines[i])
            table = Table([normalize_header(c) for c in raw], raw, [], i + 1)
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                table.rows.append(split_row(lines[j]))
                table.row_lines.append(j + 1)
                j += 1
            tables.append(table)
            i = j
            continue
        i += 1
    return tables


def is_blank(cell: str) -> bool:
    """True for an empty cell or a stand-in that says nothing ("-", "?", "n/a", "none", "<fill in>")."""
    return bool(_PLACEHOLDER.match(cell.strip()))


def back_reference(cell: str) -> tuple[bool, str | None] | None:
    """For "unknown: same [as the X column]": (True, X or None); None when the cell is no such reference."""
    m = _UNKNOWN.match(cell.strip())
    ref = _BACK_REFERENCE.match(m.group(1)) if m else None
    if not ref:
        return None
    return True, normalize_header(ref.group("column")) if ref.group("column") else None


def unknown_problem(cell: str, earlier: dict[str, str] | None = None) -> str | None:
    """If a cell says "unknown", require it to say what would fill it (two or more more words).

    A cell may instead refer back ("unknown: same", "unknown: same as the start column") to an
    earlier cell of its row, given as `earlier` (normalised header -> cell), that says it in full.
    """
    ref = back_reference(cell)
    if ref is not None:
        column = ref[1]
        targets = [earlier.get(column, "")] if column and earlier and column in earlier else \
            list((earlier or {}).values()) if not column else []
        if any(_UNKNOWN.match(t.strip()) and unknown_problem(t) is None for t in targets):
            return None
        where = f"the '{column}' column" if column else "an earlier cell of this row"
        return (f"'unknown: same' refers back, but {where} does not say what would fill it; "
                "write it out, e.g. 'unknown: needs the eval log of job 12'")
    m = _UNKNOWN.match(cell.strip())
    if not m:
        return None
    rest = re.findall(r"[A-Za-z0-9]+", m.group(1))
    if len(rest) >= 2:
        return None
    return "'unknown' must say what would fill it, e.g. 'unknown: needs the eval log of job 12'"


def cell_problem(cell: str, earlier: dict[str, str] | None = None) -> str | None:
    """Message for a cell that is empty, a placeholder, or a bare "unknown"; None when filled.

    `earlier` holds the row's previous cells by normalised header, for back references.
    """
    if is_blank(cell):
        return "empty cell" if not cell.strip() else f"placeholder '{cell.strip()}' left in cell"
    return unknown_problem(cell, earlier)


# ---------------------------------------------------------------------------------------------
# Rows of JSONL and CSV files


def to_float(value: object) -> float | None:
    """Convert a JSON/CSV value to float; None for text, booleans and missing values."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def flatten(obj: dict, prefix: str = "") -> dict[str, object]:
    """Flatten nested dicts to "outer/inner" keys, the way most loggers name nested metrics."""
    flat: dict[str, object] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(flatten(v, key + "/"))
        else:
            flat[key] = v
    return flat


def sniff_format(path: str, text: str) -> str:
    """Guess the log format from the extension, then from the first non-empty line."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if suffix in (".csv", ".tsv"):
        return "csv"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if first.startswith("{"):
        return "jsonl"
    if "," in first and "=" not in first and ":" not in first:
        return "csv"
    return "text"


@dataclass
class Record:
    """One row of a JSONL or CSV file: its line number, raw text, and fields as parsed."""

    line: int
    raw: str
    fields: dict


def read_records(path: str, text: str, fmt: str) -> list[Record]:
    """Rows of a JSONL (one object per line) or CSV/TSV file (header row first), as Records."""
    lines = text.splitlines()
    records: list[Record] = []
    if fmt == "jsonl":
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{i}: expected one JSON object per line")
            records.append(Record(i, raw, obj))
        return records
    delim = "\t" if Path(path).suffix.lower() == ".tsv" else ","
    reader = csv.reader(io.StringIO(text), delimiter=delim)
    header = next(reader, None)
    if not header:
        raise InputError(f"{path}: empty CSV, expected a header row")
    header = [h.strip() for h in header]
    for cells in reader:
        line = reader.line_num
        if any(c.strip() for c in cells):
            records.append(Record(line, lines[line - 1] if line - 1 < len(lines) else ",".join(cells),
                                  dict(zip(header, cells))))
    return records


def records_read(path: str, text: str, fmt: str, records: Sequence[Record], used: Sequence[str | None],
                 noun: str = "columns") -> ReadSummary:
    """The read line of a checker that uses a few columns of a JSONL/CSV file and passes over the rest."""
    keys = list(dict.fromkeys(k for r in records for k in r.fields))
    taken = [k for k in used if k]
    return ReadSummary(path, fmt, count_lines(text), taken,
                       {k: "not used by this check" for k in keys if k not in taken}, noun)


LOWER_IS_BETTER = re.compile(r"loss|nll|perplexity|ppl|error|err\b|mse|mae|rmse|regret", re.IGNORECASE)


def fmt_num(x: float) -> str:
    """Short, stable number formatting for reports (4 significant digits)."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


# ---------------------------------------------------------------------------------------------
# Reporting and exit codes

READ_NAMES_SHOWN = 12


@dataclass
class ReadSummary:
    """What a checker took from one file, printed before its findings so that a misread shows at once.

    `names` are what it read (metrics of a log, stages of a guide ...; `noun` says which) and
    `ignored` maps each name it set aside to the reason.
    """

    file: str
    format: str
    lines: int
    names: list[str]
    ignored: dict[str, str] = field(default_factory=dict)
    noun: str = "metrics"

    def human(self) -> str:
        """`FILE: read: <format>, <N> lines, <noun> <names>, ignored <names> (<why>)`."""
        by_reason: dict[str, list[str]] = {}
        for name, why in self.ignored.items():
            by_reason.setdefault(why, []).append(name)
        ignored = "; ".join(f"{shorten(names)} ({why})" for why, names in by_reason.items()) or "nothing"
        return (f"{self.file}: read: {self.format}, {self.lines} lines, {self.noun} "
                f"{shorten(self.names) or 'none'}, ignored {ignored}")

    def as_json(self) -> dict:
        """The same as a JSON object."""
        return {"file": self.file, "format": self.format, "lines": self.lines, "noun": self.noun,
                "names": list(self.names),
                "ignored": [{"name": n, "why": w} for n, w in self.ignored.items()]}


def shorten(names: Sequence[str]) -> str:
    """Names joined by commas, the first READ_NAMES_SHOWN of them and a count of the rest."""
    shown = ", ".join(names[:READ_NAMES_SHOWN])
    return shown + (f" (+{len(names) - READ_NAMES_SHOWN} more)" if len(names) > READ_NAMES_SHOWN else "")


def report(tool: str, files: Sequence[str], findings: Iterable[Finding], as_json: bool,
           extra: dict | None = None, human_body: str = "", reads: Sequence[ReadSummary] = ()) -> int:
    """Print findings as `file:line: RULE: message` lines or as JSON; return the exit code (0 or 1).

    Each ReadSummary is printed first (in JSON: the `read` list), before the body and findings.
    """
    findings = list(findings)
    if as_json:
        payload = {"schema_version": SCHEMA_VERSION, "tool": tool, "files": list(files),
                   "ok": not findings, "read": [r.as_json() for r in reads],
                   "findings": [asdict(f) for f in findings]}
        payload.update(extra or {})
        print(json.dumps(_sanitize(payload), indent=2, allow_nan=False))
    else:
        for r in reads:
            print(r.human())
        if human_body:
            print(human_body.rstrip("\n"))
        for f in findings:
            print(f.human())
        n_files = len(files)
        noun = "file" if n_files == 1 else "files"
        if findings:
            print(f"{tool}: {len(findings)} finding(s) in {n_files} {noun}")
        else:
            print(f"{tool}: OK ({n_files} {noun})")
    return 1 if findings else 0


def _sanitize(obj: object) -> object:
    """Make a payload strict JSON: numpy scalars become Python numbers, NaN/Inf become strings."""
    if isinstance(obj, dict):
        return {str(k): _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def make_parser(prog: str, doc: str, epilog: str) -> argparse.ArgumentParser:
    """A parser with the shared contract: the docstring's first paragraph as description, --json."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0], epilog=epilog)
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    return parser


def check_documents(tool: str, doc: str, epilog: str, metavar: str, help_text: str,
                    check: Callable[[str, str], tuple[list[Finding], ReadSummary]]) -> int:
    """The whole main() of a checker that reads documents: parse arguments, check each, report.

    `check(path, text)` returns the file's findings and what it read.
    """
    parser = make_parser(f"{tool}.py", doc, epilog)
    parser.add_argument("files", nargs="+", metavar=metavar, help=help_text)
    args = parser.parse_args()
    results = [check(path, read_text(path)) for path in args.files]
    return report(tool, args.files, [f for found, _ in results for f in found], args.json,
                  reads=[read for _, read in results])


def report_each(tool: str, files: Sequence[str], as_json: bool,
                check: Callable[[str], tuple[list[Finding], dict, str, ReadSummary]], key: str,
                separator: str = "\n\n") -> int:
    """Run `check(path) -> (findings, result, text, read)` on every file and report them together.

    The per-file results go into the JSON report under `key`; the texts form the human report.
    """
    findings: list[Finding] = []
    results, texts, reads = [], [], []
    for path in files:
        found, result, text, read = check(path)
        findings += found
        results.append(result)
        texts.append(text)
        reads.append(read)
    return report(tool, files, findings, as_json, {key: results}, separator.join(texts), reads)


def run(tool: str, main: Callable[[], int]) -> None:
    """Run a checker's main, turning InputError into a one-line message and exit code 2."""
    try:
        code = main()
    except InputError as exc:
        print(f"{tool}: error: {exc}", file=sys.stderr)
        code = 2
    except BrokenPipeError:
        code = 0
    sys.exit(code)


def main() -> int:
    """Print the credence scale the checkers enforce (as JSON with --json)."""
    parser = make_parser("mldebug_common.py", __doc__, "Exit 0.")
    args = parser.parse_args()
    if args.json:
        scale = [{"word": w, "low": lo, "high": hi} for w, lo, hi in CREDENCE_SCALE]
        print(json.dumps({"schema_version": SCHEMA_VERSION, "credence_scale": scale}, indent=2))
    else:
        print("credence scale (Kesselman 2008): " + scale_text())
    return 0


if __name__ == "__main__":
    run("mldebug_common", main)
