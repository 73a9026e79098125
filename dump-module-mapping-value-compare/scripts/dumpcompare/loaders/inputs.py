"""The input plan: which files each side reads, in which order, and how sure we are of the tokens.

Two stages, so the decisions can be tested without loading a dump:

* :func:`survey` looks at the file system and at the first entries of each dump file (the token
  ids the embedding received): cheap facts, no full parse;
* :func:`plan_inputs` is a pure function from the command-line choices and those facts to an
  :class:`InputPlan`: per side the chain of steps (one step, or a prefill followed by its decode
  steps), the rank files of each step, and the evidence that both sides saw the same tokens.

How the ranks of one step relate (tensor-parallel shards, pipeline stages) is decided from their
content once they are read (``unshard.rank_relation``); the plan records which files belong
together. The rules and why they hold are in references/input_formats.md ("The input plan").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..containment import kind
from ..errors import InputError
from . import sglang_dumper
from .discovery import candidates
from .jsonstream import StreamState, iter_entries
from .msprobe import ShapeError, build_entry

SIDES = ("train", "rollout")
ALL = "all"
_SCAN_ENTRIES = 50


@dataclass(frozen=True)
class Tokens:
    """What a dump shows of the token ids it was fed (the first integer input of a forward module).

    ``start`` is the first position when the dump shows positions (a later integer input of the
    same size holding consecutive values); ``digest`` the ids' md5/crc when msprobe recorded one.
    """
    numel: int | None
    max: float | None
    min: float | None
    start: int | None = None
    digest: str | None = None

    @property
    def key(self) -> tuple:
        return (self.numel, self.max, self.min)


@dataclass(frozen=True)
class Found:
    """One dump of a side: its step and rank labels (from the folder names) and its tokens.

    ``path`` is a dump file, or an SGLang dumper part (loaders/sglang_dumper.py)."""
    path: Any
    step: str | None
    rank: str | None
    tokens: Tokens | None = None


@dataclass(frozen=True)
class StepFiles:
    """The files of one step: one per rank, in rank order."""
    step: str | None
    files: tuple[Found, ...]


@dataclass(frozen=True)
class SidePlan:
    """What one side reads. ``steps`` is the chain joined into one generation (usually one step)."""
    side: str
    arg: str
    steps: tuple[StepFiles, ...]
    step_reason: str
    rank_reason: str
    notes: tuple[str, ...] = ()

    @property
    def files(self) -> list:
        return [f.path for s in self.steps for f in s.files]

    @property
    def n_ranks(self) -> int:
        return len(self.steps[0].files)


@dataclass(frozen=True)
class TokenEvidence:
    """How the two sides were shown to have seen the same tokens, and how strongly."""
    how: str                  # md5 | count/max/min | count/max/min, last token not fed | none
    verified: bool
    train: Tokens | None = None
    rollout: Tokens | None = None


@dataclass(frozen=True)
class InputPlan:
    """Both sides' plans and the token evidence; recorded in output_1 ``sources.input_plan``."""
    train: SidePlan
    rollout: SidePlan
    tokens: TokenEvidence

    def side(self, s: str) -> SidePlan:
        return self.train if s == "train" else self.rollout

    def to_json(self) -> dict:
        """The plan as plain JSON (paths as strings)."""
        def tok(t):
            return None if t is None else {"numel": t.numel, "max": t.max, "min": t.min,
                                           "first_position": t.start, "digest": t.digest}
        sides = {}
        for s in SIDES:
            p = self.side(s)
            sides[s] = {"arg": p.arg, "step_reason": p.step_reason, "rank_reason": p.rank_reason,
                        "steps": [{"step": st.step, "files": [{"rank": f.rank, "path": str(f.path)}
                                                              for f in st.files]} for st in p.steps],
                        "notes": list(p.notes)}
        return {"sides": sides, "tokens": {"how": self.tokens.how, "verified": self.tokens.verified,
                                           "train": tok(self.tokens.train), "rollout": tok(self.tokens.rollout)}}


# ---------------------------------------------------------------------------------------------
# survey: the only part that touches the file system


