"""Inputs passed by mistake: caught before the compare step (one-line error, exit 2) or noted after it.

Each check names the problem and the fix in one line. A check that makes the run useless raises
InputMistake before the long compare step; the others return notes that lead the console, output_5
``notes`` and report.html. Why each holds: references/analysis_rules.md, "Inputs passed by mistake".
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .evidence import Evidence
from .sides import UNFIT

TRAIN_FAMILIES = ("hf", "megatron")
ROLLOUT_FAMILIES = ("vllm", "sglang")
FAMILY_WORDS = {"hf": "Hugging Face (transformers/FSDP)", "megatron": "Megatron", "vllm": "vLLM", "sglang": "SGLang"}
# The compare step's skip code (output_3 ``results[].skip``, references/output_schemas.md "Skip codes")
# when a tensor file named by a tensor-mode dump cannot be read; its reason reads "<file>: <why>".
TENSOR_UNAVAILABLE = "tensor_unavailable"


class InputMistake(Exception):
    """An input that leaves nothing useful to run (exit 2)."""


def before(args) -> list[str]:
    """Checks on the command line alone; raises InputMistake or returns notes."""
    train, rollout = Path(args.train), Path(args.rollout)
    if train.exists() and train.resolve() == rollout.resolve():
        raise InputMistake(f"{args.train}: --train and --rollout are the same dump; pass the trainer's dump as "
                           f"--train and the rollout engine's dump as --rollout")
    _check_out_dir(Path(args.out_dir))
    notes = []
    if args.token_ids is not None and not (args.model or args.train_model or args.rollout_model):
        notes.append("--token-ids was ignored: only the reference forward reads the token ids, and it runs with "
                     "--model; add --model <the checkpoint folder both engines loaded>")
    return notes


def _check_out_dir(out: Path) -> None:
    """The output folder can be created and written: try it in the nearest folder that exists."""
    if out.exists() and not out.is_dir():
        raise InputMistake(f"{out}: --out-dir is a file, not a folder; choose a folder for the outputs")
    base = out
    while not base.exists() and base != base.parent:
        base = base.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rootcause-probe-", dir=base))
    except OSError as exc:
        raise InputMistake(f"{out}: --out-dir cannot be written ({exc.strerror or type(exc).__name__} in {base}); "
                           f"choose a writable folder") from None


def after(ev: Evidence, given_families: dict[str, str | None]) -> list[str]:
    """Notes on what the compare step read: one dump on both sides, swapped sides, tensor files missing."""
    return [n for n in (_checkpoint_unfit(ev), _same_content(ev), _swapped(ev, given_families), _tensors_missing(ev))
            if n]


def _checkpoint_unfit(ev: Evidence) -> str | None:
    """The --model checkpoint matches neither side (the compare step's output_4 ``reference_fit``)."""
    fit = ev.analysis.get("reference_fit") or {}
    if fit.get("fits") is not False:
        return None
    return (f"{fit.get('reason') or UNFIT}; no side is named from it: pass --model the checkpoint both engines "
            f"loaded (at the dumped step), or leave --model out")


def _digest(files: list[str]) -> str | None:
    h = hashlib.sha256()
    try:
        for f in sorted(files):
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _same_content(ev: Evidence) -> str | None:
    files = {s: (ev.sources.get(s) or {}).get("files") or [] for s in ("train", "rollout")}
    if not files["train"] or len(files["train"]) != len(files["rollout"]):
        return None
    sizes = {s: sorted(os.path.getsize(f) for f in files[s] if os.path.isfile(f)) for s in files}
    if sizes["train"] != sizes["rollout"]:
        return None
    d = {s: _digest(files[s]) for s in files}
    if d["train"] is None or d["train"] != d["rollout"]:
        return None
    return ("both sides are one dump: the train and rollout files are byte for byte the same, so nothing can "
            "differ; pass the rollout engine's own dump as --rollout")


def _swapped(ev: Evidence, given: dict[str, str | None]) -> str | None:
    fam = {s: (ev.sources.get(s) or {}).get("family") for s in ("train", "rollout")}
    if any(given.get(s) for s in fam):
        return None         # the user named the families: their labels are a statement, not a slip
    if fam["train"] in ROLLOUT_FAMILIES and fam["rollout"] in TRAIN_FAMILIES:
        return (f"train and rollout look swapped: the --train dump looks like {FAMILY_WORDS[fam['train']]} (a "
                f"rollout engine) and the --rollout dump like {FAMILY_WORDS[fam['rollout']]} (a trainer); the "
                f"labels are kept as given, so every 'train' below means the --train dump. Swap the two options "
                f"if that was a slip")
    return None


def _tensors_missing(ev: Evidence) -> str | None:
    tensor_sides = [s for s in ("train", "rollout") if (ev.sources.get(s) or {}).get("task") == "tensor"]
    if not tensor_sides:
        return None
    missing = [r for r in ev.compare.get("results", [])
               if isinstance(r.get("skip"), dict) and r["skip"].get("code") == TENSOR_UNAVAILABLE]
    if not missing:
        return None
    where = str(missing[0]["skip"].get("reason") or "").split(":", 1)[0]
    total = len(ev.compare.get("results", []))
    return (f"tensor files missing: {' and '.join(tensor_sides)} {'is a' if len(tensor_sides) == 1 else 'are'} "
            f"tensor-mode dump{'s' if len(tensor_sides) > 1 else ''}, but {len(missing)} of {total} comparisons "
            f"could not read their tensor files (first: {where}) and used the statistics instead; copy each "
            f"dump.json together with its dump_tensor_data/ folder")
