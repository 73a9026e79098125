"""Command line of triage_logprobs.py: is the train/rollout log-prob mismatch precision noise or a bug?"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import logprob_inputs, logprob_judgement, logprob_noise, logprob_report, sibling

SKILL_ROOT = Path(__file__).resolve().parents[2]
_HELP_FORMATS = (
    "Formats, each detected by content (references/logprob_inputs.md): the generic JSONL, one record per sequence "
    '{"id", "token_ids", "logprobs", optional "prompt_ids", "top_logprobs", "dtype", "temperature", "logprobs_mode"}; '
    "vLLM offline output written by the snippet in references/logprob_inputs.md; SGLang /generate responses "
    "(meta_info.output_token_logprobs); OpenAI-compatible completion/chat JSON whose logprobs carry token ids; "
    ".npz or .pt dicts with RL batch keys (train: old_log_probs; rollout: rollout_log_probs; both [B, T], with "
    "responses [B, T], response_mask [B, T] or attention_mask, optional prompts); a JSON document "
    '{"token_ids": [[...], ...], "logprobs": [[...], ...]} of variable-length rows; parquet where pyarrow is installed.')


def _bounds(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LO,HI such as 0.5,2") from None
    if not 0 < lo < 1 < hi:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < LO < 1 < HI")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of triage_logprobs.py."""
    ap = argparse.ArgumentParser(
        prog="triage_logprobs.py",
        description="Hold the per-token log-probs the rollout engine returned against the ones the trainer "
                    "recomputed: metrics named as verl's rollout correction logs them, a noise band measured on "
                    "real engines, the patterns of references/logprob_triage.md, and what to dump next. Writes "
                    "DIR/logprob_triage.json and DIR/logprob_triage.md.",
        epilog=_HELP_FORMATS + " Exit codes: 0 the triage ran (any verdict); 1 with --fail-on-finding when the "
               "verdict is not precision_noise, or an internal error (one line); 2 usage or input error (one line naming "
               "the file).")
    ap.add_argument("--rollout", required=True, nargs="+", metavar="FILE",
                    help="the rollout's log-probs; several files (one per step) give a per-step table")
    ap.add_argument("--train", required=True, nargs="+", metavar="FILE",
                    help="the trainer's log-probs, one file per --rollout file, same order")
    ap.add_argument("--out-dir", required=True, help="folder for logprob_triage.json and .md")
    ap.add_argument("--ratio-bounds", type=_bounds, default=(0.5, 2.0), metavar="LO,HI",
                    help="importance-ratio bounds for rollout_is_ratio_fraction_low/high (default 0.5,2)")
    ap.add_argument("--baseline", nargs=2, metavar=("ROLLOUT", "TRAIN"),
                    help="a clean pair you trust (an early step, the same engine twice): its |delta| distribution "
                         "is the noise band instead of the committed one")
    ap.add_argument("--dtype", choices=("fp32", "bf16"),
                    help="the less precise of the two sides' dtypes, when the files do not say (default: bf16)")
    ap.add_argument("--fail-on-finding", action="store_true", help="exit 1 when the verdict is not precision_noise")
    ap.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return ap


def _tensorio():
    try:
        return sibling.load_tensorio(SKILL_ROOT)
    except sibling.SiblingError:
        return None                     # only .pt files need it; their reader says so


def read_pair(rollout: str, train: str) -> tuple[logprob_inputs.LogprobSide, logprob_inputs.LogprobSide]:
    """Both sides' log-prob files, read once (the root-cause run also lists their per-token pairs)."""
    return logprob_inputs.read(rollout, "rollout", _tensorio), logprob_inputs.read(train, "train", _tensorio)


def judge_pair(rollout, train, bounds, base=None, dtype=None) -> logprob_judgement.Triage:
    """The triage of one pair of read sides (``base``: a read baseline pair, or None)."""
    notes: list[str] = []
    band = logprob_judgement.band_for(rollout, train, dtype, base, notes)
    return logprob_judgement.judge(rollout, train, bounds, band, notes)


def triage(rollouts: list[str], trains: list[str], bounds, baseline=None, dtype=None) -> dict:
    """The triage document of one or several (rollout, train) file pairs, read one pair at a time."""
    base = read_pair(*baseline) if baseline else None
    return logprob_report.document([judge_pair(*read_pair(r, t), bounds, base, dtype)
                                    for r, t in zip(rollouts, trains)])


def summary(doc: dict, out: Path) -> str:
    """A few lines for the terminal."""
    m = doc["metrics"]
    lines = [f"log-prob triage: {doc['verdict']} ({doc['reason']})"]
    if m.get("tokens"):
        lines.append(f"tokens {m['tokens']}: mean |diff| {m['log_prob_abs_diff_mean']:.3g}, max "
                     f"{m['log_prob_abs_diff_max']:.3g}, kl {m['kl']:.3g}, k3_kl {m['k3_kl']:.3g}, ratio outside "
                     f"bounds {m['rollout_is_ratio_fraction_low'] + m['rollout_is_ratio_fraction_high']:.3%}")
    for p in doc["patterns"]:
        lines.append(f"pattern {p['name']}: {p['check'][:160]}")
    if doc.get("step_table"):
        lines.append(f"first step not noise: {doc['first_step_not_noise']}")
    lines.append(f"triage: {out / logprob_report.JSON_NAME}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if len(args.rollout) != len(args.train):
        ap.error(f"{len(args.rollout)} --rollout files but {len(args.train)} --train files: give one per step each")
    out = Path(args.out_dir)
    try:
        doc = triage(args.rollout, args.train, args.ratio_bounds, args.baseline, args.dtype)
        logprob_report.write(out, doc)
    except (logprob_inputs.LogprobInputError, logprob_noise.NoiseBandError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.filename or out}: {exc.strerror}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for agents; ROOTCAUSE_DEBUG=1 for the traceback
        if os.environ.get("ROOTCAUSE_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
              "(set ROOTCAUSE_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(summary(doc, out))
    return 1 if args.fail_on_finding and doc["verdict"] != "precision_noise" else 0
