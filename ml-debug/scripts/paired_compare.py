#!/usr/bin/env python3
"""Compare arm A with arm B, paired by seed, in the metric's own units (P3 step 5).

Reads a CSV or JSONL with columns `arm`, `seed` and a metric (--metric, default the last numeric
column). For each seed present in both arms it takes the raw difference A - B, then reports the
mean and median difference, a seeded percentile bootstrap interval, the sign count, an exact
sign-flip p-value for small samples, and the gap against the spread between seeds of one arm.
The verdict is "unresolved" with fewer than --min-seeds pairs, when the interval spans zero, or
when the sign-flip p-value exceeds 1 - level; an unresolved verdict says how many pairs would
resolve the question at the observed spread (80% power for the observed gap, and never fewer
than a unanimous sign-flip test needs to reach its level).
Seeds present in one arm only and non-finite values are reported, never dropped silently.
Exit 0 resolved and clean, 1 unresolved or data problems, 2 unreadable input.
"""
from __future__ import annotations

import argparse
import itertools
import math
from statistics import NormalDist
from typing import Callable

import numpy as np

from mldebug_common import (Finding, InputError, ReadSummary, fmt_num, make_parser, read_records, read_text,
                            records_read, report_each, run, sniff_format, to_float)

TOOL = "paired_compare"
EXACT_LIMIT = 16  # up to 2**16 sign patterns are enumerated exactly; beyond that, sampled


def load_rows(path: str) -> tuple[list[dict], list[int], Callable[[list[str]], ReadSummary]]:
    """Rows as dicts, their line numbers, and a maker of the read line given the columns used.

    The file is CSV/TSV or JSONL, chosen by extension or content.
    """
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{path}: empty file")
    fmt = "jsonl" if sniff_format(path, text) == "jsonl" else "csv"
    records = read_records(path, text, fmt)
    return ([r.fields for r in records], [r.line for r in records],
            lambda used: records_read(path, text, fmt, records, used))


def default_metric(rows: list[dict], exclude: set[str]) -> str:
    """The last column whose values are all numeric, skipping the arm and pairing columns."""
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    numeric = [c for c in columns if c not in exclude
               and all(to_float(r.get(c)) is not None for r in rows if r.get(c) not in (None, ""))
               and any(to_float(r.get(c)) is not None for r in rows)]
    if not numeric:
        raise InputError("no numeric metric column found; pass --metric")
    return numeric[-1]


