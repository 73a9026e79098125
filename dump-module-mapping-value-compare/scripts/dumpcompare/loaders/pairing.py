"""Pair a train step with a rollout step by the tokens they saw.

Train step N and rollout step N are unrelated (msprobe steps once per vLLM ``execute_model``, so
each decode step lands in its own folder, while a train step is an optimizer or micro-batch step).
When a side holds several steps and none is pinned, the step whose token ids (the first integer
input of the dump, i.e. the embedding's) match the other side's is chosen.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from . import sglang_dumper
from .discovery import candidates
from .jsonstream import StreamState, iter_entries
from .msprobe import build_entry

_SCAN_ENTRIES = 50


def token_signature(path) -> tuple | None:
    """(numel, max, min, first position) of the tokens a dump saw, or None.

    The tokens are the first integer tensor a forward module receives (the embedding's ids). The
    first position comes from the first later integer input of the same size holding consecutive
    values (the rotary embedding's positions): None when the dump shows none. ``path`` may also
    be a part of an SGLang dumper folder.
    """
    if isinstance(path, sglang_dumper.DumperPart):
        return sglang_dumper.token_signature(path)
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
                    ids = (lf.numel, lf.max, lf.min)
                elif lf.numel == ids[0] and lf.max - lf.min + 1 == lf.numel:
                    return (*ids, lf.min)
    except InputError:
        return None
    return None if ids is None else (*ids, None)


def _norm(step: str) -> str:
    return step.removeprefix("step").lstrip("_-")


def _chain_pin(pin: str, labels: list) -> list | None:
    """Steps named by a pin such as ``3-7`` (every step from 3 to 7) or ``3,4,5``; None for one step."""
    text = _norm(pin)
    if "," in text:
        return [_norm(x.strip()) for x in text.split(",")]
    lo, sep, hi = text.partition("-")
    if not sep or not (lo.isdigit() and hi.isdigit()):
        return None
    return [k for k in sorted((x for x in labels if x is not None and x.isdigit()), key=int)
            if int(lo) <= int(k) <= int(hi)]


def _chains(sigs: dict, want: tuple) -> list[list]:
    """Runs of consecutive steps that together saw the tokens ``want``: a prefill, then decode steps.

    Their token counts add up and their Max/Min together are the other side's; where a step shows
    its positions, each step starts where the previous ones ended (this is what tells a decode
    step from another request of the same length).
    """
    order = sorted((k for k in sigs if k is not None and k.isdigit() and sigs[k] is not None), key=int)
    n, mx, mn = want[:3]
    found = []
    for i in range(len(order)):
        total = 0
        for j in range(i, len(order)):
            start = sigs[order[j]][3]
            if start is not None and start != total + (sigs[order[i]][3] or 0):
                break
            total += sigs[order[j]][0] or 0
            if total >= n:
                run = order[i:j + 1]
                if total == n and len(run) > 1 and max(sigs[k][1] for k in run) == mx \
                        and min(sigs[k][2] for k in run) == mn:
                    found.append(run)
                break
    return found


def _side_steps(arg: str, pin: str | None, rank: str | None) -> dict:
    """step label (None without step folders) -> one dump file of that step (pinned rank, else the
    first); for an SGLang dumper folder, one part of that step."""
    p = Path(arg)
    if p.is_file():
        return {None: p}
    if not p.is_dir():
        return {}
    found: dict = {}
    cands = candidates(p)
    if not cands and sglang_dumper.looks_like_dumper(p):
        for part in sglang_dumper.find_parts(p):
            if rank in (None, "all") or part.rank == rank.removeprefix("rank").lstrip("_-"):
                found.setdefault(part.step, part)
    for c in cands:
        if rank not in (None, "all") and c.rank not in (_norm(rank), rank.removeprefix("rank").lstrip("_-"), rank):
            continue
        found.setdefault(c.step, c.path)
    if pin is not None:
        chain = _chain_pin(pin, list(found))
        return {k: v for k, v in found.items() if k in (chain or [_norm(pin)])}
    return found


def pair_steps(train: str, rollout: str, pins: dict, ranks: dict) -> tuple[dict, list[str]]:
    """Fill in unpinned steps by matching token signatures; returns (steps per side, notes).

    A side's step is a label, or a list of labels when consecutive steps (a prefill, then one
    folder per decode step) together saw the other side's tokens and are to be joined.
    """
    args = {"train": train, "rollout": rollout}
    found = {s: _side_steps(args[s], pins[s], ranks[s]) for s in args}
    steps = {s: (_chain_pin(pins[s], list(found[s])) or pins[s]) if pins[s] is not None else None for s in args}
    open_sides = [s for s in args if pins[s] is None and len(found[s]) > 1]
    if not open_sides or any(not f for f in found.values()):
        return steps, []
    sigs = {s: {k: token_signature(v) for k, v in found[s].items()} for s in args}
    pairs = [(t, r) for t, ts in sigs["train"].items() for r, rs in sigs["rollout"].items()
             if ts is not None and rs is not None and ts[:3] == rs[:3]]
    if not pairs:
        pairs = [(k, run) if side == "rollout" else (run, k)
                 for side in open_sides
                 for k, sig in sigs["train" if side == "rollout" else "rollout"].items() if sig is not None
                 for run in _chains(sigs[side], sig)]
    if len(pairs) > 1:
        return steps, []       # ambiguous: the loader asks the user to choose, listing the steps
    if not pairs:
        side = open_sides[0]
        listing = "; ".join(f"step{k}: tokens (numel, max, min) {v[:3] if v else v}" for k, v in
                            sorted(sigs[side].items(), key=lambda kv: str(kv[0])))
        raise InputError(f"{args[side]}: no step of the {side} side saw the same tokens as the other side "
                         f"({listing}); choose with --{side}-step")
    notes = []
    for s, chosen in zip(("train", "rollout"), pairs[0]):
        if s in open_sides:
            steps[s] = chosen
            notes.append(f"{s} steps {', '.join(chosen)} joined: together they saw the same tokens as the "
                         "other side (a prefill, then decode steps)" if isinstance(chosen, list) else
                         f"{s} step{chosen} chosen: it saw the same tokens as the other side")
    return steps, notes
