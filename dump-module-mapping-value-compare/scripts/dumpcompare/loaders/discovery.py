"""Find the dump file a user meant: a dump.json, or a folder holding step/rank folders."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

_STEP_RE = re.compile(r"^step[_-]?(\d+)$")
_RANK_RE = re.compile(r"^(?:rank[_-]?(\d*)|proc(\d+))$")
_MAX_DEPTH = 4


@dataclass(frozen=True)
class Candidate:
    """A dump.json found under a folder, with the step and rank its folders name."""
    path: Path
    step: str | None
    rank: str | None


def _label(part: str, rx: re.Pattern) -> str | None:
    m = rx.match(part)
    if not m:
        return None
    return next((g for g in m.groups() if g), "") if m.groups() else ""


def candidates(root: Path) -> list[Candidate]:
    """Every dump.json below ``root`` (a few levels deep) with the step and rank its folders name."""
    found = []
    for depth in range(_MAX_DEPTH + 1):
        pattern = "/".join(["*"] * depth + ["dump.json"]) if depth else "dump.json"
        for p in sorted(root.glob(pattern)):
            if not p.is_file():
                continue
            step = rank = None
            for part in p.relative_to(root).parts[:-1]:
                step = _label(part, _STEP_RE) if _STEP_RE.match(part) else step
                if _RANK_RE.match(part):
                    m = _RANK_RE.match(part)
                    rank = m.group(1) if m.group(1) is not None and m.group(1) != "" else (
                        f"proc{m.group(2)}" if m.group(2) else "")
            found.append(Candidate(p, step, rank))
    return found


def resolve_dump_file(arg: str, side: str, step: str | None = None, rank: str | None = None) -> Path:
    """Return the single dump file for one side or raise :class:`InputError` explaining the choice.

    ``arg`` is a file (dump.json or our generic JSON) or a folder. A folder holding several
    steps or ranks needs ``--<side>-step`` / ``--<side>-rank``: steps of the train and the
    rollout side are unrelated, so each side is chosen on its own.
    """
    p = Path(arg)
    if not p.exists():
        raise InputError(f"{arg}: --{side} path does not exist")
    if p.is_file():
        return p
    cands = candidates(p)
    if not cands:
        raise InputError(f"{arg}: no dump.json found in this folder (looked {_MAX_DEPTH} levels deep)")
    if step is not None:
        want = step.removeprefix("step").lstrip("_-")
        cands = [c for c in cands if c.step == want]
    if rank is not None:
        want = rank.removeprefix("rank").lstrip("_-")
        cands = [c for c in cands if c.rank in (want, rank)]
    if len(cands) == 1:
        return cands[0].path
    if not cands:
        raise InputError(f"{arg}: no dump.json matches --{side}-step/--{side}-rank "
                         f"({step!r}, {rank!r})")
    steps = sorted({c.step for c in cands if c.step is not None}, key=_natural)
    ranks = sorted({c.rank for c in cands if c.rank is not None}, key=_natural)
    raise InputError(
        f"{arg}: folder holds {len(cands)} dumps (steps: {', '.join(steps) or '-'}; "
        f"ranks: {', '.join(ranks) or '-'}); choose one with --{side}-step and --{side}-rank "
        f"(--{side}-rank all merges the tensor-parallel ranks of one step)")


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
