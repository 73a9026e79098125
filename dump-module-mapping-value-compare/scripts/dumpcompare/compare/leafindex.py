"""Each record's leaves by name, as the executor and the checks after it look them up
(``view.leaves[rec].get(name)``), without a dict per record.

A dict of a record's three or four leaves cost about 230 bytes: over many modules (issue 28, item 4:
20k entries) 5 MB, held while the comparisons ran, at the compare step's peak. A record with few
leaves is searched instead (a few string comparisons, the names interned by the loader); one with
many (a wide module's hundreds of thousands) gets its dict once, when first asked.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from ..records import Entry, Leaf

# Records with more leaves than this are looked up in a dict made for them.
SCAN_MAX = 16


class _Few(Mapping):
    """A record's few leaves by name; a later leaf of a repeated name wins, as in a dict built in order."""
    __slots__ = ("_leaves",)

    def __init__(self, leaves: list[Leaf]):
        self._leaves = leaves

    def __getitem__(self, name: str) -> Leaf:
        for lf in reversed(self._leaves):
            if lf.name == name:
                return lf
        raise KeyError(name)

    def get(self, name: str, default=None):
        """Mapping.get without raising and catching KeyError (asked twice per comparison)."""
        for lf in reversed(self._leaves):
            if lf.name == name:
                return lf
        return default

    def __contains__(self, name: object) -> bool:
        return any(lf.name == name for lf in self._leaves)

    def __iter__(self) -> Iterator[str]:
        return iter({lf.name: None for lf in self._leaves})

    def __len__(self) -> int:
        return len({lf.name for lf in self._leaves})


class EntryLeaves(Sequence):
    """Per record index (a side's entries in order), that record's leaves by name."""
    __slots__ = ("_entries", "_wide")

    def __init__(self, entries: list[Entry]):
        self._entries = entries
        self._wide: dict[int, dict[str, Leaf]] = {}

    def __getitem__(self, rec: int) -> Mapping[str, Leaf]:
        leaves = self._entries[rec].leaves
        if len(leaves) <= SCAN_MAX:
            return _Few(leaves)
        got = self._wide.get(rec)
        if got is None:
            got = self._wide[rec] = {lf.name: lf for lf in leaves}
        return got

    def __len__(self) -> int:
        return len(self._entries)