def survey(arg: str, side: str, fmt: str = "auto") -> tuple[Found, ...]:
    """Every dump ``--<side>`` names, with step/rank labels and the tokens it saw.

    A dump is a msprobe ``dump.json`` (or a generic JSON file), or one (step, rank) part of an
    SGLang dumper folder (``fmt`` "sglang", or "auto" for a folder holding dumper files and no
    dump.json); both are planned alike.
    """
    p = Path(arg)
    what = kind(p)
    if what == "missing":
        raise InputError(f"{arg}: --{side} path does not exist")
    if what not in ("file", "folder"):
        raise InputError(f"{arg}: --{side} is a {what}, not a dump file or folder")
    if p.is_file():
        if fmt == "sglang":
            raise InputError(f"{arg}: --format sglang needs a dumper folder, not a file")
        return (Found(p, None, None, token_signature(p)),)
    cands = candidates(p) if fmt != "sglang" else []
    if not cands and fmt in ("auto", "sglang") and (fmt == "sglang" or sglang_dumper.looks_like_dumper(p)):
        return tuple(Found(part, part.step, part.rank, _dumper_tokens(part))
                     for part in sglang_dumper.parts_of(arg, side))
    if not cands:
        raise InputError(f"{arg}: no dump.json found in this folder (looked {4} levels deep)")
    return tuple(Found(c.path, c.step, c.rank, token_signature(c.path)) for c in cands)


def _dumper_tokens(part) -> Tokens | None:
    sig = sglang_dumper.token_signature(part)
    return None if sig is None else Tokens(*sig)


def token_signature(path: Path) -> Tokens | None:
    """The tokens a dump saw, read from its first entries; None when none is shown."""
    state = StreamState()
    ids = None
    try:
        for n, (key, value) in enumerate(iter_entries(path, state)):
            if n >= _SCAN_ENTRIES:
                break
            e = build_entry(key, value, n)
            if e is None or e.direction != "forward":
                continue
            for lf in e.leaves:
                if not (lf.name.startswith("input") and lf.dtype and "int" in lf.dtype and lf.shape is not None
                        and lf.max is not None and lf.min is not None):
                    continue
                if ids is None:
                    ids = Tokens(lf.numel, lf.max, lf.min, None, lf.checksum)
                elif lf.numel == ids.numel and lf.max - lf.min + 1 == lf.numel:
                    return Tokens(ids.numel, ids.max, ids.min, int(lf.min), ids.digest)
    except (InputError, ShapeError):     # the full read says what is wrong with the file
        return None
    return ids


# ---------------------------------------------------------------------------------------------
# plan: pure


def plan_inputs(args: dict[str, str], pins: dict[str, str | None], ranks: dict[str, str | None],
                found: dict[str, tuple[Found, ...]]) -> InputPlan:
    """Decide what each side reads from the user's choices and the surveyed files.

    ``args`` are the --train/--rollout arguments, ``pins`` the --<side>-step values, ``ranks`` the
    --<side>-rank values (a rank label, ``all``, or None for "decide from the content").
    Raises :class:`InputError` when the choice cannot be made, saying what was found and what to pass.
    """
    by_step = {s: _group(_pick_rank(found[s], ranks[s], args[s], s)) for s in SIDES}
    chains: dict[str, tuple[list[str | None], str]] = {}
    for s in SIDES:
        labels = list(by_step[s])
        if pins[s] is not None:
            chain = _pinned(pins[s], labels, args[s], s)
            chains[s] = (chain, f"pinned by --{s}-step")
        elif len(labels) == 1:
            chains[s] = (labels, "the only step")
    open_sides = [s for s in SIDES if s not in chains]
    if open_sides:
        chains.update(_pair_by_tokens(open_sides, by_step, chains, args))
    tokens = _evidence(by_step, chains)
    sides = {}
    for s in SIDES:
        chain, reason = chains[s]
        steps = []
        rank_notes: list[str] = []
        for label in chain:
            files = by_step[s][label]
            files, why = _same_data(files, _tok(by_step, chains, _other(s)), args[s], s, label)
            if why:
                rank_notes.append(why)
            steps.append(StepFiles(label, tuple(files)))
        counts = {len(st.files) for st in steps}
        if len(counts) != 1:
            raise InputError(f"{args[s]}: the joined steps {', '.join(str(c) for c in chain)} hold different "
                             f"numbers of ranks ({', '.join(str(len(st.files)) for st in steps)})")
        step_note = [f"{s} {reason}"] if s in open_sides else []
        sides[s] = SidePlan(s, args[s], tuple(steps), reason, _rank_reason(steps, ranks[s], rank_notes),
                            tuple(step_note + rank_notes))
    return InputPlan(sides["train"], sides["rollout"], tokens)


def _other(s: str) -> str:
    return "rollout" if s == "train" else "train"


def _norm(label: str) -> str:
    return label.removeprefix("step").removeprefix("rank").lstrip("_-")


