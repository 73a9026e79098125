#!/usr/bin/env python3
"""Check that every line a report quotes from a log appears in that log verbatim.

Usage: check_quotes.py REPORT.md LOG [LOG ...]. A quote is: a code span or quoted text in a table
column named "quoted line", "quote" or "log line"; every line of a fenced block tagged `log`; and
every code span on a line that introduces it with "log:" or "log line:". A quote matches when it is
a substring of one log line after ANSI colour codes and trailing spaces are removed and carriage
returns (progress bars) split lines; a quote cut with "..." or an ellipsis matches when its pieces
appear in order on one line. A stated log length ("the log has 1,204 lines") must equal the real
line count. Exit 0 all found, 1 a quote is missing or the report quotes nothing, 2 unreadable input.
"""
from __future__ import annotations

import re

from mldebug_common import (ANSI, Finding, ReadSummary, count_lines, line_of, make_parser, parse_tables, read_text,
                            report, run)

TOOL = "check_quotes"
QUOTE_COLUMNS = ("quoted line", "quote", "log line")
SPAN = re.compile(r"(`+)(.+?)\1")
QUOTED = re.compile(r"\"([^\"]+)\"|\u201c([^\u201d]+)\u201d")
ELLIPSIS = re.compile(r"\s*(?:\.\.\.|\u2026)\s*")
INTRO = re.compile(r"\blog(?: line)?:\s*$", re.IGNORECASE)
LENGTH_CLAIM = re.compile(r"\blog\b[^.\n]{0,80}?(?<!last )(?<!first )(?<!final )\b(\d[\d,]*)\s+lines\b",
                          re.IGNORECASE)
# A dot inside a path or file name (`logs/ppo_v0.3/train.1.log`) does not end the sentence.
INNER_DOT = re.compile(r"(?<=\S)\.(?=[\w/`-])")


def cell_quotes(cell: str) -> list[str]:
    """Code spans in a cell, else double-quoted text."""
    spans = [m.group(2).strip() for m in SPAN.finditer(cell)]
    if spans:
        return spans
    return [(m.group(1) or m.group(2)).strip() for m in QUOTED.finditer(cell)]


def extract_quotes(text: str) -> list[tuple[int, str]]:
    """Every (report line, quoted text) the report presents as coming from a log."""
    quotes: list[tuple[int, str]] = []
    for table in parse_tables(text):
        cols = [i for i, h in enumerate(table.header) if h in QUOTE_COLUMNS]
        for row, line in zip(table.rows, table.row_lines):
            for i in cols:
                if i < len(row):
                    quotes += [(line, q) for q in cell_quotes(row[i])]
    lines = text.splitlines()
    in_log = False
    fence = ""
    for n, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not fence and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            in_log = stripped[3:].strip().lower() == "log"
            continue
        if fence and stripped.startswith(fence):
            fence, in_log = "", False
            continue
        if in_log and stripped:
            quotes.append((n, raw.rstrip()))
        elif not fence:
            for m in SPAN.finditer(raw):
                if INTRO.search(raw[:m.start()]):
                    quotes.append((n, m.group(2).strip()))
    return quotes


def log_lines(text: str) -> list[str]:
    """A log's lines with colour codes stripped and carriage-return updates split out."""
    out = []
    for raw in text.split("\n"):
        for part in raw.split("\r"):
            out.append(ANSI.sub("", part).rstrip())
    return out


def found(quote: str, lines: list[str]) -> bool:
    """True when the quote, or its ellipsis-separated pieces in order, sits on one log line."""
    quote = quote.strip()
    if any(quote in line for line in lines):
        return True
    pieces = [p for p in ELLIPSIS.split(quote) if p]
    if not ELLIPSIS.search(quote) or not pieces:
        return False
    for line in lines:
        pos = 0
        for piece in pieces:
            pos = line.find(piece, pos)
            if pos < 0:
                break
            pos += len(piece)
        else:
            return True
    return False


def main() -> int:
    """Parse arguments, match every quote, print the report and return the exit code."""
    parser = make_parser("check_quotes.py", __doc__,
                         "Exit 0 all quotes found, 1 missing quotes or none at all, 2 unreadable input.")
    parser.add_argument("report_file", metavar="REPORT.md", help="the reply or report that quotes logs")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="the log(s) the quotes come from")
    args = parser.parse_args()
    text = read_text(args.report_file)
    log_texts = {p: read_text(p) for p in args.logs}
    all_lines = [line for t in log_texts.values() for line in log_lines(t)]
    quotes = extract_quotes(text)
    findings: list[Finding] = []
    checked = []
    for line, quote in quotes:
        ok = found(quote, all_lines)
        checked.append({"line": line, "quote": quote, "found": ok})
        if not ok:
            findings.append(Finding(args.report_file, line, "CQ-NOT-FOUND",
                                    f"quote not in {', '.join(args.logs)} verbatim: `{quote[:120]}`"))
    if not quotes:
        findings.append(Finding(args.report_file, 1, "CQ-NONE", "the report quotes no log line (use a "
                                "'quoted line' column, a ```log block or 'log: `...`')"))
    counts = {p: count_lines(t) for p, t in log_texts.items()}
    for m in LENGTH_CLAIM.finditer(INNER_DOT.sub("_", text)):
        claimed = int(m.group(1).replace(",", ""))
        if claimed not in counts.values():
            findings.append(Finding(args.report_file, line_of(text, m.start()), "CQ-LENGTH",
                                    f"report says {claimed} lines; "
                                    + ", ".join(f"{p} has {n}" for p, n in counts.items())))
    human = f"{args.report_file}: {len(quotes)} quote(s), {sum(c['found'] for c in checked)} found in " \
            f"{', '.join(f'{p} ({n} lines)' for p, n in counts.items())}"
    reads = [ReadSummary(args.report_file, "markdown report", count_lines(text),
                         [f"line {line}" for line in sorted({line for line, _ in quotes})], {}, "quotes on")]
    reads += [log_read(p, t) for p, t in log_texts.items()]
    return report(TOOL, [args.report_file, *args.logs], findings, args.json,
                  {"quotes": checked, "log_lines": counts}, human, reads)


def log_read(path: str, text: str) -> ReadSummary:
    """What a quoted log gives to match against, and what is removed from it first."""
    ignored = {}
    if ANSI.search(text):
        ignored["colour codes"] = "removed before matching"
    redraws = sum(line.count("\r") for line in text.split("\n") if line.rstrip("\r"))
    if redraws:
        ignored[f"{redraws} carriage-return redraws"] = "each part matched as its own line"
    return ReadSummary(path, "text log", count_lines(text), ["every line"], ignored, "searched")


if __name__ == "__main__":
    run(TOOL, main)
