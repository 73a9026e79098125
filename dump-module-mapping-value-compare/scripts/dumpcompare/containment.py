"""Where a path really leads: the one check that a file found in a folder stays inside it, and
the one description of what a path given by the user is (file, folder, device, ...).

Dumps come from other machines and other people: a ``dump.json``, a step folder, a dumper file
or a tensor file found inside the folder the user named may be a link to anywhere. Reading
through it would put another run's data (or any file of this machine) into the outputs, so the
real path (links followed) must lie inside the real path of that folder. Links that stay inside
are fine: copies of a dump often share files through them.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


class LeadsOutside(Exception):
    """A path whose real location lies outside the folder it was found in."""

    def __init__(self, path: Path, root: Path):
        self.path, self.root = path, root
        super().__init__(f"{path}: leads outside the folder {root}")


def resolve_within(path: Path, root: Path) -> Path:
    """The real path of ``path`` (every link followed), which must lie inside ``root``.

    ``root`` is a real path already (``Path.resolve()``: the folder the user named, links in it
    being the user's choice). Raises :class:`LeadsOutside` when the real path is outside it, and
    ``OSError`` or ``RuntimeError`` (a link loop) when the path cannot be resolved.
    """
    real = Path(path).resolve()
    if not real.is_relative_to(root):
        raise LeadsOutside(path, root)
    return real


def kind(path: Path) -> str:
    """What ``path`` is, links followed: "file", "folder", "missing" (nothing there, or a link
    to nothing or a loop), or "device or FIFO" (anything else: reading one may block or never
    end, so no reader opens it)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):       # ValueError: a NUL in the name
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    return "device or FIFO"