def bootstrap_interval(diffs: np.ndarray, level: float, n_boot: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean difference, with a fixed random generator."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diffs), size=(n_boot, len(diffs)))
    means = diffs[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def sign_flip_p(diffs: np.ndarray, seed: int) -> float:
    """Two-sided p-value of the mean difference under random sign flips (exact for small n)."""
    n = len(diffs)
    observed = abs(diffs.mean())
    if n <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(20000, n))
    means = np.abs((signs * diffs).mean(axis=1))
    return float(np.mean(means >= observed - 1e-12))


def seeds_to_resolve(diffs: np.ndarray, level: float) -> tuple[int | None, str]:
    """Pairs needed to resolve the question at the observed gap and spread, and why.

    Two bounds: the fewest pairs whose unanimous signs give a sign-flip p of 2 / 2**n at or below
    1 - level, and the pairs for 80% power of a paired test at the observed mean and standard
    deviation of the differences, n = ((z_(1 - alpha/2) + z_0.8) sd / mean)**2. None when there is
    no gap to detect or no spread measured.
    """
    alpha = 1 - level
    unanimous = math.ceil(1 + math.log2(1 / alpha))
    mean = float(diffs.mean())
    sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else float("nan")
    if not math.isfinite(sd):
        return None, (f"one pair measures no spread; a sign-flip test needs at least {unanimous} "
                      f"pairs that all agree to reach p <= {alpha:.3g}")
    if mean == 0:
        return None, "the observed gap is zero; more seeds would bound it, not resolve a direction"
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(0.8)
    powered = math.ceil((z * sd / abs(mean)) ** 2)
    needed = max(unanimous, powered)
    more = f" ({needed - len(diffs)} more)" if needed > len(diffs) else ""
    return needed, (f"at the observed gap {fmt_num(mean)} and spread of the differences (sd "
                    f"{fmt_num(sd)}) about {needed} pairs{more} would resolve it: {powered} for 80% power, "
                    f"and no fewer than {unanimous} because a sign-flip test cannot reach p <= "
                    f"{alpha:.3g} with fewer pairs however they agree")


def compare(path: str, args: argparse.Namespace) -> tuple[list[Finding], dict, str, ReadSummary]:
    """Pair the two arms by seed and compute the comparison; return findings, JSON, text and the read line."""
    rows, lines, read = load_rows(path)
    if not rows:
        raise InputError(f"{path}: no rows")
    for col in (args.arm_key, args.pair_key):
        if not any(col in r for r in rows):
            raise InputError(f"{path}: no '{col}' column")
    metric = args.metric or default_metric(rows, {args.arm_key, args.pair_key})
    if not any(metric in r for r in rows):
        raise InputError(f"{path}: no '{metric}' column")
    arms = list(dict.fromkeys(str(r.get(args.arm_key)) for r in rows))
    for arm in (args.a, args.b):
        if arm and arm not in arms:
            raise InputError(f"{path}: arm '{arm}' not found (arms: {', '.join(arms)})")
    if not (args.a and args.b) and len(arms) != 2:
        raise InputError(f"{path}: {len(arms)} arm(s) ({', '.join(arms)}); name two with --a and --b")
    rest = [x for x in arms if x not in (args.a, args.b)]
    a = args.a or rest.pop(0)
    b = args.b or rest.pop(0)
    if a == b:
        raise InputError(f"{path}: --a and --b name the same arm '{a}'")
    findings: list[Finding] = []
    values: dict[str, dict[str, float]] = {a: {}, b: {}}
    for row, line in zip(rows, lines):
        arm, key = str(row.get(args.arm_key)), str(row.get(args.pair_key))
        if arm not in values:
            continue
        if key in values[arm]:
            raise InputError(f"{path}:{line}: arm '{arm}' has two rows for {args.pair_key} '{key}'; "
                             f"aggregate them first or pair on another column with --pair-key")
        x = to_float(row.get(metric))
        if x is None or not math.isfinite(x):
            findings.append(Finding(path, line, "NONFINITE", f"arm '{arm}' {args.pair_key} {key}: "
                                    f"{metric} is '{row.get(metric)}'; a failed run is a result, "
                                    "investigate it rather than dropping it"))
            x = float("nan")
        values[arm][key] = x
    for arm, other in ((a, b), (b, a)):
        for key in values[arm]:
            if key not in values[other]:
                findings.append(Finding(path, 1, "UNPAIRED", f"{args.pair_key} {key} has arm '{arm}' "
                                        f"but not '{other}'; run it or say why it is missing"))
    keys = [k for k in values[a] if k in values[b]
            and math.isfinite(values[a][k]) and math.isfinite(values[b][k])]
    xa = np.array([values[a][k] for k in keys])
    xb = np.array([values[b][k] for k in keys])
    diffs = xa - xb
    result: dict = {"file": path, "metric": metric, "a": a, "b": b, "pair_key": args.pair_key,
                    "n_pairs": len(keys), "pairs": {k: float(d) for k, d in zip(keys, diffs)}}
    text = [f"{path}: {metric}, {a} - {b}, paired by {args.pair_key}, {len(keys)} pair(s)"]
    if len(keys) == 0:
        result["verdict"] = "unresolved"
        findings.append(Finding(path, 1, "UNRESOLVED", "no complete pairs to compare"))
        return findings, result, "\n".join(text), read([args.arm_key, args.pair_key, metric])
    wins, losses = int(np.sum(diffs > 0)), int(np.sum(diffs < 0))
    spread_a = float(np.std(xa, ddof=1)) if len(xa) > 1 else float("nan")
    spread_b = float(np.std(xb, ddof=1)) if len(xb) > 1 else float("nan")
    mean = float(diffs.mean())
    result.update({"mean_diff": mean, "median_diff": float(np.median(diffs)),
                   "sd_diff": float(np.std(diffs, ddof=1)) if len(diffs) > 1 else float("nan"),
                   "sign_count": {"a_higher": wins, "b_higher": losses,
                                  "ties": len(diffs) - wins - losses},
                   "seed_spread": {a: spread_a, b: spread_b}})
    text.append("  per pair: " + ", ".join(f"{k}: {fmt_num(d)}" for k, d in zip(keys, diffs)))
    text.append(f"  mean difference {fmt_num(mean)}, median {fmt_num(result['median_diff'])}")
    ties = result["sign_count"]["ties"]
    text.append(f"  sign count: {a} higher in {wins}, {b} higher in {losses}, ties {ties}")
    text.append(f"  spread between seeds (sd): {a} {fmt_num(spread_a)}, {b} {fmt_num(spread_b)}")
    needed, why_needed = seeds_to_resolve(diffs, args.level)
    if len(keys) < args.min_seeds:
        needed = max(needed or 0, args.min_seeds)
        result.update({"verdict": "unresolved", "pairs_to_resolve": needed})
        text.append(f"  verdict: unresolved ({len(keys)} pair(s); need at least {args.min_seeds})")
        text.append(f"  {why_needed}")
        findings.append(Finding(path, 1, "UNRESOLVED", f"{len(keys)} paired {args.pair_key}(s) is too "
                                f"few to separate the arms (need {args.min_seeds}); {why_needed}"))
        return findings, result, "\n".join(text), read([args.arm_key, args.pair_key, metric])
    lo, hi = bootstrap_interval(diffs, args.level, args.bootstrap, args.seed)
    p = sign_flip_p(diffs, args.seed)
    spread = max(spread_a, spread_b)
    ratio = abs(mean) / spread if spread > 0 else float("inf")
    result.update({"interval": [lo, hi], "level": args.level, "sign_flip_p": p,
                   "gap_over_spread": ratio})
    text.append(f"  {args.level:.0%} bootstrap interval of the mean ({args.bootstrap} resamples, seed "
                f"{args.seed}): [{fmt_num(lo)}, {fmt_num(hi)}]")
    text.append(f"  sign-flip p = {p:.3g}; |gap| / larger seed spread = {fmt_num(ratio)}")
    if len(keys) <= 5:
        text.append(f"  note: with {len(keys)} pairs the bootstrap has few distinct resamples; "
                    "read the sign count and p alongside it")
    alpha = 1 - args.level
    if lo <= 0 <= hi or p > alpha:
        # Both must agree: with few pairs the percentile bootstrap is too narrow, and the sign-flip
        # test is what says so (6 unanimous pairs is the fewest that can reach p <= 0.05).
        why = (f"the interval [{fmt_num(lo)}, {fmt_num(hi)}] spans zero" if lo <= 0 <= hi
               else f"sign-flip p = {p:.3g} > {alpha:.3g}")
        result.update({"verdict": "unresolved", "pairs_to_resolve": needed})
        text.append(f"  verdict: unresolved ({why}: uncertain, not 'no effect')")
        text.append(f"  {why_needed}")
        findings.append(Finding(path, 1, "UNRESOLVED", f"{why}; the gap is not separated from "
                                f"seed noise; {why_needed}"))
    else:
        winner = a if mean > 0 else b
        result["verdict"] = f"{winner} higher"
        text.append(f"  verdict: {winner} higher on {metric} (interval excludes zero)")
    return findings, result, "\n".join(text), read([args.arm_key, args.pair_key, metric])


def main() -> int:
    """Parse arguments, compare the arms in each file, print the report and return the exit code."""
    parser = make_parser("paired_compare.py", __doc__,
                         "Exit 0 resolved and clean, 1 unresolved or data problems, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="RESULTS", help="CSV or JSONL with arm, seed, metric")
    parser.add_argument("--metric", help="metric column (default: last numeric column)")
    parser.add_argument("--a", help="arm A (default: first arm in the file)")
    parser.add_argument("--b", help="arm B (default: second arm in the file)")
    parser.add_argument("--arm-key", default="arm", help="arm column (default arm)")
    parser.add_argument("--pair-key", default="seed", help="column that pairs rows (default seed)")
    parser.add_argument("--min-seeds", type=int, default=3, help="fewest pairs for a verdict (default 3)")
    parser.add_argument("--bootstrap", type=int, default=10000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the bootstrap (default 0)")
    args = parser.parse_args()
    if not 0 < args.level < 1 or args.bootstrap < 1 or args.min_seeds < 1:
        raise InputError("--level must be in (0, 1); --bootstrap and --min-seeds must be positive")
    return report_each(TOOL, args.files, args.json, lambda path: compare(path, args), "comparisons")


if __name__ == "__main__":
    run(TOOL, main)
