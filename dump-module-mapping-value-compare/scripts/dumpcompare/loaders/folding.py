"""Fold runs of a module's calls into one entry whose leaves carry per-call statistics.

A large dump is mostly the same modules called again and again: gradient-accumulation
micro-batches, recomputation, repeated forwards, an engine's decode calls. Naming, mapping and
planning depend only on a module's key and the structure of its leaves, so consecutive calls of a
module with the same structure (leaf names, dtypes, shapes, which statistics are present, the
same non-tensor arguments, no per-call tensor file or checksum) are kept as one :class:`Entry` (the
run's first call) with ``n_calls`` and each leaf's ``per_call`` statistics. A call whose structure
differs starts the module's next run: a generation folds into two runs per module, the prefill
and then every decode call, instead of one entry per call.

A later call is checked and read without building leaves: its four statistics are taken out of
each tensor item and what remains must equal the run's first call's remains (one deep comparison
in C). Once a run holds two calls, the text of its second call becomes a pattern (_Template): the
same text with each statistic's number left open. A later call whose text matches it is the same
structure with other numbers, so it is read from the text without being decoded at all; any other
text (another structure, a statistic that is not a number, the window's end) is decoded and checked
as above. That keeps loading near the speed of reading the file, which matters for gigabyte dumps.

Calls that arrive out of order or repeat a key stop folding for the whole dump: every call
becomes its own entry again, exactly as without folding. Code that reads calls one by one (a
stitched generation) takes a run apart with callruns.call_leaves.
"""
from __future__ import annotations

import json
import math
import os
import re
from array import array
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

import numpy as np

from ..callruns import with_row
from ..records import BACKWARD, FORWARD, Entry
from .msprobe import build_entry, parse_key, stat_value

_STATS = ("Max", "Min", "Mean", "Norm")
_NAN = math.nan
# A statistic's value as the standard library's JSON scanner reads a number (ASCII digits only),
# and the bare constants msprobe writes; one capturing group. At most 600 digits before the point:
# the scanner refuses an integer longer than Python's limit (640 at the least), which float() would
# take, so such text is left to the scanner.
_NUMBER = r"(-?(?:0|[1-9][0-9]{0,599})(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|NaN|Infinity|-Infinity)"
_STAT_VALUE = re.compile(r'"(?:Max|Min|Mean|Norm)"\s*:\s*' + _NUMBER)
# Stands in for each statistic found in a call's text while that text is checked (_template): a
# string no statistic is, with a per-process mark no file holds.
_MARK = "\x00" + os.urandom(8).hex() + ":"
_decoder = json.JSONDecoder()
# Calls with more statistics or text than this are decoded, not matched: compiling the pattern of a
# module returning thousands of tensors (or of a call holding a long string) costs more than decoding
# its few calls; templates pay off for the thousands of calls of a module of a few tensors, a
# generation's decode steps (about 1 KB each).
_TEMPLATE_MAX_STATS = 1024
_TEMPLATE_MAX_CHARS = 1 << 16


@dataclass
class _Template:
    """A run's call as text with its statistics left open: ``pattern`` matches the text of a call of
    the same structure, its groups the numbers in text order; ``row`` puts them in row order (4 per
    leaf, NaN where the run lacks a statistic)."""
    pattern: re.Pattern
    row: Any                         # numbers in text order + [NaN] -> the row; None: they are the row


@dataclass
class _Group:
    first: Entry
    paths: list[tuple]               # per leaf of ``first``: keys from the entry to its item; () if not a tensor
    absent: list[bool]               # 4 per leaf: which statistics call 0 lacks
    remains: Any                     # call 0's entry with the statistics taken out
    rows: array                      # float64, 4 per leaf per call, NaN where absent
    orders: list[int] = field(default_factory=list)    # file positions of the run's later calls
    # A later run of its module (the calls changed structure once already). A flag, not a link to
    # the first run: a group linking to itself is a cycle, and with the collector paused (gcpause.py)
    # every run's decoded first call would stay in memory until the end.
    later: bool = False
    head: str = ""                   # the module's key without its call number
    next_key: str = ""               # the key of the run's next call
    template: Any = None             # _Template once built; False when the calls' text cannot be one

    @property
    def next_call(self) -> int:
        return self.first.call + len(self.orders) + 1


def _path(value: Any, name: str) -> tuple:
    """Keys leading from an entry's value to the item of leaf ``name`` (list positions as ints)."""
    keys, node = [], value
    for seg in name.split("."):
        k = int(seg) if type(node) is list else seg
        node = node[k]
        keys.append(k)
    return tuple(keys)


