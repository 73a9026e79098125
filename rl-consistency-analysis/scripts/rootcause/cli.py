"""Command line of run_root_cause_analysis.py."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import (credence, evidence, files, input_checks, logprob_cli, logprob_consistency, logprob_inputs, logprob_noise,
               logprob_pairing, logprob_report, logprob_tokens, report, sibling, triage)

SKILL_ROOT = sibling.SKILL_ROOT
# The compare options are declared here again, not taken from the compare skill: this skill
# imports nothing from it and runs it as a subprocess. tests/rootcause/test_rootcause_cli.py
# checks that these declarations match run_compare.py's and that each one is passed through.
PASS_THROUGH_VALUES = ("train_step", "rollout_step", "train_rank", "rollout_rank", "train_family",
                       "rollout_family", "format", "naming", "tolerances", "jobs", "model", "train_model",
                       "rollout_model", "train_config", "rollout_config", "reference_taken_as", "token_ids",
                       "plan", "logprob_temperature")
PASS_THROUGH_FLAGS = ("statistics_only", "no_fold_calls", "reference_forward")
# Flags with a --no- form whose default (None) leaves the choice to the compare step.
_SWITCHES = ("reference_forward",)
FAMILIES = ("hf", "vllm", "sglang", "megatron")
FORMATS = ("auto", "msprobe", "generic", "sglang")


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _temperature(text: str) -> float:
    t = float(text)
    if not 0 < t < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return t


def build_parser() -> argparse.ArgumentParser:
    """Argument parser: this script's options and the compare options it passes through."""
    ap = argparse.ArgumentParser(
        prog="run_root_cause_analysis.py",
        description="Regenerate output_1..4 with the sibling dump-module-mapping-value-compare skill, then find "
                    "the first credible divergence between a train and a rollout dump and write "
                    "output_5_root_cause_report.json and report.html.",
        epilog="Exit codes: 0 the analysis ran (any verdict); 1 with --fail-on-finding when the verdict is not "
               "no_credible_divergence; 2 usage or input error, or the sibling skill is missing or failed.")
    ap.add_argument("--train", required=True,
                    help="train-side dump.json, a folder holding one, or an SGLang dumper folder")
    ap.add_argument("--rollout", required=True,
                    help="rollout-side dump.json, a folder holding one, or an SGLang dumper folder")
    ap.add_argument("--out-dir", required=True, help="folder for output_1..output_5")
    ap.add_argument("--format", choices=FORMATS, help="passed to the compare step (default auto)")
    for side in ("train", "rollout"):
        ap.add_argument(f"--{side}-step", help=f"step folder(s) to use when --{side} holds several: one (0 or "
                        f"step0), a range such as 0-8 or a list such as 0,3,5, joined in order; passed to the "
                        f"compare step")
        ap.add_argument(f"--{side}-rank", help=f"rank folder to use when --{side} holds several (0, rank0, proc123), "
                        f"or 'all' to merge the ranks of one step; passed to the compare step")
        ap.add_argument(f"--{side}-family", choices=FAMILIES, help="passed to the compare step")
    ap.add_argument("--naming", help="naming profile YAML, passed to the compare step")
    ap.add_argument("--tolerances", help="tolerance YAML, passed to the compare step")
    ap.add_argument("--model", help="Hugging Face model folder both sides loaded (the reference checkpoint), "
                    "passed to the compare step: names the side whose parameters or config differ from it")
    for side in ("train", "rollout"):
        ap.add_argument(f"--{side}-model", help=f"model folder the {side} side loaded, passed to the compare step")
        ap.add_argument(f"--{side}-config", help=f"config.json the {side} engine resolved, passed to the compare step")
    ap.add_argument("--reference-taken-as", choices=("initial", "at_step"),
                    help="what the checkpoint is (initial, or saved at the dumped step), passed to the compare step")
    ap.add_argument("--reference-forward", action=argparse.BooleanOptionalAction, default=None,
                    help="hold both sides against a numpy forward of the checkpoint (default: on with --model for a "
                         "supported family), passed to the compare step")
    ap.add_argument("--token-ids", help="the token ids the engines ran, a JSON list such as [1, 2, 3] or a file "
                    "holding one; read by the reference forward (needs --model); passed to the compare step")
    ap.add_argument("--plan", help="an output_2_mapping.json of an earlier run whose mapping plan the compare step "
                    "executes instead of mapping again, passed to the compare step")
    ap.add_argument("--statistics-only", action="store_true", help="passed to the compare step")
    ap.add_argument("--no-fold-calls", action="store_true", help="passed to the compare step")
    ap.add_argument("--jobs", type=_positive_int, help="processes reading the dumps, passed to the compare step")
    for side in ("rollout", "train"):
        ap.add_argument(f"--{side}-logprobs", metavar="FILE",
                        help=f"the {side}'s per-token log-probs (formats: triage_logprobs.py --help); with both, "
                             "output_5 gains logprob_triage")
    ap.add_argument("--logprob-temperature", type=_temperature, metavar="T",
                    help="the job's sampling temperature, for the check that the dumped logits give the log-probs "
                         "of the files (default: the temperature the files state); passed to the compare step")
    ap.add_argument("--reuse-outputs", action="store_true",
                    help="do not rerun the compare step; read existing output_1..4 in --out-dir")
    ap.add_argument("--fail-on-finding", action="store_true",
                    help="exit 1 when the verdict is anything but no_credible_divergence (for CI)")
    ap.add_argument("--quiet", action="store_true", help="print nothing but errors (no summary, no progress)")
    return ap