def _pick_rank(found: tuple[Found, ...], rank: str | None, arg: str, side: str) -> tuple[Found, ...]:
    if rank in (None, ALL):
        return found
    want = _norm(rank)
    kept = tuple(f for f in found if f.rank in (want, rank))
    if not kept:
        ranks = sorted({f.rank for f in found if f.rank is not None}, key=_natural)
        raise InputError(f"{arg}: no dump.json matches --{side}-rank {rank!r} (ranks: {', '.join(ranks) or '-'})")
    return kept


def _group(found: tuple[Found, ...]) -> dict:
    out: dict = {}
    for f in sorted(found, key=lambda f: (_natural(f.step or ""), _natural(f.rank or ""))):
        out.setdefault(f.step, []).append(f)
    return out


def _pinned(pin: str, labels: list, arg: str, side: str) -> list:
    text = _norm(pin)
    if "," in text:
        chain = [_norm(x.strip()) for x in text.split(",")]
    else:
        lo, sep, hi = text.partition("-")
        if sep and lo.isdigit() and hi.isdigit():
            chain = [k for k in sorted((x for x in labels if x is not None and x.isdigit()), key=int)
                     if int(lo) <= int(k) <= int(hi)]
        else:
            chain = [text]
    missing = [c for c in chain if c not in labels]
    if missing or not chain:
        raise InputError(f"{arg}: no dump.json matches --{side}-step {pin!r} (steps: "
                         f"{', '.join(str(x) for x in labels if x is not None) or '-'})")
    return chain


def _first_tokens(files: list[Found]) -> Tokens | None:
    return next((f.tokens for f in files if f.tokens is not None), None)


def _tok(by_step: dict, chains: dict, s: str) -> Tokens | None:
    """The tokens a side's chosen chain saw, as one signature (None when not shown)."""
    if s not in chains:
        return None
    toks = [_first_tokens(by_step[s][label]) for label in chains[s][0]]
    if any(t is None for t in toks):
        return None
    if len(toks) == 1:
        return toks[0]
    return Tokens(sum(t.numel or 0 for t in toks), max(t.max for t in toks), min(t.min for t in toks),
                  toks[0].start, None)


def _pair_by_tokens(open_sides: list[str], by_step: dict, chains: dict, args: dict) -> dict:
    """Choose the unpinned sides' steps by the tokens they saw (see references/input_formats.md)."""
    sigs = {s: {k: _first_tokens(v) for k, v in by_step[s].items()} for s in SIDES}
    options = {s: ([chains[s][0]] if s in chains else [[k] for k in by_step[s]]) for s in SIDES}
    pairs = []
    for t in options["train"]:
        for r in options["rollout"]:
            ts, rs = _chain_sig(sigs["train"], t), _chain_sig(sigs["rollout"], r)
            if ts is not None and rs is not None and ts.key == rs.key:
                pairs.append((t, r, "same tokens"))
    if not pairs:
        for s in open_sides:
            o = _other(s)
            for other_chain in options[o]:
                want = _chain_sig(sigs[o], other_chain)
                if want is None:
                    continue
                for run, how in _generations(sigs[s], want):
                    pairs.append((other_chain, run, how) if s == "rollout" else (run, other_chain, how))
    if len(pairs) > 1:
        side = open_sides[0]
        labels = [k for k in by_step[side] if k is not None]
        listing = "; ".join(f"train {_chain_label(t)} ~ rollout {_chain_label(r)}" for t, r, _ in pairs[:6])
        raise InputError(f"{args[side]}: folder holds {len(labels)} dumps (steps: {', '.join(map(str, labels))}) "
                         f"and several saw the same tokens as the other side ({listing}); choose one with "
                         f"--{side}-step")
    if not pairs:
        side = open_sides[0]
        listing = "; ".join(f"step{k}: tokens (numel, max, min) {v.key if v else None}" for k, v in
                            sorted(sigs[side].items(), key=lambda kv: _natural(str(kv[0]))))
        raise InputError(f"{args[side]}: no step of the {side} side saw the same tokens as the other side "
                         f"({listing}); choose with --{side}-step (a range such as 0-8 joins a prefill and "
                         f"its decode steps)")
    t, r, how = pairs[0]
    out = {}
    for s, chain in (("train", t), ("rollout", r)):
        if s in open_sides:
            if len(chain) > 1:
                reason = (f"steps {', '.join(map(str, chain))} joined: together they saw the same tokens as the "
                          f"other side (a prefill, then decode steps; {how})")
            else:
                reason = f"step{chain[0]} chosen: it saw the same tokens as the other side"
            out[s] = (chain, reason)
    return out


