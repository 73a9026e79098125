#!/usr/bin/env python3
"""Write an msprobe config.json for an L0 (module-level) dump this skill can analyse (see --help).

Keys and values follow msprobe 26.x (mindstudio-probe 26.2.0): `references/dumping.md` says where
each one comes from and where to start and stop the debugger in the trainer and the engine.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rootcause import sibling

TASKS = ("statistics", "tensor")
SUMMARY_MODES = ("statistics", "md5")
LEVELS = ("L0", "mix")
# Module-name pieces of the model's first and last modules on every supported engine (embedding,
# final norm, logits): kept in a layer scope so the dump shows whether the divergence reaches
# the logits and what enters the first dumped layer.
MODEL_ENDS = ("embed_tokens.", "word_embeddings.", "model.norm.", "final_layernorm.", "lm_head.",
              "logits_processor.", "output_layer.")


class UsageError(Exception):
    """A bad option value (exit 2)."""


def layer_list(spec: str) -> list[int]:
    """'2', '2-4' or '1,3,5-6' -> sorted layer numbers."""
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UsageError(f"--layers {spec!r}: use numbers and ranges such as 2, 2-4 or 1,3,5-6")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"--layers {spec!r}: range {lo}-{hi} runs backwards")
        out.update(range(lo, hi + 1))
    return sorted(out)


def build(task: str, dump_path: str, level: str = "L0", summary_mode: str = "statistics",
          layers: list[int] | None = None, model_ends: bool = True, steps: list[int] | None = None,
          ranks: list[int] | None = None, forward_only: bool = True) -> dict:
    """The config dict: common keys, then the section of the chosen task."""
    names = [f"layers.{n}." for n in layers or []]
    if names and model_ends:
        names += list(MODEL_ENDS)
    section = {"scope": [], "list": names, "data_mode": ["forward"] if forward_only else ["all"]}
    if task == "statistics":
        section["summary_mode"] = summary_mode
    return {
        "task": task, "dump_path": dump_path, "rank": ranks or [], "step": steps or [], "level": level,
        # No "precision": "high": msprobe 26.2 then leaves Mean and Norm out of every non-float64
        # tensor (pytorch_processor.get_stat_info computes them only below "high"), and the
        # statistics analysis needs them.
        "async_dump": False,
        task: section,
    }


def build_parser() -> argparse.ArgumentParser:
    """Argument parser."""
    ap = argparse.ArgumentParser(
        prog="make_dump_config.py",
        description="Write an msprobe config.json for an L0 dump of the train or rollout side (msprobe 26.x). "
                    "Use the same file on both sides; see references/dumping.md for where to start and stop "
                    "the debugger.",
        epilog="Exit codes: 0 written; 2 bad option or the output cannot be written.")
    ap.add_argument("--out", required=True, help="config file to write (e.g. config.json)")
    ap.add_argument("--dump-path", required=True, help="folder msprobe writes the dump into (its 'dump_path')")
    ap.add_argument("--task", choices=TASKS, default="statistics",
                    help="statistics: Max/Min/Mean/Norm per tensor (small); tensor: every tensor saved as a file "
                         "(needed for per-token log-probs and the token x layer map; large)")
    ap.add_argument("--summary-mode", choices=SUMMARY_MODES, default="statistics",
                    help="statistics task only: 'md5' writes a checksum per tensor instead of statistics, "
                         "useful to prove parameters equal bit for bit, useless to locate a divergence")
    ap.add_argument("--level", choices=LEVELS, default="L0",
                    help="L0 = modules (what this skill maps); mix = modules and APIs. L1 (APIs only) cannot be "
                         "mapped across engines and is not offered")
    ap.add_argument("--layers", help="dump only these decoder layers, e.g. 2-4 or 1,3 (default: all layers)")
    ap.add_argument("--no-model-ends", action="store_true",
                    help="with --layers, leave out the embedding, final norm and logits modules")
    ap.add_argument("--steps", type=int, nargs="*", help="debugger steps to dump (default: every step)")
    ap.add_argument("--ranks", type=int, nargs="*", help="ranks to dump (default: every rank)")
    ap.add_argument("--with-backward", action="store_true",
                    help="dump backward too (data_mode 'all'); the log-prob comparison needs forward only")
    return ap


def write(path: Path, doc: dict) -> None:
    """Write atomically with the compare skill's one writer (atomicfile.py, found next to this skill)."""
    sibling.load_atomicfile(sibling.SKILL_ROOT).write_text(path, json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    try:
        if args.summary_mode != "statistics" and args.task != "statistics":
            raise UsageError("--summary-mode applies to --task statistics only")
        if not out.parent.is_dir():
            raise UsageError(f"{out}: folder {out.parent} does not exist")
        doc = build(args.task, args.dump_path, args.level, args.summary_mode,
                    layer_list(args.layers) if args.layers else None, not args.no_model_ends,
                    args.steps, args.ranks, not args.with_backward)
        write(out, doc)
    except (UsageError, sibling.SiblingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {out}: cannot write ({exc.strerror})", file=sys.stderr)
        return 2
    print(f"wrote {out}: task {args.task}, level {args.level}"
          + (f", layers {args.layers}" if args.layers else ", all layers"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
