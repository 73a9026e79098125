"""The one atomic file writer of both skills: a file appears whole or not at all, with the mode
an ordinary file gets under the process's umask.

Standard library only and no package imports: the root-cause skill loads this file by path
from its sibling folder (rootcause/sibling.py), as it does safetext.py and htmlreport.py.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Read once (os.umask can only be read by setting it): the mode mkstemp's 0600 is widened to.
_UMASK = os.umask(0)
os.umask(_UMASK)


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` through a temporary file in the same
    folder, replaced into place; the temporary file is removed when anything fails."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # Names read from damaged files can hold lone surrogates; write them as escapes.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
