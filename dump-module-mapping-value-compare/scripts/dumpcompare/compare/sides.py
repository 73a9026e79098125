"""The records an output_3 result holds by the tens of thousands: its sides, their statistics and the
statistics errors, each slotted instead of a dict.

Over many modules (issue 28, item 4: 21.7k results) the dicts these replace were a fifth of the
compare step's memory: a dict of five to nine members costs 200-360 bytes before its values, a
slotted record 70-110. Each reads as the dict it replaces (``rec["modules"]``, ``rec.get("calls")``,
``"stats" in rec``) and is written as it: outputs.py encodes a dataclass as the dict of its fields, in
field order, which is the order the dicts were built in. A record has no ``keys()`` method (a side
has a member of that name); ``as_dict`` gives the dict where one is needed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class _Readable:
    """Dict reads of a slotted dataclass: its fields are its members."""
    __slots__ = ()
    __match_args__: tuple[str, ...]

    def __getitem__(self, name: str) -> Any:
        if name not in self.__match_args__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        """dict.get: the member, or ``default`` when the record has none of that name."""
        return getattr(self, name) if name in self.__match_args__ else default

    def __contains__(self, name: object) -> bool:
        return name in self.__match_args__


@dataclass(slots=True, eq=False)
class SideStats(_Readable):
    """A result side's statistics (output_3 ``Side.stats``), those compared."""
    max: float | None
    min: float | None
    mean: float | None
    norm: float | None
    numel: int | None


@dataclass(slots=True, eq=False)
class Side(_Readable):
    """A result's side (output_3 ``Side``) whose comparison read no statistics (a missing leaf); the
    lists are shared between results (executor._describe) and never changed."""
    modules: list
    keys: list
    leaves: list
    dtypes: list
    shapes: list
    merges: list

    def with_stats(self, stats: SideStats) -> StatsSide:
        """This side holding the statistics it was compared on."""
        return StatsSide(self.modules, self.keys, self.leaves, self.dtypes, self.shapes, self.merges, stats)


@dataclass(slots=True, eq=False)
class StatsSide(Side):
    """A result's side with its statistics: nearly every side of every result."""
    stats: SideStats

    def with_stats(self, stats: SideStats) -> StatsSide:
        """This side holding other statistics (a tensor comparison's, recomputed from the values)."""
        return StatsSide(self.modules, self.keys, self.leaves, self.dtypes, self.shapes, self.merges, stats)


def with_stats(side: Side | dict, stats: SideStats) -> Side | dict:
    """``side`` holding ``stats``; a side kept as a dict (one with ``calls``, stitched from folded
    records, which is rare) gets them as its last member, as before."""
    if type(side) is dict:
        return {**side, "stats": stats}
    return side.with_stats(stats)


@dataclass(slots=True, eq=False)
class StatErrors(_Readable):
    """Raw and scaled differences of two statistics sets (output_3 ``stat_errors``); None where a
    side has no value."""
    max_diff: float | None
    max_rel: float | None
    min_diff: float | None
    min_rel: float | None
    mean_diff: float | None
    mean_rel: float | None
    norm_diff: float | None
    norm_rel: float | None
    scaled_error: float | None


def as_dict(rec: Any) -> Any:
    """The dict a record of this module is written as; any other value unchanged."""
    if isinstance(rec, _Readable):
        return {name: getattr(rec, name) for name in rec.__match_args__}
    return rec
