#!/usr/bin/env python3
"""Read the loss log of an overfit-a-few-samples run and say whether the final loss is near zero.

P2 step 6: before queueing a real run, train on about 20 samples until the model memorises them.
A model that cannot has a bug in its loss, wiring or data. The log may be JSONL, CSV or key=value
text. "Near zero" is the final logged value at or below --target (default 0.05); set it for your
loss (label smoothing and MSE on unscaled targets have floors above zero), or use --relative to
compare with the first value. The training loss is graded (`loss`, `train_loss`, `train/loss`,
else the first loss column not named eval, val or test), and the report names the column. With
--num-classes the first value is also compared with the loss of a uniform guess, ln(C): a randomly
initialised classifier starts near it; a pretrained model (--pretrained, e.g. an LM with C its
vocabulary) starts well below it, so only a start above it is flagged.
Exit 0 near zero, 1 not near zero (or other findings), 2 unreadable input.
"""
from __future__ import annotations

import argparse
import math
import re

import numpy as np

from metric_logs import load_metric_log
from mldebug_common import (Finding, InputError, ReadSummary, fmt_num, make_parser,
                            report_each, run)

TOOL = "check_overfit"
TRAIN_LOSS_NAMES = ("loss", "train_loss", "train/loss", "training_loss", "train/train_loss")
HELD_OUT = re.compile(r"(?:^|[/_.])(?:eval|val|valid|validation|test|dev)(?:$|[/_.])", re.IGNORECASE)


def loss_column(keys: list[str]) -> tuple[str | None, list[str]]:
    """The training-loss column to grade, and the held-out loss columns left ungraded."""
    losses = [k for k in keys if "loss" in k.lower()]
    held_out = [k for k in losses if HELD_OUT.search(k)]
    train = next((k for k in TRAIN_LOSS_NAMES if k in keys), None) or \
        next((k for k in losses if k not in held_out), None)
    return train, held_out


def check(path: str, args: argparse.Namespace) -> tuple[list[Finding], dict, str, ReadSummary]:
    """Judge one log; return findings, the JSON summary, the human summary and the read line."""
    log = load_metric_log(path, args.format)
    keys = log.keys()
    train, held_out = loss_column(keys)
    metric = args.metric or train
    if metric is None or metric not in keys:
        raise InputError(f"{path}: no training loss column{f' {metric!r}' if metric else ''} "
                         f"(keys: {', '.join(keys)}); pass --metric")
    step_key = log.step_key(args.step_key)
    series = log.series(metric, step_key)
    first_step, first, first_row = series[0]
    last_step, final, last_row = series[-1]
    values = np.array([v for _, v, _ in series])
    finite = values[np.isfinite(values)]
    findings: list[Finding] = []
    if args.relative is not None:
        threshold = args.relative * abs(first)
        rule_text = f"{args.relative:g} x the first value ({fmt_num(first)}) = {fmt_num(threshold)}"
    else:
        threshold = args.target
        rule_text = f"target {fmt_num(threshold)}"
    near_zero = math.isfinite(final) and final <= threshold
    summary = {"file": path, "metric": metric, "not_graded": [k for k in held_out if k != metric],
               "first": first, "final": final,
               "first_step": first_step, "final_step": last_step, "points": len(series),
               "threshold": threshold, "near_zero": near_zero,
               "minimum": float(finite.min()) if finite.size else float("nan")}
    ratio = final / first if first and math.isfinite(final) else float("nan")
    text = [f"{path}: {metric} {fmt_num(first)} (step {fmt_num(first_step)}) -> {fmt_num(final)} "
            f"(step {fmt_num(last_step)}), {len(series)} points, final/first = {fmt_num(ratio)}",
            f"  graded column: {metric}" + (f" (not graded: {', '.join(k for k in held_out if k != metric)})"
                                             if [k for k in held_out if k != metric] else ""),
            f"  near zero: {'yes' if near_zero else 'NO'} ({rule_text})"]
    if not near_zero:
        why = "is not finite" if not math.isfinite(final) else f"is above {rule_text}"
        if finite.size and math.isfinite(final) and final > 2 * finite.min() and finite.min() <= threshold:
            why += f"; it reached {fmt_num(float(finite.min()))} earlier and came back up"
        findings.append(Finding(path, last_row.line, "OVERFIT-NOT-ZERO",
                                f"final {metric} {fmt_num(final)} {why}; a model that cannot "
                                "memorise a few samples has a bug, fix it before the real run"))
    if args.num_classes:
        chance = math.log(args.num_classes)
        summary["chance_loss"] = chance
        summary["init"] = "pretrained" if args.pretrained else "random"
        if args.pretrained:
            text.append(f"  first value {fmt_num(first)} vs ln({args.num_classes}) = {fmt_num(chance)}, "
                        "the uniform-guess loss; a pretrained model starts below it")
            if first > 2 * chance:
                findings.append(Finding(path, first_row.line, "OVERFIT-INIT",
                                        f"first {metric} {fmt_num(first)} is above twice the uniform-guess "
                                        f"loss ln({args.num_classes}) = {fmt_num(chance)}, worse than "
                                        "guessing: check the loss, its scale and the weights loaded"))
        else:
            text.append(f"  first value {fmt_num(first)} vs ln({args.num_classes}) = {fmt_num(chance)}, "
                        "the uniform-guess loss a randomly initialised model starts near")
            if not 0.5 * chance <= first <= 2 * chance:
                findings.append(Finding(path, first_row.line, "OVERFIT-INIT",
                                        f"first {metric} {fmt_num(first)} is far from the uniform-guess "
                                        f"loss ln({args.num_classes}) = {fmt_num(chance)}: far below "
                                        "suggests leakage, unless the model is pretrained (then pass "
                                        "--pretrained); far above, a wrong loss, scale or initialisation"))
    return findings, summary, "\n".join(text), log.read_summary(step_key, [metric])


def main() -> int:
    """Parse arguments, judge each log, print the report and return the exit code."""
    parser = make_parser("check_overfit.py", __doc__,
                         "Exit 0 near zero, 1 not near zero or other findings, 2 unreadable input.")
    parser.add_argument("files", nargs="+", metavar="LOG", help="loss log of the overfit run")
    parser.add_argument("--metric", help="loss column (default: loss, else the first key containing 'loss')")
    parser.add_argument("--step-key", help="key that orders rows (default: step, iter, epoch ...)")
    parser.add_argument("--format", choices=("jsonl", "csv", "text"), help="override format detection")
    parser.add_argument("--target", type=float, default=0.05,
                        help="absolute near-zero threshold (default 0.05)")
    parser.add_argument("--relative", type=float, metavar="R",
                        help="instead of --target, pass when final <= R x the first value")
    parser.add_argument("--num-classes", type=int, metavar="C",
                        help="also compare the first value with ln(C), the uniform-guess loss")
    parser.add_argument("--pretrained", action="store_true",
                        help="the model starts pretrained (an LM: C is its vocabulary), so its first "
                             "loss is expected below ln(C), not near it")
    args = parser.parse_args()
    if args.num_classes is not None and args.num_classes < 2:
        raise InputError("--num-classes must be at least 2")
    return report_each(TOOL, args.files, args.json, lambda path: check(path, args), "runs", "\n")


if __name__ == "__main__":
    run(TOOL, main)
