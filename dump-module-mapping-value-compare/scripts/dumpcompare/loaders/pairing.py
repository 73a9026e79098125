"""Pair a train step with a rollout step by the tokens they saw.

Train step N and rollout step N are unrelated (msprobe steps once per vLLM ``execute_model``, so
each decode step lands in its own folder, while a train step is an optimizer or micro-batch step).
When a side holds several steps and none is pinned, the step whose token ids (the first integer
input of the dump, i.e. the embedding's) match the other side's is chosen.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from .discovery import candidates
from .jsonstream import StreamState, iter_entries
from .msprobe import build_entry

_SCAN_ENTRIES = 50


def token_signature(path: Path) -> tuple | None:
    """(numel, max, min) of the first integer tensor a forward module receives, or None."""
    state = StreamState()
    try:
        for n, (key, value) in enumerate(iter_entries(path, state)):
            if n >= _SCAN_ENTRIES:
                break
            e = build_entry(key, value, n)
            if e is None or e.direction != "forward":
                continue
            for lf in e.leaves:
                if lf.name.startswith("input") and lf.dtype and "int" in lf.dtype and lf.shape is not None:
                    return (lf.numel, lf.max, lf.min)
    except InputError:
        return None
    return None


def _norm(step: str) -> str:
    return step.removeprefix("step").lstrip("_-")


def _side_steps(arg: str, pin: str | None, rank: str | None) -> dict:
    """step label (None without step folders) -> one dump file of that step (pinned rank, else the first)."""
    p = Path(arg)
    if p.is_file():
        return {None: p}
    if not p.is_dir():
        return {}
    found: dict = {}
    for c in candidates(p):
        if rank not in (None, "all") and c.rank not in (_norm(rank), rank.removeprefix("rank").lstrip("_-"), rank):
            continue
        found.setdefault(c.step, c.path)
    if pin is not None:
        return {k: v for k, v in found.items() if k == _norm(pin)}
    return found


def pair_steps(train: str, rollout: str, pins: dict, ranks: dict) -> tuple[dict, list[str]]:
    """Fill in unpinned steps by matching token signatures; returns (steps per side, notes)."""
    args = {"train": train, "rollout": rollout}
    found = {s: _side_steps(args[s], pins[s], ranks[s]) for s in args}
    open_sides = [s for s in args if pins[s] is None and len(found[s]) > 1]
    if not open_sides or any(not f for f in found.values()):
        return dict(pins), []
    sigs = {s: {k: token_signature(v) for k, v in found[s].items()} for s in args}
    pairs = [(t, r) for t, ts in sigs["train"].items() for r, rs in sigs["rollout"].items()
             if ts is not None and ts == rs]
    if len(pairs) > 1:
        return dict(pins), []       # ambiguous: the loader asks the user to choose, listing the steps
    if not pairs:
        side = open_sides[0]
        listing = "; ".join(f"step{k}: tokens (numel, max, min) {v}" for k, v in
                            sorted(sigs[side].items(), key=lambda kv: str(kv[0])))
        raise InputError(f"{args[side]}: no step of the {side} side saw the same tokens as the other side "
                         f"({listing}); choose with --{side}-step")
    steps, notes = dict(pins), []
    for s, chosen in zip(("train", "rollout"), pairs[0]):
        if s in open_sides:
            steps[s] = chosen
            notes.append(f"{s} step{chosen} chosen: it saw the same tokens as the other side")
    return steps, notes