def _take_stats(value: Any, paths: list[tuple], taken: list) -> list:
    """Pop the four statistics of every tensor item (raw, in leaf order; None for a non-tensor).

    ``taken`` receives each item and its values so that :func:`_put_back` can undo this.
    Runs once per call of every module: kept to plain loops and C-level dict operations.
    """
    raw: list = []
    for keys in paths:
        if not keys:
            raw += (None, None, None, None)
            continue
        item = value
        for k in keys:
            item = item[k]
        if type(item) is not dict:
            raise TypeError("a tensor item of call 0 is something else in this call")
        pop = item.pop
        vals = (pop("Max", None), pop("Min", None), pop("Mean", None), pop("Norm", None))
        taken.append((item, vals))
        raw += vals
    return raw


def _template(text: str, g: _Group) -> _Template | False:
    """The pattern of the calls of run ``g`` whose text is ``text`` (a call of the run, folded), or
    False. Every statistic found in the text is replaced by a marked string and the text decoded:
    the template holds only if the marks are exactly the statistics the run's leaves hold (each
    once, none in another item, a string or a key); the rest of the text is that of a call that
    folded, so it equals the run's remains."""
    if len(text) > _TEMPLATE_MAX_CHARS:
        return False
    spans = [m.span(1) for m in _STAT_VALUE.finditer(text)]
    if len(spans) > _TEMPLATE_MAX_STATS:
        return False
    marked, prev = [], 0
    for k, (a, b) in enumerate(spans):
        marked += (text[prev:a], json.dumps(f"{_MARK}{k}"))
        prev = b
    marked.append(text[prev:])
    marked_text = "".join(marked)
    try:
        value, end = _decoder.raw_decode(marked_text)
        raw = _take_stats(value, g.paths, []) if type(value) is dict else None
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return False
    if raw is None or end != len(marked_text):
        return False
    slot: dict[int, int] = {}         # statistic in text order -> its place in the row
    for j, v in enumerate(raw):
        if v is None:
            if not g.absent[j]:
                return False
            continue
        if type(v) is not str or not v.startswith(_MARK) or g.absent[j]:
            return False
        k = int(v[len(_MARK):])
        if k in slot:
            return False
        slot[k] = j
    if len(slot) != len(spans):
        return False
    source = [len(spans)] * len(raw)  # the NaN appended after the numbers
    for k, j in slot.items():
        source[j] = k
    pieces, prev = [], 0
    for a, b in spans:
        pieces += (re.escape(text[prev:a]), _NUMBER)
        prev = b
    pieces.append(re.escape(text[prev:]))
    # Four places per leaf: never exactly one, which itemgetter would return bare.
    row = None if source == list(range(len(source))) else itemgetter(*source)
    return _Template(re.compile("".join(pieces)), row)


def _numbers(raw: list) -> list:
    return [v if type(v) is float else stat_value(v) for v in raw]


def _put_back(taken: list) -> None:
    for item, vals in taken:
        item.update(zip(_STATS, vals))


def _call_entry(first: Entry, call: int, row) -> Entry:
    """Call ``call`` of a folded module as its own entry (its statistics from ``row``)."""
    leaves = [with_row(lf, row[4 * i:4 * i + 4]) for i, lf in enumerate(first.leaves)]
    return replace(first, key=f"{first.key.rsplit('.', 1)[0]}.{call}", call=call, leaves=leaves, n_calls=1)


def select_calls(first: Entry, picks: list[int]) -> Entry:
    """The calls at positions ``picks`` of a folded entry (0 = its first call) as one entry of
    their own, whose first call is ``picks[0]``; call numbers and key are left to the caller."""
    if first.n_calls <= 1:
        return first
    at = np.asarray(picks)
    leaves = [lf if lf.per_call is None else
              with_row(lf, lf.per_call[at[0]].tolist(), lf.per_call[at] if len(picks) > 1 else None)
              for lf in first.leaves]
    return replace(first, leaves=leaves, n_calls=len(picks))