def _compare_argv(args) -> list[str]:
    argv = ["--train", args.train, "--rollout", args.rollout, "--out-dir", args.out_dir]
    for name in PASS_THROUGH_VALUES:
        val = getattr(args, name)
        if val is not None:
            argv += [f"--{name.replace('_', '-')}", str(val)]
    for flag in PASS_THROUGH_FLAGS:
        if getattr(args, flag):
            argv.append(f"--{flag.replace('_', '-')}")
        elif flag in _SWITCHES and getattr(args, flag) is False:
            argv.append(f"--no-{flag.replace('_', '-')}")
    return argv


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if bool(args.rollout_logprobs) != bool(args.train_logprobs):
        ap.error("--rollout-logprobs and --train-logprobs go together")
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    out = Path(args.out_dir)
    try:
        safe = sibling.load_safetext(SKILL_ROOT)
    except sibling.SiblingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        script = sibling.locate(SKILL_ROOT)
        credence.scale()        # fail before the long compare step when the scale is missing
        notes = input_checks.before(args)
        # The log-prob files are read first too: a bad one stops the run before the compare step.
        lp_paths = (args.rollout_logprobs, args.train_logprobs) if args.rollout_logprobs else None
        read = logprob_cli.read_pair(*lp_paths) if lp_paths else None
        if read and args.logprob_temperature is None:
            # The compare step lists each token at the files' stated temperature, so that the check
            # of the files against the dumps can test the temperature explanation (logprob_consistency).
            args.logprob_temperature = logprob_consistency.stated_temperature(*read)
        logprobs = logprob_report.document([logprob_cli.judge_pair(*read, logprob_tokens.RATIO_BOUNDS)]) if read else None
        if not args.reuse_outputs:
            sibling.run(script, _compare_argv(args), progress=not args.quiet)
        ev = evidence.load(out)
        notes += input_checks.after(ev, {"train": args.train_family, "rollout": args.rollout_family})
        tri = triage.run(ev)
        argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
        doc = report.build(ev, tri, {"train": args.train, "rollout": args.rollout, "out_dir": str(out),
                                     "argv": argv}, notes,
                           (logprob_pairing.pair(*read), lp_paths) if read else None, logprobs)
        if logprobs:
            doc["logprob_triage"] = logprobs
        report.write(out, doc)
        extra = logprob_tokens.html_section(doc["logprobs"]) + (
            logprob_report.html_section(doc["logprob_triage"]) if "logprob_triage" in doc else "")
        files.write_text(out / report.HTML, sibling.load_html(SKILL_ROOT).pieces(ev.compare, ev.analysis, ev.sources,
                                                                                  doc, extra))
    except (sibling.SiblingError, evidence.EvidenceError, credence.CredenceError, input_checks.InputMistake,
            logprob_inputs.LogprobInputError, logprob_noise.NoiseBandError) as exc:
        print(f"error: {safe.visible(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for agents; ROOTCAUSE_DEBUG=1 for the traceback
        if os.environ.get("ROOTCAUSE_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {safe.visible(' '.join(str(exc).split()))} "
              f"(set ROOTCAUSE_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
    if not args.quiet:
        try:
            print(report.summary(doc, out, safe.visible), flush=True)
            if "logprob_triage" in doc:
                print(safe.visible(logprob_cli.summary(doc["logprob_triage"], out).splitlines()[0]), flush=True)
        except BrokenPipeError:
            # A reader that stopped early (`| head`): the outputs are written; say nothing more.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.fail_on_finding and doc["verdict"] != "no_credible_divergence":
        return 1
    return 0
