"""Find the dump files under a folder, labelled by the step and rank folders on their path
(the input plan, loaders/inputs.py, decides which of them a side reads)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..containment import LeadsOutside, resolve_within
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


def files_below(root: Path, wanted: Callable[[str], bool], max_depth: int = _MAX_DEPTH) -> Iterator[Path]:
    """The files below ``root`` (up to ``max_depth`` folders down) whose names ``wanted`` accepts,
    level by level, each level in path order.

    ``root`` is resolved first (a link the user named is their choice). A wanted file whose real
    path (links followed, its own or a folder's on the way) lies outside it raises InputError
    naming the link, before the file is opened. Links to other files stay allowed: no one reads
    them here (a tensor folder linked from elsewhere is refused leaf by leaf, tensorio). A link
    to nothing, or a loop, is not a file and is passed over, as a missing file would be.
    """
    real_root = Path(root).resolve()
    level = [(Path(root), False)]       # (folder, reached through a link)
    for depth in range(max_depth + 1):
        found, below = [], []
        for folder, via_link in level:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for e in entries:
                path, linked = folder / e.name, via_link or e.is_symlink()
                what = _entry_kind(e)
                if what == "folder":
                    if depth < max_depth:
                        below.append((path, linked))
                elif what == "file" and wanted(e.name):
                    if linked:
                        _check_inside(path, Path(root), real_root)
                    found.append(path)
        yield from sorted(found)
        level = sorted(below)


def _entry_kind(e: os.DirEntry) -> str | None:
    """"folder", "file" or None (anything else, a link to nothing, or a link loop: DirEntry
    raises for the loop where a missing target gives False)."""
    try:
        return "folder" if e.is_dir() else "file" if e.is_file() else None
    except OSError:
        return None


def _check_inside(path: Path, root: Path, real_root: Path) -> None:
    """Raise InputError naming the link by which ``path`` leaves ``real_root``, if it does."""
    try:
        resolve_within(path, real_root)
        return
    except LeadsOutside:
        pass
    except (OSError, RuntimeError):     # RuntimeError: a link loop (is_file() said otherwise: a race)
        return
    link = path
    for n in range(1, len(path.relative_to(root).parts) + 1):
        step = root.joinpath(*path.relative_to(root).parts[:n])
        if step.is_symlink() and not step.resolve().is_relative_to(real_root):
            link = step
            break
    raise InputError(f"{link}: link leads outside the folder {real_root}; refused (to read what it points "
                     "to, name that on the command line)")


def candidates(root: Path) -> list[Candidate]:
    """Every dump.json below ``root`` (a few levels deep) with the step and rank its folders name.

    A dump.json or folder that is a link out of ``root`` is refused (see :func:`files_below`)."""
    found = []
    for p in files_below(root, lambda name: name == "dump.json"):
        step = rank = None
        for part in p.relative_to(root).parts[:-1]:
            step = _label(part, _STEP_RE) if _STEP_RE.match(part) else step
            if _RANK_RE.match(part):
                m = _RANK_RE.match(part)
                rank = m.group(1) if m.group(1) is not None and m.group(1) != "" else (
                    f"proc{m.group(2)}" if m.group(2) else "")
        found.append(Candidate(p, step, rank))
    return found
