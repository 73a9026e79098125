"""Command line: load -> name -> map -> compare -> analyse -> write output_1 .. output_4."""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import checkpoint, reference, reffit, refforward, replay, token_ids
from . import documents as D
from . import htmlreport, passthrough, plan_io, value_align
from .analysis import analyse
from .compare import EntryLeaves, Executor, SideView
from .errors import InputError
from .gcpause import collector_paused
from .loaders import FORMATS
from .loaders.assembly import assemble_sides
from .loaders.inputs import plan_inputs, survey
from .loaders.parallel import default_jobs, input_size
from .mapping import build_plan
from .plan import MappingPlan
from .naming import Namer, load_profiles
from .outputs import (COMPARE_OUTPUTS, OUTPUT_3_SCHEMA_VERSION, OUTPUT_4_SCHEMA_VERSION, clean_view, remove_stale,
                      write_atomic, write_csv, write_json)
from .safetext import visible
from .tolerances import load_tolerances

FAMILIES = ("hf", "vllm", "sglang", "megatron")
SIDES = ("train", "rollout")
# A family whose tensors have the token layout a dump declares (compare/tensors.py lays tensors
# out by family); the naming keeps the side's own family.
LAYOUT_FAMILY = {"t": "vllm", "bs": "hf", "sb": "megatron"}
# What the reference checkpoint is taken to be (references/reference_checkpoint.md).
REFERENCE_ROLES = ("initial", "at_step")
# Runs on inputs below this size take seconds: no progress lines for them.
PROGRESS_MIN_BYTES = 32 << 20


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _temperature(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = float("nan")            # refused below, with the same words as a bad number
    if not 0 < t < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return t


def build_parser() -> argparse.ArgumentParser:
    """Argument parser of run_compare.py (the root-cause skill declares the same options for its
    pass-through; a test there keeps the two in step)."""
    ap = argparse.ArgumentParser(
        prog="run_compare.py",
        description="Map modules of a train dump and a rollout dump (msprobe dump.json, the generic JSON "
                    "format, or an SGLang dumper folder) across engines, compare their values and rank "
                    "divergences. Writes output_1_key_mapping.* .. output_4_module_analysis.* into "
                    "--out-dir.",
        epilog="Exit codes: 0 the comparison ran (with or without findings); 2 bad usage or unreadable "
               "input; 1 internal error.")
    ap.add_argument("--train", required=True,
                    help="train-side dump.json, a folder holding one, or an SGLang dumper folder")
    ap.add_argument("--rollout", required=True,
                    help="rollout-side dump.json, a folder holding one, or an SGLang dumper folder")
    ap.add_argument("--format", choices=FORMATS, default="auto",
                    help="format of both sides: msprobe dump.json, generic JSON, or SGLang dumper folder "
                         "(default: detected per side, so a mixed pair needs no option)")
    ap.add_argument("--out-dir", required=True, help="folder for the outputs (created if missing)")
    for side in ("train", "rollout"):
        ap.add_argument(f"--{side}-step", help=f"step folder(s) to use when --{side} holds several: one (0 or step0), "
                        f"a range such as 0-8 or a list such as 0,3,5, joined in order (a prefill and its decode steps)")
        ap.add_argument(f"--{side}-rank", help=f"rank folder to use when --{side} holds several (e.g. 0, rank0, "
                        f"proc123), or 'all' to merge the tensor-parallel ranks of one step")
        ap.add_argument(f"--{side}-family", choices=FAMILIES, help=f"engine family of the {side} side (default: detected)")
    ap.add_argument("--naming", help="YAML file extending or overriding the built-in naming profiles")
    ap.add_argument("--tolerances", help="YAML file overriding the dtype tolerances")
    ap.add_argument("--model", help="Hugging Face model folder (config.json, *.safetensors) both sides loaded: "
                    "each side's parameters are checked against it (the reference)")
    for side in SIDES:
        ap.add_argument(f"--{side}-model", help=f"model folder the {side} side loaded, when the sides loaded different ones")
        ap.add_argument(f"--{side}-config", help=f"config.json the {side} engine really resolved (default: the model's)")
    ap.add_argument("--reference-taken-as", choices=REFERENCE_ROLES, default=REFERENCE_ROLES[0],
                    help="what the checkpoint is: the initial one (dumps before the first weight sync) or one "
                         "saved at the dumped step")
    ap.add_argument("--reference-forward", action=argparse.BooleanOptionalAction, default=None,
                    help="run the checkpoint's forward in numpy on each side's tokens and hold both sides against it "
                         "(default: on with --model when the model family is supported)")
    ap.add_argument("--token-ids", help="the token ids the engines ran, as a JSON list such as [1, 2, 3] or a "
                    "file holding one (default: recovered from the dump where it can be)")
    ap.add_argument("--logprob-temperature", type=_temperature, metavar="T",
                    help="tensor mode: also give each token's log-prob at temperature T (log-softmax of logits / T, "
                         "as RL trainers and vLLM's processed_logprobs compute it) in output_3 logprob.tokens")
    ap.add_argument("--plan", help="an output_2_mapping.json saved by an earlier run: execute that mapping plan on "
                    "these dumps instead of naming and mapping them again (its module keys must be in the dumps)")
    ap.add_argument("--statistics-only", action="store_true", help="ignore tensor files even when present")
    ap.add_argument("--no-fold-calls", action="store_true",
                    help="keep every call of a module as its own entry (one output row per call; slower on large dumps)")
    ap.add_argument("--jobs", type=_positive_int, default=None,
                    help="processes reading the dump files (default: one per core for inputs over 32 MB; one when "
                         "a side has several rank files, which are merged one by one to bound memory)")
    ap.add_argument("--quiet", action="store_true", help="print nothing but errors (no summary, no progress)")
    return ap


@dataclass(frozen=True)
class _Setup:
    """What the command line fixes before any dump is read."""
    namer: Namer
    tolerances: dict
    refs: dict
    given: list[int] | None
    saved: dict | None


@dataclass(frozen=True)
class _Loaded:
    """Both sides read and named."""
    inputs: object
    dumps: dict | None       # None once the comparisons have read them (run)
    families: dict
    recs: dict
    layouts: dict
    say: Callable[[str], None]


@dataclass(frozen=True)
class _Compared:
    """The plan executed and every check on top of it."""
    plan: MappingPlan
    results: list
    replays: list | None
    fit: dict | None
    forward: dict | None
    unpaired: dict          # side -> its parameters no comparison planned, against the checkpoint


@collector_paused()
def run(args: argparse.Namespace) -> dict:
    """Run the whole pipeline; returns the output_4 document. Each phase returns a new value;
    the documents are built once from the finished values.

    The cyclic collector is paused throughout (gcpause.py): every full collection walks the loaded
    dumps, the results and the documents, and a run over many modules spent a fifth of its time
    in them; reference counting frees what the pipeline drops."""
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: --out-dir exists and is not a folder")
    setup = _setup(args)
    loaded = _load(args, setup)
    compared = _compare(args, setup, loaded)
    sources = _sources(loaded)
    # The documents need what was read (sources), not the dumps' values: dropped here, the loaded
    # entries (a few times the input) are not held while the documents are built and written.
    loaded = replace(loaded, dumps=None)
    docs = _documents(setup, loaded, compared, sources)
    _write(out, docs, loaded.say)
    if not args.quiet:
        try:
            _summary(docs["doc2"]["summary"], docs["doc4"], docs["sources"], docs["doc3"]["mode"], out)
            sys.stdout.flush()
        except BrokenPipeError:
            # A reader that stopped early (`| head`): the outputs are written; say nothing more.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return docs["doc4"]


def _setup(args: argparse.Namespace) -> _Setup:
    """Naming profiles, tolerances, the checkpoint(s), the given token ids and a saved plan."""
    namer = Namer(load_profiles(args.naming))
    refs = _references(args, namer)
    counts = {r.config.get("num_hidden_layers") for r in refs.values() if r is not None}
    if len(counts) == 1 and isinstance(n := counts.pop(), int):
        namer = Namer(namer.p, model_layers=n)
    given = token_ids.parse_given(args.token_ids)
    if args.reference_forward and not any(refs.values()):
        raise InputError("--reference-forward needs --model (or --train-model/--rollout-model)")
    return _Setup(namer, load_tolerances(args.tolerances), refs, given,
                  plan_io.read(args.plan) if args.plan else None)


def _load(args: argparse.Namespace, setup: _Setup) -> _Loaded:
    """Find, read and name both sides (the input plan: steps, ranks, files)."""
    inputs = plan_inputs({s: getattr(args, s) for s in SIDES}, {s: getattr(args, f"{s}_step") for s in SIDES},
                         {s: getattr(args, f"{s}_rank") for s in SIDES},
                         {s: survey(getattr(args, s), s, args.format) for s in SIDES})
    say = _progress(args.quiet, [f for s in SIDES for f in inputs.side(s).files])
    # Joined steps are renumbered call by call, so their calls are not folded.
    fold = not args.no_fold_calls and not any(len(inputs.side(s).steps) > 1 for s in SIDES)
    sides = assemble_sides(inputs, setup.namer, {s: getattr(args, f"{s}_family") for s in SIDES}, fold=fold,
                           fmt=args.format, jobs=args.jobs, progress=say)
    return _Loaded(inputs, *({s: getattr(sides[s], a) for s in SIDES} for a in ("dump", "family", "recs", "layout")),
                   say)


def _compare(args: argparse.Namespace, setup: _Setup, loaded: _Loaded) -> _Compared:
    """Plan the comparisons, execute them, and hold each side against the checkpoint."""
    dumps, recs, refs, tolerances = loaded.dumps, loaded.recs, setup.refs, setup.tolerances
    loaded.say("mapping and comparing")
    if setup.saved:
        plan = plan_io.resolve(setup.saved, args.plan, recs)
    else:
        values = value_align.Values({s: dumps[s].entries for s in dumps}, tolerances["statistics"])
        plan = build_plan(recs["train"], recs["rollout"], setup.namer,
                          functools.partial(value_align.align, values=values))
    plan = replace(plan, one_sided=passthrough.mark(plan.one_sided, {s: dumps[s].entries for s in dumps}))
    views = {s: SideView(dumps[s], LAYOUT_FAMILY.get(dumps[s].layout, loaded.families[s]),
                         EntryLeaves(dumps[s].entries),
                         [r.path for r in recs[s]], [r.key for r in recs[s]]) for s in dumps}
    use_tensors = not args.statistics_only
    tensor_files = use_tensors and any(lf.data_name for d in dumps.values() for e in d.entries for lf in e.leaves)
    # Without a checkpoint, statistics over one token row more are held to bounds (compare/bounds.py);
    # with one, the reference forward over --token-ids is what verifies them.
    results = Executor(views["train"], views["rollout"], tolerances, use_tensors=use_tensors,
                       jobs=(args.jobs or default_jobs()) if tensor_files else 1, given_ids=setup.given,
                       bounds=not any(refs.values()), temperature=args.logprob_temperature).run(plan.comparisons)
    unpaired = {}
    if any(refs.values()):
        loaded.say("checking parameters against the reference checkpoint")
        reference.check(results, plan.comparisons, views, refs, tolerances, use_tensors)
        unpaired = reference.unpaired(plan.comparisons, recs, views, refs, tolerances, use_tensors)
    # Tensor mode: replay the standard modules of each side from its own tensors (replay/).
    replays = replay.run(recs, views, refs, tolerances) if tensor_files else None
    # Whether the checkpoint is the one these dumps ran: without a fit, nothing names a side from it.
    fit = reffit.judge(results, plan.comparisons, views, recs, refs)
    forward = None
    if any(refs.values()) and args.reference_forward is not False:
        loaded.say("running the reference forward")
        forward = reffit.withhold_verdict(refforward.run(plan.comparisons, views, recs, refs, setup.namer,
                                                         tolerances, use_tensors, setup.given, results), fit)
    return _Compared(plan, results, replays, fit, forward, unpaired)


def _sources(loaded: _Loaded) -> dict:
    """output_1 ``sources``: what was read on each side, and the input plan."""
    sources = {s: D.source_info(loaded.dumps[s], loaded.families[s], loaded.inputs.side(s), loaded.layouts[s])
               for s in loaded.dumps}
    sources["input_plan"] = loaded.inputs.to_json()
    return sources


def _documents(setup: _Setup, loaded: _Loaded, compared: _Compared, sources: dict) -> dict:
    """output_1..4 (JSON and their CSV/markdown views) and the sources record."""
    recs, plan, results, refs = loaded.recs, compared.plan, compared.results, setup.refs
    plan_doc = sources["input_plan"]
    partial = any(sources[s]["partial"] for s in SIDES)
    verdicts, first = analyse(plan, results, recs["train"], recs["rollout"])
    doc1, view1 = D.output_1(sources, recs)
    doc2, view2 = D.output_2(plan, recs["train"], recs["rollout"])
    doc3, view3 = D.output_3(results, setup.tolerances, D.mode(results),
                             {s: {**r.describe(), "unpaired_parameters": compared.unpaired.get(s, [])} if r else None
                              for s, r in refs.items()} if any(refs.values()) else None,
                             replays=compared.replays, forward=compared.forward)
    comp = D.comparability(results, doc2["summary"], D.layer_counts(recs),
                           {"how": plan_doc["tokens"]["how"], "verified": plan_doc["tokens"]["verified"]})
    doc4, md4 = D.output_4(verdicts, first, plan, results, recs, partial, comp,
                           forward=refforward.summary(compared.forward), fit=compared.fit)
    docs = {"doc1": doc1, "doc2": doc2, "doc3": doc3, "doc4": doc4}
    for doc in docs.values():
        doc["partial"] = partial
    return {**docs, "views": (view1, view2, view3, md4), "sources": sources}


def _write(out: Path, docs: dict, say: Callable[[str], None]) -> None:
    """Every output file, each written whole (a reader never sees half a file)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: --out-dir cannot be created ({exc.strerror or type(exc).__name__}); "
                         f"choose a writable folder") from None
    (h1, r1), (h2, r2), (h3, r3), md4 = docs["views"]
    say(f"writing outputs to {out}")
    write_json(out / "output_1_key_mapping.json", docs["doc1"])
    write_csv(out / "output_1_key_mapping.csv", h1, r1)
    write_json(out / "output_2_mapping.json", docs["doc2"])
    write_csv(out / "output_2_mapping.csv", h2, r2)
    write_json(out / "output_3_value_compare.json", docs["doc3"], OUTPUT_3_SCHEMA_VERSION)
    write_csv(out / "output_3_value_compare.csv", h3, r3)
    write_json(out / "output_4_module_analysis.json", docs["doc4"], OUTPUT_4_SCHEMA_VERSION)
    write_atomic(out / "output_4_module_analysis.md", md4)
    write_atomic(out / htmlreport.REPORT, htmlreport.pieces(clean_view(docs["doc3"]), clean_view(docs["doc4"]), docs["sources"]))
    # An older output_5 (root-cause report) describes other outputs: it must not stay beside these.
    remove_stale(out, COMPARE_OUTPUTS)
    say("done")


def _references(args: argparse.Namespace, namer: Namer) -> dict:
    """Per side, the reference checkpoint and the config that side resolved (None without --model)."""
    loaded, out = {}, {}
    for s in SIDES:
        folder = getattr(args, f"{s}_model") or args.model
        if folder is None:
            if getattr(args, f"{s}_config"):
                raise InputError(f"--{s}-config needs --model or --{s}-model (the checkpoint it configures)")
            out[s] = None
            continue
        if folder not in loaded:
            loaded[folder] = checkpoint.load(folder)
        ckpt = loaded[folder]
        cfg_file = getattr(args, f"{s}_config")
        config = checkpoint.side_config(ckpt, cfg_file) if cfg_file else ckpt.config
        if cfg_file and not config:
            raise InputError(f"{cfg_file}: --{s}-config is missing or empty")
        out[s] = reference.SideReference(ckpt, config, reference.index_points(ckpt, namer), args.reference_taken_as,
                                         cfg_file)
    return out


def _progress(quiet: bool, paths: list):
    """A function printing timed progress lines on stderr for long runs, silent otherwise."""
    size = sum(input_size(p) for p in paths)
    if quiet or size < PROGRESS_MIN_BYTES:
        return lambda _msg: None
    start = time.perf_counter()
    return lambda msg: print(f"[run_compare {time.perf_counter() - start:7.1f} s] {msg}",
                             file=sys.stderr, flush=True)


def _summary(s: dict, doc4: dict, sources: dict, mode: str, out: Path) -> None:
    def p(line: str) -> None:
        # Names come from the dumps: no escape sequence of theirs reaches the terminal.
        print(visible(line))
    fit = doc4.get("reference_fit") or {}
    if fit.get("fits") is False:
        p(f"WARNING {fit['reason']}")
    for side, label in (("train", "train:  "), ("rollout", "rollout:")):
        src = sources[side]
        more = len(src["files"]) - 1
        layout = (src.get("rank_layout") or {}).get("kind")
        extra = (f"; +{more} more file(s): steps {', '.join(map(str, src['steps']))}, ranks "
                 f"{', '.join(map(str, src['ranks']))}" + (f" ({layout})" if layout and layout != "single" else "")
                 if more else "")
        calls = s.get(f"{side}_calls", 0)
        calls = f" in {calls} calls" if calls > s[f"{side}_modules"] else ""
        p(f"{label} {src['path']} ({src['family']}, {s[f'{side}_modules']} forward modules{calls}{extra})")
    for side in ("train", "rollout"):
        sal = sources[side]["salvage"]
        if sal:
            p(f"PARTIAL {side}: {sal['reason']} at byte {sal['byte_offset']}; "
              f"{sal['entries_recovered']} entries recovered (last: {sal['last_complete_key']})")
    by_values = {k: v for k, v in s["pairs_by_alignment"].items() if k != "names"}
    aligned = f" ({', '.join(f'{v} by {k}' for k, v in by_values.items())}: no naming rule explains them)" \
        if by_values else ""
    p(f"mapping: {s['pairs']} pairs {s['pairs_by_kind']}{aligned}; coverage train {s['mapped_train_modules']}/"
      f"{s['train_modules']}, rollout {s['mapped_rollout_modules']}/{s['rollout_modules']}; "
      f"one-sided train {s['train_only']} ({s['train_only_unexpected']} unexpected), "
      f"rollout {s['rollout_only']} ({s['rollout_only_unexpected']} unexpected)")
    p(f"compare ({mode}): {s['comparisons']} tensors compared")
    if not doc4["comparability"]["comparable"]:
        p("WARNING not comparable: " + "; ".join(doc4["comparability"]["reasons"]))
    fd = doc4["first_divergence"]
    if fd["pair"]:
        p(f"first divergence: {', '.join(fd['train_modules'])} (train) <-> {', '.join(fd['rollout_modules'])} "
          f"(rollout): {fd['status']}, tensor {fd['point']}")
    else:
        p("first divergence: none (all compared outputs agree within tolerance)")
    top = [m for m in doc4["modules"] if m.module_priority_rank <= 2]
    for m in top[:5]:
        p(f"  rank {m.module_priority_rank}: {', '.join(m.train_modules)} <-> "
          f"{', '.join(m.rollout_modules)}: {m.status} ({m.rank_reason})")
    p(f"outputs: {out}/output_1_key_mapping.json .. output_4_module_analysis.json")
    p(f"report: {out / htmlreport.REPORT}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        run(args)
    except InputError as exc:
        print(f"error: {visible(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for agents; DUMPCOMPARE_DEBUG=1 for the traceback
        if os.environ.get("DUMPCOMPARE_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {visible(' '.join(str(exc).split()))} "
              f"(set DUMPCOMPARE_DEBUG=1 for a traceback)", file=sys.stderr)
        return 1
    return 0
