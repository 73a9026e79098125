#!/usr/bin/env python3
"""Check the filled ml-debug tables (P1-P4 and the exercise tables) in a reply or a file.

Tables are recognised by their header row, so they can sit anywhere in a Markdown document.
Rules: no empty or placeholder cell (n/a, none, xx, ?, (blank), ..., -, tbd count as empty);
"unknown" is allowed only with what would fill it, or as "unknown: same [as the X column]" after a
cell of its row that says it; every credence pairs a word with a number inside that word's range;
P1 rows quote a log line (or say "unknown" and what would settle it); P1 prediction verdicts and
anomaly statuses use the fixed words; P2 "metric exists?" is yes/no and a "no" names the metric to
add; the P3 lists are complete (three or more diagnoses with one unknown cause, exactly five ways
the result is invalid, random/best/worst/anomalous samples, one seed means unresolved); P4 rows
cite the reference's file:line. Exit 0 clean, 1 findings, 2 unreadable input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mldebug_common import (Finding, ReadSummary, Table, cell_problem, check_credence_cell, check_documents,
                            count_lines, credence_problem, find_credences, line_of, parse_tables, run)

TOOL = "check_tables"


@dataclass(frozen=True)
class Kind:
    """A table the procedure defines: its name, columns, and which columns hold credences."""

    name: str
    columns: tuple[str, ...]
    credence_columns: tuple[str, ...] = ()
    rule: str | None = None  # suffix of the TableChecker method holding this table's own rules


KINDS = (
    Kind("P1", ("risky part", "expected", "start", "early", "middle", "end", "quoted line"),
         rule="p1_quotes"),
    Kind("P1 prediction check", ("prediction", "observation", "verdict", "prior", "posterior"),
         ("prior", "posterior"), "p1_verdicts"),
    Kind("P1 anomalies", ("anomaly", "status"), rule="p1_anomalies"),
    Kind("P2", ("risky part", "what i expect to see", "too weak", "too strong", "buggy",
                "metric exists?"), rule="p2_metric_exists"),
    Kind("P2 metric confounds", ("metric i rely on", "what else would move it the same way")),
    Kind("P3 diagnoses", ("diagnosis", "credence", "strongest evidence for",
                          "strongest evidence against"), ("credence",), "p3_diagnoses"),
    Kind("P3 unsupported sentences", ("confident sentence in my draft", "evidence i can point at")),
    Kind("P3 invalid", ("way this result could be invalid", "check that would settle it"),
         rule="p3_invalid"),
    Kind("P3 samples", ("sample", "how chosen", "complete output"), rule="p3_samples"),
    Kind("P3 comparison", ("claim", "baseline", "chance level", "seeds per arm", "gap",
                           "spread between seeds of one arm", "verdict"), rule="p3_comparison"),
    Kind("P4", ("feature", "theirs (file:line)", "mine", "same?"), rule="p4_reference"),
    Kind("E1 evidence", ("supplied evidence", "literal observation", "what it rules in",
                         "what it does not establish")),
    Kind("E2 bug hunt", ("candidate bug or misconception", "mechanism", "evidence for",
                         "evidence against", "decisive check")),
    Kind("E3 diagnoses", ("hypothesis", "credence", "predicts", "evidence in prompt",
                          "cheapest discriminator"), ("credence",)),
    Kind("E5 review", ("stage", "inputs and shape or units", "operation", "output",
                       "assumption that could fail")),
    Kind("E6 reference", ("item", "reference formulation or baseline", "proposed formulation",
                          "consequence")),
    Kind("E7 traces", ("example or trace", "expected behavior", "actual behavior",
                       "first meaningful mismatch", "implication")),
)
P3_REQUIRED = ("P3 diagnoses", "P3 invalid", "P3 samples")

QUOTED = re.compile(r"`[^`]+`|\"[^\"]+\"|\u201c[^\u201d]+\u201d")
FILE_LINE = re.compile(r"[\w./-]+:\d+|#L\d+")
VERDICTS = ("supported", "contradicted", "unresolved")
ANOMALY_STATUS = re.compile(r"^\W*(explained|being investigated)", re.IGNORECASE)
UNKNOWN_CAUSE = re.compile(r"\bunknown\b|something (else|not listed)|not (yet )?listed|unlisted",
                           re.IGNORECASE)
NO_EVIDENCE = re.compile(r"^\W*(none|nothing|no evidence|n/?a)\b", re.IGNORECASE)
UNTESTED = re.compile(r"not tested|untested|have not tested", re.IGNORECASE)
SAMPLE_KINDS = ("random", "best", "worst", "anomalous")


def classify(table: Table) -> tuple[Kind | None, list[str]]:
    """Match a table to a Kind by its first column and most of its header; list missing columns."""
    best, best_score = None, 0
    for kind in KINDS:
        if not table.header or table.header[0] != kind.columns[0]:
            continue
        score = sum(c in table.header for c in kind.columns)
        if score * 2 >= len(kind.columns) and score > best_score:
            best, best_score = kind, score
    if best is None:
        return None, []
    return best, [c for c in best.columns if c not in table.header]


class TableChecker:
    """Collects findings for one document; one method per rule family."""

    def __init__(self, path: str, text: str):
        self.path, self.text = path, text
        self.findings: list[Finding] = []

    def add(self, line: int, rule: str, message: str) -> None:
        """Record one finding."""
        self.findings.append(Finding(self.path, line, rule, message))

    def read_summary(self) -> ReadSummary:
        """The procedure's tables recognised (by kind and line) and the other tables passed over."""
        names, ignored = [], {}
        for table in parse_tables(self.text):
            kind, _ = classify(table)
            if kind:
                names.append(f"{kind.name} (line {table.line})")
            else:
                label = f"'{' | '.join(table.raw_header)[:40]}' (line {table.line})"
                ignored[label] = "not a P1-P4 or exercise table"
        return ReadSummary(self.path, "markdown", count_lines(self.text), names, ignored, "tables")

    def check(self) -> list[Finding]:
        """Run every rule over every recognised table, then the document-wide credence pass."""
        kinds_found: dict[str, int] = {}
        for table in parse_tables(self.text):
            kind, missing = classify(table)
            if kind is None:
                continue
            kinds_found.setdefault(kind.name, table.line)
            if missing:
                self.add(table.line, "TABLE-COLUMNS",
                         f"{kind.name} table is missing column(s): {', '.join(missing)}")
            if not table.rows:
                self.add(table.line, "TABLE-NO-ROWS", f"{kind.name} table has a header but no rows")
            self.check_cells(kind, table)
            if kind.rule:
                getattr(self, "rule_" + kind.rule)(table)
        if not kinds_found:
            self.add(1, "NO-TABLES", "no P1-P4 or exercise table found (headers must match the "
                                     "templates in ml-debug/assets)")
        if any(k.startswith("P3") for k in kinds_found):
            first = min(v for k, v in kinds_found.items() if k.startswith("P3"))
            for name in P3_REQUIRED:
                if name not in kinds_found:
                    self.add(first, "P3-MISSING-LIST", f"P3 reply lacks the {name} table")
        self.credences_in_prose()
        self.findings.sort(key=lambda f: f.line)
        return self.findings

    def cells(self, table: Table, column: str):
        """Yield (row line, row number, cell text) for one column, skipping absent columns."""
        idx = table.column(column)
        if idx is None:
            return
        for n, (row, line) in enumerate(zip(table.rows, table.row_lines), 1):
            yield line, n, row[idx] if idx < len(row) else ""

    def check_cells(self, kind: Kind, table: Table) -> None:
        """No empty or placeholder cells; "unknown" must say what would fill it; credences pair."""
        for n, (row, line) in enumerate(zip(table.rows, table.row_lines), 1):
            earlier: dict[str, str] = {}
            for i, name in enumerate(table.header):
                cell = row[i] if i < len(row) else ""
                problem = cell_problem(cell, earlier)
                earlier[name] = cell
                if problem:
                    rule = "CELL-UNKNOWN" if problem.startswith("'unknown") else "CELL-EMPTY"
                    self.add(line, rule, f"{kind.name} row {n}, column '{table.raw_header[i]}': {problem}")
                elif name in kind.credence_columns:
                    msg = check_credence_cell(cell)
                    if msg:
                        self.add(line, "CREDENCE", f"{kind.name} row {n}, column '{name}': {msg}")

    def require(self, table: Table, column: str, ok, rule: str, message: str) -> None:
        """Flag each filled cell of `column` that fails `ok`; `{n}` in the message is the row."""
        for line, n, cell in self.cells(table, column):
            if cell.strip() and not ok(cell):
                self.add(line, rule, message.format(n=n))

    def rule_p1_quotes(self, table: Table) -> None:
        """P1: the quoted line column must hold a quote from the log."""
        # "unknown: log X from the next run" is the procedure's answer when no line can settle a row.
        self.require(table, "quoted line",
                     lambda c: QUOTED.search(c) or c.strip().lower().startswith("unknown"), "P1-QUOTE",
                     "P1 row {n}: 'quoted line' must quote the log line in backticks or double quotes")

    def rule_p1_verdicts(self, table: Table) -> None:
        """P1 step 5: each prediction is supported, contradicted or unresolved."""
        self.require(table, "verdict", lambda c: c.strip().lower().startswith(VERDICTS), "PRED-VERDICT",
                     "P1 prediction check row {n}: verdict must be supported, contradicted or unresolved")

    def rule_p1_anomalies(self, table: Table) -> None:
        """P1 step 4: every anomaly ends explained or being investigated."""
        self.require(table, "status", ANOMALY_STATUS.match, "P1-ANOMALY-STATUS",
                     "P1 anomalies row {n}: status must begin with 'explained' or 'being investigated'")

    def rule_p2_metric_exists(self, table: Table) -> None:
        """P2: metric exists? is yes or no, and a no names the metric that will be added."""
        for line, n, cell in self.cells(table, "metric exists?"):
            words = re.findall(r"[A-Za-z0-9_./-]+", cell.lower())
            if not words:
                continue
            if words[0] not in ("yes", "no"):
                self.add(line, "P2-METRIC-EXISTS", f"P2 row {n}: 'metric exists?' must start with yes or no")
            elif words[0] == "no" and len(words) < 3:
                self.add(line, "P2-METRIC-MISSING", f"P2 row {n}: a 'no' must name the metric to add "
                                                    "before queueing, e.g. 'no: add per-layer grad norm'")

    def rule_p3_diagnoses(self, table: Table) -> None:
        """P3 steps 1-2: three or more diagnoses, one unknown cause, untested ones said so."""
        if len(table.rows) < 3:
            self.add(table.line, "P3-DIAGNOSES-COUNT",
                     f"P3 diagnoses table has {len(table.rows)} row(s); write three or more")
        names = [cell for _, _, cell in self.cells(table, "diagnosis")]
        if names and not any(UNKNOWN_CAUSE.search(c) for c in names):
            self.add(table.line, "P3-UNKNOWN-CAUSE", "P3 diagnoses leave no probability on an "
                                                     "unknown cause; add a row for it")
        for line, n, cell in self.cells(table, "strongest evidence against"):
            if NO_EVIDENCE.match(cell) and not UNTESTED.search(cell):
                self.add(line, "P3-UNTESTED", f"P3 diagnoses row {n}: no evidence against means "
                                              "'not tested'; say so and lower the credence")

    def rule_p3_invalid(self, table: Table) -> None:
        """P3 step 3: exactly five ways the result could be invalid, each with its check."""
        if len(table.rows) != 5:
            self.add(table.line, "P3-INVALID-COUNT",
                     f"P3 invalid table has {len(table.rows)} row(s); write exactly five ways, "
                     "each with its check")

    def rule_p3_samples(self, table: Table) -> None:
        """P3 step 4: a random, a best, a worst and an anomalous sample, each with its rule."""
        labels = " ".join(cell.lower() for _, _, cell in self.cells(table, "sample"))
        missing = [k for k in SAMPLE_KINDS if k not in labels]
        if missing:
            self.add(table.line, "P3-SAMPLES", f"P3 samples lack: {', '.join(missing)} (write "
                                               "'anomalous: none found by <rule>' if there is none)")

    def rule_p3_comparison(self, table: Table) -> None:
        """P3 step 5: with one seed per arm the only allowed verdict is unresolved."""
        seeds_idx, verdict_idx = table.column("seeds per arm"), table.column("verdict")
        if seeds_idx is None or verdict_idx is None:
            return
        for n, (row, line) in enumerate(zip(table.rows, table.row_lines), 1):
            seeds = re.findall(r"\d+", row[seeds_idx] if seeds_idx < len(row) else "")
            verdict = row[verdict_idx] if verdict_idx < len(row) else ""
            if seeds and min(int(s) for s in seeds) < 2 and "unresolved" not in verdict.lower():
                self.add(line, "P3-ONE-SEED", f"P3 comparison row {n}: one seed per arm cannot "
                                              "separate the arms; the verdict is 'unresolved'")

    def rule_p4_reference(self, table: Table) -> None:
        """P4: each row cites the reference's file and line; same? is a plain answer."""
        if "no reference exists" not in self.text.lower():
            self.require(table, "theirs (file:line)", FILE_LINE.search, "P4-FILE-LINE",
                         "P4 row {n}: 'theirs' must cite file:line of the reference implementation")
        self.require(table, "same?", lambda c: re.match(r"\W*(yes|no|partly|partial|unknown)\b", c, re.I),
                     "P4-SAME", "P4 row {n}: 'same?' must start with yes, no, partly or unknown")

    def credences_in_prose(self) -> None:
        """Anywhere in the document, a credence word next to a number must agree with the scale."""
        reported = {f.line for f in self.findings if f.rule == "CREDENCE"}
        for c in find_credences(self.text):
            problem = credence_problem(c.word, c.number)
            line = line_of(self.text, c.start)
            if problem and line not in reported:
                self.add(line, "CREDENCE", problem)


def check_file(path: str, text: str) -> tuple[list[Finding], ReadSummary]:
    """The findings of one document and what was read from it."""
    checker = TableChecker(path, text)
    return checker.check(), checker.read_summary()


def main() -> int:
    """Check each file given on the command line and return the exit code."""
    return check_documents(TOOL, __doc__, "Templates: ml-debug/assets/P1_run_finished.md ... "
                           "P4_stuck.md. Exit 0 clean, 1 findings, 2 unreadable input.", "FILE",
                           "Markdown reply or file to check", check_file)


if __name__ == "__main__":
    run(TOOL, main)
