"""Turn untrusted text (names read from a dump) into the safe form of each view.

Dump keys are written by whoever produced the dump; the views are opened by people: CSV in
spreadsheets, markdown and HTML in viewers, summaries in terminals. Each function here gives the
form in which that viewer shows the text as text and executes or re-lays out nothing. JSON is data,
not a view: it keeps the exact text and never goes through this module.

This file imports nothing but the standard library on purpose: the root-cause skill loads it by
file path from this folder (``rootcause/sibling.py``) so that both skills escape with one
implementation. Keep it self-contained. The rules are in references/output_schemas.md
("Escaped views").
"""
from __future__ import annotations

import html as _html
import unicodedata

# A spreadsheet reads a cell starting with one of these as a formula (or, for tab and carriage
# return, strips them and reads what follows).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# The first characters of every string csv_cell changes: a writer of many cells may pass it only
# the strings starting with one of these and keep every other string as it is.
CSV_RISKY_FIRST = frozenset(_FORMULA_START + ("'",))
# Characters a markdown viewer reads as markup inside a table row; a backslash escapes each.
_MARKDOWN_SPECIAL = frozenset("\\`|*[]<>&")
# Unicode categories shown as escapes: controls (ANSI escapes, \r, \n, DEL, C1), format characters
# (bidi overrides such as U+202E, zero-width characters), line/paragraph separators, surrogates.
_INVISIBLE_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs"))


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with every control, format and separator character written as ``\\xNN``/``\\uNNNN``.

    This is the terminal's form (summaries, one-line errors): an ANSI escape, a carriage return or
    a right-to-left override in a name is printed as its escape instead of recolouring,
    overwriting or reversing the line.
    """
    text = str(text)
    if text.isascii() and text.isprintable():
        return text
    return "".join(_escape_char(ch) if unicodedata.category(ch) in _INVISIBLE_CATEGORIES else ch
                   for ch in text)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def csv_cell(value):
    """Form of a CSV cell: text a spreadsheet would read as a formula gets a leading ``'``.

    A string starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return that is not a
    number gets one leading apostrophe; so does a string that already starts with one, so that a
    reader gets the exact text back by stripping one leading apostrophe from every cell that has
    one. Numbers and every other string are returned unchanged.
    """
    if isinstance(value, str) and (value.startswith("'") or
                                   value.startswith(_FORMULA_START) and not _is_number(value)):
        return "'" + value
    return value


def markdown(text: str) -> str:
    """Form of ``text`` inside a markdown table cell or paragraph.

    Pipes, backticks, brackets, ``*``, ``<``, ``>``, ``&`` and backslashes are backslash-escaped
    so that a table keeps its columns and no link, code span or inline HTML is formed; newlines and
    other invisible characters are written as visible escapes so that a row stays one line.
    """
    text = visible(text)
    if not any(ch in _MARKDOWN_SPECIAL for ch in text):
        return text
    return "".join("\\" + ch if ch in _MARKDOWN_SPECIAL else ch for ch in text)


def html(text: str) -> str:
    """Form of ``text`` in HTML element content or a quoted attribute value.

    Everything markup-relevant is escaped (``<``, ``>``, ``&``, both quotes), and invisible
    characters (bidi overrides included) are written as visible escapes. Never build a URL or an
    unquoted attribute from dump text, escaped or not.
    """
    return _html.escape(visible(text), quote=True)
