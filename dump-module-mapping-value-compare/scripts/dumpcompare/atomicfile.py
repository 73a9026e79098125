"""The one atomic file writer of both skills: a file appears whole or not at all, with the mode
an ordinary file gets under the process's umask.

Standard library only and no package imports: the root-cause skill loads this file by path
from its sibling folder (rootcause/sibling.py), as it does safetext.py and htmlreport.py.
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, TextIO

# Read once (os.umask can only be read by setting it): the mode mkstemp's 0600 is widened to.
_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def open_text(path: Path) -> Iterator[TextIO]:
    """A text file (UTF-8, newlines as given) to write ``path`` through, piece by piece: it is a
    temporary file in the same folder, replaced into place when the block ends and removed when
    anything fails, so a large output is never held whole in memory nor seen half-written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # Names read from damaged files can hold lone surrogates; write them as escapes.
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            yield fh
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text(path: Path, text: str | Iterable[str]) -> Path:
    """Write ``text`` (UTF-8, newlines as given; a string, or its pieces in order, each written as it
    comes so that a large page is never whole in memory) to ``path`` through a temporary file in
    the same folder, replaced into place; the temporary file is removed when anything fails."""
    with open_text(path) as fh:
        if isinstance(text, str):
            fh.write(text)
        else:
            fh.writelines(text)
    return Path(path)
