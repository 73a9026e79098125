"""Read a msprobe dump.json one entry at a time.

The file is one JSON object whose ``data`` member maps entry keys to entries. Reading
it whole (``json.load``) needs the entire tree in memory and loses everything when the
file is truncated, which is exactly the state of a dump from a job killed mid-write.
This reader walks the top-level object with the C scanner of the standard library
(``JSONDecoder.raw_decode``), decodes each entry on its own and yields it, so memory
stays proportional to one entry plus what the caller keeps, and a damaged tail only
loses the entries after the damage.

Bare ``NaN``, ``Infinity`` and ``-Infinity`` tokens, which msprobe writes, are accepted.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import InputError
from ..records import Salvage

# The window's copies and the chunk read into it are the reader's own memory: kept small.
_CHUNK = 1 << 20
_WS = " \t\n\r"
# Longest unfinished token the scanner reports away from its own start ("-Infinity", "\\uXXXX",
# a number's dangling "e-"), with room to spare.
_TOKEN_TAIL = 16
_decoder = json.JSONDecoder()
# The separator before an entry and its key up to the value, in one match, for a key without escapes
# or control characters (its text is its value, as JSON decodes it): the usual key. Any other text
# (the end of ``data``, an escaped key, the window's end, damage) takes the general path.
_PLAIN_KEY = re.compile(r'[ \t\n\r]*,?[ \t\n\r]*"([^"\\\x00-\x1f]*)"[ \t\n\r]*:[ \t\n\r]*')


@dataclass
class StreamState:
    """Top-level members other than ``data`` and the salvage note, filled while reading."""
    header: dict[str, Any] = field(default_factory=dict)
    salvage: Salvage | None = None
    saw_data: bool = False


class _Incomplete(Exception):
    """The buffer ended inside a token; more text is needed (or the file is truncated)."""


class _Damaged(Exception):
    """Invalid JSON before the end of the file (corruption, not truncation)."""

    def __init__(self, msg: str, byte_offset: int):
        super().__init__(msg)
        self.byte_offset = byte_offset


class _Buffer:
    """A sliding text window over the file that tracks the byte offset of its start."""

    def __init__(self, fh):
        self.fh = fh
        self.text = ""
        self.pos = 0
        self.dropped_bytes = 0
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        if self.pos > _CHUNK:
            # An ASCII window (the usual dump) counts its bytes without a copy.
            self.dropped_bytes += self.pos if self.text.isascii() else self.offset_of(self.pos) - self.dropped_bytes
            self.text = self.text[self.pos:]
            self.pos = 0
        more = self.fh.read(max(_CHUNK, len(self.text)))
        if not more:
            self.eof = True
            return False
        self.text += more
        return True

    def byte_offset(self) -> int:
        return self.offset_of(self.pos)

    def skip_ws(self) -> str:
        """Skip white space and return the next character ('' at end of file)."""
        while True:
            text, n = self.text, len(self.text)
            p = self.pos
            while p < n and text[p] in _WS:
                p += 1
            self.pos = p
            if p < n:
                return text[p]
            if not self.fill():
                return ""

    def expect(self, ch: str) -> None:
        got = self.skip_ws()
        if got == "":
            raise _Incomplete()
        if got != ch:
            raise ValueError(f"expected '{ch}' but found '{got}'")
        self.pos += 1

    def value(self) -> Any:
        """Decode one JSON value at the cursor, reading more text until it is complete."""
        self.skip_ws()
        while True:
            try:
                obj, end = _decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if not _cut_by_window_end(exc, len(self.text)):
                    # The bad character is inside the window: more text cannot mend it.
                    raise _Damaged(exc.msg, self.offset_of(exc.pos)) from None
                if self.fill():
                    continue
                raise _Incomplete() from exc
            # A number at the very end of the window may continue in the next chunk.
            if end == len(self.text) and not self.eof and self.fill():
                continue
            self.pos = end
            return obj

    def offset_of(self, index: int) -> int:
        """Byte offset in the file of character ``index`` of the window."""
        return self.dropped_bytes + len(self.text[:index].encode("utf-8", "surrogatepass"))


def _cut_by_window_end(exc: json.JSONDecodeError, n: int) -> bool:
    """True when a decode error may come from the window ending inside a value.

    The C scanner reports an unfinished string at the string's start, and any other unfinished
    token (a literal such as ``-Infinity``, a number, a ``\\uXXXX`` escape) within a few
    characters of the end; an error earlier than that points at a character that is really
    there, which no amount of further text can make valid.
    """
    return exc.msg.startswith("Unterminated string") or exc.pos >= n - _TOKEN_TAIL


# take(key, text, pos): the index in ``text`` where the entry value starting at ``pos`` ends, when
# the caller read that value itself; None to have it decoded and yielded.
Take = Callable[[str, str, int], "int | None"]


def iter_entries(path: Path, state: StreamState, take: Take | None = None) -> Iterator[tuple[str, Any]]:
    """Yield ``(key, entry)`` pairs of the ``data`` member in file order.

    Other top-level members land in ``state.header``. A file that is not a JSON object
    raises :class:`InputError`; damage or truncation after the start of ``data`` stops
    the iteration and records a :class:`Salvage` in ``state.salvage``.

    ``take``, when given, is offered each entry's value as text before it is decoded (the window
    and the value's start): a caller that recognises the value reads it there and returns where it
    ends, and that entry is not yielded; it still counts as read for the salvage note. A value the
    window holds only part of cannot be recognised, so it is decoded as usual.
    """
    try:
        fh = open(path, "r", encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from None
    with fh:
        buf = _Buffer(fh)
        last_key: str | None = None
        count = 0
        in_data = False
        try:
            first = buf.skip_ws()
            if first != "{":
                found = repr(first) if first else "an empty file"
                raise InputError(f"{path}: not a dump: expected a JSON object, found {found}")
            buf.pos += 1
            while True:
                ch = buf.skip_ws()
                if ch == "}":
                    return
                if ch == ",":
                    buf.pos += 1
                    ch = buf.skip_ws()
                if ch != '"':
                    raise ValueError(f"expected a member name but found {ch!r}")
                name = buf.value()
                buf.expect(":")
                if name != "data":
                    state.header[name] = buf.value()
                    continue
                state.saw_data = True
                buf.expect("{")
                in_data = True
                while True:
                    m = _PLAIN_KEY.match(buf.text, buf.pos)
                    if m is not None:
                        key = m.group(1)
                        buf.pos = m.end()
                    else:
                        ch = buf.skip_ws()
                        if ch == "}":
                            buf.pos += 1
                            in_data = False
                            break
                        if ch == ",":
                            buf.pos += 1
                            buf.skip_ws()
                        key = buf.value()
                        if not isinstance(key, str):
                            raise ValueError("entry key is not a string")
                        buf.expect(":")
                        buf.skip_ws()
                    if take is not None:
                        end = take(key, buf.text, buf.pos)
                        if end is not None:
                            buf.pos = end
                            last_key = key
                            count += 1
                            continue
                    entry = buf.value()
                    yield key, entry
                    last_key = key
                    count += 1
        except InputError:
            raise
        except (_Incomplete, _Damaged, ValueError, UnicodeDecodeError, RecursionError) as exc:
            if not state.saw_data:
                raise InputError(f"{path}: not a readable dump: {_describe(exc)} before the "
                                 f"'data' object (byte {buf.byte_offset()})") from None
            if not in_data and count:
                # Damage after the data object closed costs nothing but the trailing header.
                return
            where = exc.byte_offset if isinstance(exc, _Damaged) else buf.byte_offset()
            state.salvage = Salvage(byte_offset=where, last_complete_key=last_key,
                                    entries_recovered=count, reason=_describe(exc))


def _describe(exc: Exception) -> str:
    if isinstance(exc, _Incomplete):
        return "file ends in the middle of a value (truncated)"
    if isinstance(exc, _Damaged):
        return f"damaged, not truncated: invalid JSON ({exc}) at byte {exc.byte_offset}, before the end of the file"
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    return str(exc) or type(exc).__name__