def _chain_label(chain: list) -> str:
    return "+".join("-" if k is None else str(k) for k in chain)


def _chain_sig(sigs: dict, chain: list) -> Tokens | None:
    toks = [sigs.get(k) for k in chain]
    if any(t is None for t in toks):
        return None
    if len(toks) == 1:
        return toks[0]
    return Tokens(sum(t.numel or 0 for t in toks), max(t.max for t in toks), min(t.min for t in toks), toks[0].start)


def _generations(sigs: dict, want: Tokens) -> list[tuple[list, str]]:
    """Runs of consecutive steps that together form one generation of the other side's sequence.

    A generation is a prefill and then one step per decoded token. Its token counts add up to the
    other side's, or to one less: the last sampled token is returned, never fed back, while a
    trainer scoring the whole sequence feeds it. Where steps show positions, each continues where
    the previous ended; their Max/Min must lie within the other side's (equal when counts are equal).
    """
    order = sorted((k for k in sigs if k is not None and k.isdigit() and sigs[k] is not None), key=int)
    exact, short = [], []
    for i in range(len(order)):
        total = 0
        for j in range(i, len(order)):
            s = sigs[order[j]]
            if s.start is not None and s.start != total + (sigs[order[i]].start or 0):
                break
            total += s.numel or 0
            run = order[i:j + 1]
            if len(run) < 2 or total < (want.numel or 0) - 1:
                continue
            if total > (want.numel or 0):
                break
            mx, mn = max(sigs[k].max for k in run), min(sigs[k].min for k in run)
            if total == want.numel and (mx, mn) == (want.max, want.min):
                exact.append((run, "count/max/min add up"))
            elif total == (want.numel or 0) - 1 and mx <= want.max and mn >= want.min:
                short.append((run, "count/max/min add up but for the last sampled token, never fed back"))
    # A run one token short is the same generation as the exact run that extends it by one step.
    return exact or short


def _evidence(by_step: dict, chains: dict) -> TokenEvidence:
    """How strongly the chosen steps were shown to hold the same tokens.

    Only equal md5/crc digests of the ids prove identity. Count, Max and Min are weak: msprobe writes
    no Mean/Norm for integer tensors, so a reversed or shuffled prompt passes them.
    """
    t, r = _tok(by_step, chains, "train"), _tok(by_step, chains, "rollout")
    if t is None or r is None:
        return TokenEvidence("none", False, t, r)
    if t.digest and r.digest and t.digest == r.digest:
        return TokenEvidence("md5", True, t, r)
    if t.key == r.key:
        return TokenEvidence("count/max/min", False, t, r)
    if (t.numel or 0) - (r.numel or 0) in (1, -1):
        return TokenEvidence("count/max/min, last token not fed", False, t, r)
    return TokenEvidence("different", False, t, r)


def _same_data(files: list[Found], other: Tokens | None, arg: str, side: str, step) -> tuple[list[Found], str]:
    """Keep the ranks of one step that saw the same data.

    Tensor-parallel and pipeline ranks of one model see the same tokens (or, on later pipeline
    stages, none). Data-parallel ranks see different ones: only the rank that saw the other side's
    tokens is comparable, so it is chosen; without such a rank the user must choose.
    """
    shown = {f.tokens.key for f in files if f.tokens is not None}
    if len(shown) <= 1:
        return files, ""
    if other is not None:
        match = [f for f in files if f.tokens is not None and f.tokens.key == other.key]
        if match:
            return match, (f"step {step}: ranks saw different tokens (data parallel); kept rank(s) "
                           f"{', '.join(str(f.rank) for f in match)}, which saw the other side's")
    listing = "; ".join(f"rank {f.rank}: tokens (numel, max, min) {f.tokens.key if f.tokens else None}" for f in files)
    raise InputError(f"{arg}: the ranks of step {step} saw different tokens, so they are not shards of one "
                     f"model ({listing}); choose one with --{side}-rank")


def _rank_reason(steps: list[StepFiles], rank: str | None, notes: list[str]) -> str:
    n = len(steps[0].files)
    if rank not in (None, ALL):
        return f"pinned by --rank {rank}"
    if notes:
        return "chosen by tokens (the ranks saw different data)"
    if n == 1:
        return "one file"
    return f"{n} ranks of one step, merged by their content"


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
