"""Count, for each set of fired triage rules, how many findings the real corpus gives and how many
are right (a developer tool; issue 14 item 2).

Runs the root-cause command on every tests/data/real/<case> as a user runs it and compares each
report with the case's ``expected``: the top root cause of a faulty case is one finding, right when
it names the expected category, side and modules; every root cause of a clean case is a wrong
finding. Writes

    rl-consistency-analysis/scripts/rootcause/calibration.json   read by rootcause/credence.py
    rl-consistency-analysis/references/calibration.md           the same table, for readers

The corpus holds planted faults of a few kinds on small models: the counts bound, they do not
prove, how often a rule is right on users' dumps.

    python tools/calibrate_rules.py
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "rl-consistency-analysis" / "scripts"))
from real.corpus_check import CORPUS, case_doc, disagreements, run_default_command  # noqa: E402
from rootcause.credence import bin_key  # noqa: E402

OUT_JSON = REPO / "rl-consistency-analysis" / "scripts" / "rootcause" / "calibration.json"
OUT_MD = REPO / "rl-consistency-analysis" / "references" / "calibration.md"
MIN_FINDINGS = 20


def tally(reports: dict) -> tuple[Counter, Counter, list[str], list[tuple]]:
    """(findings per bin, right findings per bin, cases with no report, per-case matrix rows)."""
    seen, right, failed, matrix = Counter(), Counter(), [], []
    for name, (code, err, doc) in sorted(reports.items()):
        if doc is None:
            failed.append(name)
            continue
        expected = case_doc(name)["expected"]
        causes = doc.get("root_causes") or []
        ok = not disagreements(expected, code, err, doc)
        fired = [bin_key(f["rules_fired"]) for f in (causes if expected["verdict"] == "clean" else causes[:1])]
        for k in fired:
            seen[k] += 1
            right[k] += ok and expected["verdict"] != "clean"
        matrix.append((name, expected.get("category") or expected["verdict"], ", ".join(fired) or "-", ok))
    return seen, right, failed, matrix


def markdown(seen: Counter, right: Counter, cases: int, matrix: list[tuple]) -> str:
    cases_rows = "\n".join(f"| {n} | {e} | {f} | {'yes' if ok else 'no'} |" for n, e, f, ok in matrix)
    rows = "\n".join(f"| `{k}` | {seen[k]} | {right[k]} | {'yes' if seen[k] >= MIN_FINDINGS else 'no'} |"
                     for k in sorted(seen, key=lambda k: (-seen[k], k)))
    return f"""# Calibration of the triage rules

Written by `tools/calibrate_rules.py` from the real corpus (`tests/data/real`, {cases} cases);
do not edit by hand. A bin is the set of rules a finding fired (`rules_fired`: the category row,
then the adjustments). A finding is the top root cause of a faulty case (right when category,
side and modules are the expected ones) or any root cause of a clean case (always wrong).

output_5 gives a credence word (`confidence_word`) only for findings whose bin holds at least
{MIN_FINDINGS} findings here; elsewhere `confidence_word` is `"uncalibrated"` and only the number
`confidence` (from the rule table) is given. The corpus holds planted faults of a few kinds on small
models: these counts bound, they do not prove, how often a rule is right on users' dumps. The
synthetic corpus (tests/synth) is not counted yet: its expected answers live in the tests.

| rules fired | findings | right | word given |
|---|---|---|---|
{rows}

## Which rules fire on which pair
The top root cause of each faulty case, every root cause of a clean one; "right" is whether the
report agrees with the case's `expected` (for a clean case: reported nothing).

| case | expected | rules fired | right |
|---|---|---|---|
{cases_rows}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="cases run at once (default 2)")
    args = ap.parse_args(argv)
    names = sorted(p.parent.name for p in CORPUS.glob("*/case.json"))
    with tempfile.TemporaryDirectory() as tmp:
        reports = run_default_command(names, tmp, workers=args.workers)
    seen, right, failed, matrix = tally(reports)
    doc = {"schema_version": "1.0", "min_findings": MIN_FINDINGS, "corpus": "tests/data/real", "cases": len(names),
           "bins": {k: {"findings": seen[k], "right": right[k]} for k in sorted(seen)}}
    OUT_JSON.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    OUT_MD.write_text(markdown(seen, right, len(names), matrix), encoding="utf-8")
    print(f"{len(names)} cases, {sum(seen.values())} findings in {len(seen)} bins; no report: {failed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
