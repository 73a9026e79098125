"""Find the dump files under a folder, labelled by the step and rank folders on their path
(the input plan, loaders/inputs.py, decides which of them a side reads)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
