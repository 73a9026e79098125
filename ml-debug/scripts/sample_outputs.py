#!/usr/bin/env python3
"""Pick the rows of an evaluation JSONL to read in full: random, best, worst and anomalous.

The random pick is seeded and stable: rows are ranked by a hash of the seed and the row id, so
adding rows or reordering the file does not change which existing row is drawn. Best and worst are
by the score key (ties broken by line). Anomalous rows have a missing or non-finite score, an empty
output, the same output as rows with other inputs, an output copying its input, a length far from
the rest, a phrase repeated in a loop, or a refusal. When the outputs are class labels (a few
distinct short values, each repeated), repeats and lengths are what a classifier's outputs look
like, so those two checks are skipped and the label counts are printed instead. The sampling rule
is printed with the rows, as P1 step 3 and P3 step 4 ask. With --group-key (e.g. arm) every group
gets its own picks. When every output of a group (of 8 rows or more) is the same label, the classifier has collapsed
(COLLAPSED), which its mean score can hide. Exit 0 no anomalous row, 1 anomalous rows or a
collapse found, 2 unreadable input.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
from collections import Counter, defaultdict

import numpy as np

from mldebug_common import (Finding, InputError, ReadSummary, Record, make_parser, read_records, read_text,
                            records_read, report_each, run, to_float)

TOOL = "sample_outputs"
SCORE_KEYS = ("score", "reward", "correct", "accuracy", "acc", "judge_score", "pass")
TEXT_KEYS = ("output", "response", "completion", "generation", "prediction", "answer", "text")
INPUT_KEYS = ("input", "prompt", "question", "source")
REFUSAL = re.compile(r"^\W*(i can(?:'|\u2019)?t|i cannot|i'm sorry|i am sorry|as an ai)\b", re.IGNORECASE)
LENGTH_Z = 3.5
LOOP_NGRAM, LOOP_REPEATS = 4, 4
LABEL_MAX_WORDS, LABEL_MAX_DISTINCT = 3, 20
# A group this large answering with one label throughout has collapsed: a chance of 1 / classes per
# row makes it all but impossible for a model that tells the classes apart.
COLLAPSE_MIN_ROWS = 8


def label_counts(texts: list[str]) -> Counter | None:
    """Counts per output when the outputs look like class labels, else None.

    Labels are short (at most LABEL_MAX_WORDS words), few (at most LABEL_MAX_DISTINCT distinct
    values, and at most half as many as there are rows) and non-empty; free text is none of these.
    """
    filled = [t.strip() for t in texts if t.strip()]
    counts = Counter(filled)
    if len(filled) < 4 or any(len(t.split()) > LABEL_MAX_WORDS for t in filled):
        return None
    if len(counts) > min(LABEL_MAX_DISTINCT, len(filled) // 2):
        return None
    return counts


def collapsed(path: str, groups: dict[str, list[Record]], text_key: str, group_key: str | None) -> list[Finding]:
    """A group of class-label outputs in which every row got the same label (P1 step 3's collapse).

    The mean score can look fine (the majority class is often right), which is why the label counts
    are read, not the average.
    """
    out = []
    for group, rows in groups.items():
        labels = {str(r.fields.get(text_key, "")).strip() for r in rows}
        if len(rows) >= COLLAPSE_MIN_ROWS and len(labels) == 1:
            where = f"'{group_key}' = {group}: " if group_key else ""
            out.append(Finding(path, rows[0].line, "COLLAPSED",
                               f"{where}all {len(rows)} outputs are the label '{labels.pop()}'; the model "
                               "answers one class whatever the input, which a mean score hides"))
    return out


def pick_key(records: list[Record], wanted: str | None, candidates: tuple[str, ...], what: str,
             path: str, required: bool) -> str | None:
    """The key to use: `wanted` if given (must exist), else the first usual name present."""
    keys = list(dict.fromkeys(k for r in records for k in r.fields))
    if wanted:
        if wanted not in keys:
            raise InputError(f"{path}: {what} key '{wanted}' not found (keys: {', '.join(keys)})")
        return wanted
    found = next((k for k in candidates if k in keys), None)
    if found is None and required:
        raise InputError(f"{path}: no {what} key among {', '.join(candidates)}; pass --{what}-key "
                         f"(keys: {', '.join(keys)})")
    return found


def random_rank(seed: int, row_id: str) -> str:
    """Stable pseudo-random rank of a row: sha256 of seed and id."""
    return hashlib.sha256(f"{seed}:{row_id}".encode()).hexdigest()


def anomalies(records: list[Record], score_key: str, text_key: str | None,
              input_key: str | None, labels: bool = False) -> dict[int, list[str]]:
    """Reasons each row is anomalous, keyed by line; rows with no reason are absent.

    With `labels`, outputs are class labels: repeats and length are not anomalies.
    """
    reasons: dict[int, list[str]] = defaultdict(list)
    texts = {r.line: str(r.fields.get(text_key, "")) for r in records} if text_key else {}
    for r in records:
        score = to_float(r.fields.get(score_key))
        if score is None or not math.isfinite(score):
            reasons[r.line].append(f"score '{r.fields.get(score_key)}' is missing or not finite")
    if not text_key:
        return reasons
    # Collapse shows as one output given to different inputs; the same prompt answered alike by
    # two arms is not an anomaly, so rows are grouped by output and counted by distinct input.
    inputs_of: dict[str, set[str]] = defaultdict(set)
    for r in records:
        key = str(r.fields.get(input_key)) if input_key else str(r.line)
        inputs_of[texts[r.line].strip()].add(key)
    for r in records:
        text = texts[r.line].strip()
        if not text:
            reasons[r.line].append("empty output")
            continue
        if len(inputs_of[text]) > 1 and not labels:
            reasons[r.line].append(f"same output as rows with {len(inputs_of[text]) - 1} other "
                                   "input(s)")
        if input_key and text == str(r.fields.get(input_key, "")).strip():
            reasons[r.line].append("output copies its input")
        if REFUSAL.match(text):
            reasons[r.line].append("output is a refusal")
        words = text.lower().split()
        grams = Counter(tuple(words[i:i + LOOP_NGRAM]) for i in range(len(words) - LOOP_NGRAM + 1))
        if grams and max(grams.values()) >= LOOP_REPEATS:
            phrase, n = grams.most_common(1)[0]
            reasons[r.line].append(f"phrase '{' '.join(phrase)}' repeats {n} times")
    lengths = np.log1p([len(texts[r.line]) for r in records])
    if len(records) >= 8 and not labels:
        med = float(np.median(lengths))
        # Floor of 0.1 (about 10% in length) so near-identical lengths do not make every
        # small difference an outlier.
        scale = max(1.4826 * float(np.median(np.abs(lengths - med))), 0.1)
        for r, length in zip(records, lengths):
            z = (length - med) / scale
            if abs(z) > LENGTH_Z:
                kind = "long" if z > 0 else "short"
                reasons[r.line].append(f"output unusually {kind} ({len(texts[r.line])} chars, "
                                       f"robust z {z:+.1f} on log length)")
    return reasons


def choose(rows: list[Record], score_key: str, id_key: str | None, seed: int,
           k: int) -> dict[str, list[int]]:
    """Line numbers of the random, best and worst rows of one group (unscored rows never rank)."""
    def score(r: Record) -> float:
        return to_float(r.fields.get(score_key))

    def row_id(r: Record) -> str:
        return str(r.fields.get(id_key, r.line)) if id_key else str(r.line)

    scored = [r for r in rows if score(r) is not None and math.isfinite(score(r))]
    return {
        "random": [r.line for r in sorted(rows, key=lambda r: random_rank(seed, row_id(r)))[:k]],
        "best": [r.line for r in sorted(scored, key=lambda r: (-score(r), r.line))[:k]],
        "worst": [r.line for r in sorted(scored, key=lambda r: (score(r), r.line))[:k]],
    }


def sample(path: str, args: argparse.Namespace) -> tuple[list[Finding], dict, str, ReadSummary]:
    """Choose the rows for one file and format them with the sampling rule; also return the read line."""
    text = read_text(path)
    records = read_records(path, text, "jsonl")
    if not records:
        raise InputError(f"{path}: no rows")
    score_key = pick_key(records, args.score_key, SCORE_KEYS, "score", path, True)
    text_key = pick_key(records, args.text_key, TEXT_KEYS, "text", path, False)
    input_key = pick_key(records, args.input_key, INPUT_KEYS, "input", path, False)
    id_key = pick_key(records, args.id_key, ("id", "uid", "example_id"), "id", path, False)
    if args.group_key:
        pick_key(records, args.group_key, (), "group", path, True)
    counts = label_counts([str(r.fields.get(text_key, "")) for r in records]) if text_key else None
    reasons = anomalies(records, score_key, text_key, input_key, counts is not None)
    groups: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        groups[str(r.fields.get(args.group_key, "all")) if args.group_key else "all"].append(r)
    rule = (f"sampling rule: random = the {args.k} row(s) with the smallest sha256('{args.seed}:<"
            f"{id_key or 'line number'}>'); best/worst = highest/lowest '{score_key}' (ties: earlier "
            f"line); anomalous = every row failing a check (non-finite score"
            + ((f", empty, copied input, refusal on '{text_key}'; outputs are class labels ("
                + ", ".join(f"{k} {n}" for k, n in counts.most_common()) + "), so repeats and "
                "lengths are not checked" if counts else
                f", empty, same output for other inputs, copied input, length |z|>{LENGTH_Z}, "
                f"repeated phrase, refusal on '{text_key}'") if text_key
               else "; no text key, so output checks skipped") + ")"
            + (f"; per '{args.group_key}'" if args.group_key else ""))
    out_lines = [f"{path}: {len(records)} rows", rule]
    picks: dict[str, dict[str, list[int]]] = {}
    by_line = {r.line: r for r in records}
    for group, rows in groups.items():
        chosen = choose(rows, score_key, id_key, args.seed, args.k)
        chosen["anomalous"] = [r.line for r in rows if r.line in reasons]
        picks[group] = chosen
        for kind, lines in chosen.items():
            label = f"{kind} ({group})" if args.group_key else kind
            if not lines:
                out_lines.append(f"\n== {label}: none")
            for line in lines:
                why = f" [{'; '.join(reasons[line])}]" if kind == "anomalous" else ""
                out_lines.append(f"\n== {label}: line {line}{why}")
                out_lines.append(json.dumps(by_line[line].fields, indent=2, ensure_ascii=False))
    findings = [Finding(path, line, "ANOMALOUS", "; ".join(rs)) for line, rs in sorted(reasons.items())]
    if counts:
        findings += collapsed(path, groups, text_key, args.group_key)
    result = {"file": path, "rows": len(records), "score_key": score_key, "text_key": text_key,
              "label_counts": dict(counts) if counts else None,
              "rule": rule, "picks": picks,
              "records": {str(line): by_line[line].fields for g in picks.values()
                          for lines in g.values() for line in lines}}
    read = records_read(path, text, "jsonl", records, [score_key, text_key, input_key, id_key, args.group_key],
                        "keys")
    return findings, result, "\n".join(out_lines), read


def main() -> int:
    """Parse arguments, sample each file, print the rows and return the exit code."""
    parser = make_parser("sample_outputs.py", __doc__,
                         "Exit 0 no anomalous row, 1 anomalous rows or a collapse found, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="EVAL.jsonl",
                        help="evaluation rows, one JSON object a line")
    parser.add_argument("--score-key", help=f"score field (default: first of {', '.join(SCORE_KEYS)})")
    parser.add_argument("--text-key", help=f"output field (default: first of {', '.join(TEXT_KEYS)})")
    parser.add_argument("--input-key", help=f"input field (default: first of {', '.join(INPUT_KEYS)})")
    parser.add_argument("--id-key", help="row id for the random draw (default: id, else line number)")
    parser.add_argument("--group-key", help="pick separately per value of this field, e.g. arm")
    parser.add_argument("--k", type=int, default=1, help="rows per random/best/worst pick (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random pick (default 0)")
    args = parser.parse_args()
    if args.k < 1:
        raise InputError("--k must be at least 1")
    return report_each(TOOL, args.files, args.json, lambda path: sample(path, args), "samples")


if __name__ == "__main__":
    run(TOOL, main)