class CallFolder:
    """Receives a dump's ``(key, value)`` items in file order and builds its entries."""

    def __init__(self, enabled: bool = True) -> None:
        # (file position, entry); a run's later calls live in its group instead
        self.kept: list[tuple[int, Entry]] = []
        self.groups: dict[tuple, _Group] = {}       # per module: its current run
        self.runs: list[_Group] = []
        # Modules whose calls stopped folding (per module: its next call): a second run that ended
        # with one call means the calls keep changing (shapes alternating from call to call), and
        # starting a run per call would cost more than reading the calls as they are.
        self.apart: dict[tuple, int] = {}
        self.keys: set[str] = set()
        self.skipped: list[str] = []
        self.count = 0
        self.broken = not enabled
        self.by_next: dict[str, _Group] = {}        # the current runs again, by the key of their next call

    def add(self, key: str, value: Any) -> None:
        """Take the next item of the dump's ``data`` object."""
        parsed = parse_key(key)
        if parsed is None or not isinstance(value, dict):
            self.skipped.append(key)
            return
        order, self.count = self.count, self.count + 1
        kind, path, cls, direction, call = parsed
        if not self.broken and kind == "module" and direction in (FORWARD, BACKWARD):
            base = (path, cls, direction)
            g = self.groups.get(base)
            nxt = self.apart.get(base, 0 if g is None else g.next_call)
            in_order = key not in self.keys and call == nxt
            if g is not None and in_order and self._fold_call(g, value):
                self._folded(g, key, order)
                return
            e = build_entry(key, value, order, parsed)
            if not in_order:
                self._break()
            elif base in self.apart or (g is not None and not g.orders and g.later):
                if self.groups.pop(base, None) is not None:
                    del self.by_next[g.next_key]
                self.apart[base] = call + 1
            else:
                self._start_group(base, e, value, g)   # the module's first call, or a new structure
            self.keys.add(key)
            self.kept.append((order, e))
            return
        self.kept.append((order, build_entry(key, value, order, parsed)))

    def _start_group(self, base: tuple, e: Entry, value: dict, before: _Group | None) -> None:
        try:
            paths = [_path(value, lf.name) if lf.is_tensor else () for lf in e.leaves]
            found = [p for p in paths if p]
            if len(set(found)) != len(found):
                raise ValueError("two leaves lead to one item (dotted argument names)")
            nums = _numbers(_take_stats(value, paths, []))
        except (KeyError, IndexError, TypeError, ValueError):
            self._break()           # leaf names that do not lead back to their own items
            return
        g = _Group(e, paths, [v is None for v in nums], value, array("d", [_NAN if v is None else v for v in nums]))
        g.later = before is not None
        g.head = e.key.rsplit(".", 1)[0]
        g.next_key = f"{g.head}.{g.next_call}"
        if before is not None:
            self.by_next.pop(before.next_key, None)
        self.groups[base] = g
        self.by_next[g.next_key] = g
        self.runs.append(g)

    def take(self, key: str, text: str, pos: int) -> int | None:
        """The next call of a run, read from the dump's text (jsonstream.Take): where its value ends,
        or None to have it decoded and given to :meth:`add`. The run's second call is decoded here:
        when it folds, its text becomes the run's template, and otherwise it goes to :meth:`add` (not
        decoded twice). A later call whose text matches the template is read from the match alone."""
        g = self.by_next.get(key)
        if g is None or key in self.keys:
            return None
        t = g.template
        if t is None:
            try:
                value, end = _decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):
                return None          # the window's end, or damage: the reader decides which
            if type(value) is not dict:
                return None          # maybe cut by the window's end (a number): the reader reads it
            if self._fold_call(g, value):
                g.template = _template(text[pos:end], g)
                self._folded(g, key, self.count)
                self.count += 1
            else:
                self.add(key, value)
            return end
        if t is False:
            return None
        m = t.pattern.match(text, pos)
        if m is None:
            return None
        found = m.groups()
        vals = list(map(float, found))
        if "-0" in found:            # an integer zero: json reads it as int 0, which has no sign
            vals = [0.0 if tok == "-0" else v for tok, v in zip(found, vals)]
        if t.row is not None:
            vals.append(_NAN)
            vals = t.row(vals)
        g.rows.extend(vals)
        self._folded(g, key, self.count)
        self.count += 1
        return m.end()

    def _folded(self, g: _Group, key: str, order: int) -> None:
        """Call ``key`` (at file position ``order``) joined run ``g``."""
        g.orders.append(order)
        del self.by_next[g.next_key]
        g.next_key = f"{g.head}.{g.next_call}"
        self.by_next[g.next_key] = g
        self.keys.add(key)

    def _fold_call(self, g: _Group, value: dict) -> bool:
        taken: list = []
        try:
            nums = _numbers(_take_stats(value, g.paths, taken))
            same = value == g.remains and [v is None for v in nums] == g.absent
        except (KeyError, IndexError, TypeError):
            same = False
        if not same:
            _put_back(taken)
            return False
        g.rows.extend([_NAN if v is None else v for v in nums])
        return True

    def finish(self) -> tuple[list[Entry], list[str], bool]:
        """(entries in file order, skipped keys, folded): folded when some run holds several calls."""
        entries = [e for _, e in self.kept]
        if self.broken or all(not g.orders for g in self.runs):
            return entries, self.skipped, False
        for g in self.runs:
            if not g.orders:
                continue
            n = len(g.orders) + 1
            per_call = np.frombuffer(g.rows, dtype=np.float64).reshape(n, len(g.first.leaves), 4)
            g.first.n_calls = n
            for i, lf in enumerate(g.first.leaves):
                if lf.is_tensor:
                    lf.per_call = per_call[:, i, :]
        return entries, self.skipped, True

    def _break(self) -> None:
        """Give every folded call back its own entry, in file order, and stop folding."""
        if self.broken:
            return
        self.broken = True
        for g in self.runs:
            w = len(g.first.leaves) * 4
            self.kept += [(order, _call_entry(g.first, g.first.call + i, g.rows[i * w:(i + 1) * w]))
                          for i, order in enumerate(g.orders, start=1)]
        self.kept.sort(key=lambda oe: oe[0])
        self.groups.clear()
        self.by_next.clear()
        self.runs.clear()
