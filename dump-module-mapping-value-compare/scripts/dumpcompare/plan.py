"""The mapping plan's records (output_2): module pairs, one-sided modules, planned point
comparisons, and the pairs value alignment finds. Plain data: the planner (mapping.py) and value
alignment (value_align.py) build them, the executor, the analysis and the writers read them."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .naming import ModuleRecord


@dataclass(slots=True)
class Carrier:
    """A leaf on one side that holds (part of) a point."""
    rec: int                   # index into that side's records
    leaf: str
    io: str


@dataclass(slots=True)
class PointPlan:
    """One planned comparison (output_2 ``comparisons`` row, executed into output_3)."""
    cid: str
    point: str
    kind: str                  # direct | composite
    axis: str                  # features (activations) | rows (parameters)
    train: list[Carrier]
    rollout: list[Carrier]
    train_layout: str | None = None
    rollout_layout: str | None = None
    pair: str | None = None    # set when the comparison reads one pair's own leaves
    stitched: str | None = None  # side whose calls 0..n are concatenated along the tokens
    # Leaves whose shapes give the attention head size, for a fused qkv in a per-group layout:
    # (what, side, carrier), see _head_carriers; the empty tuple, shared, for every other point.
    heads: list[tuple[str, str, Carrier]] | tuple = ()


# A module's points by how it holds them (output_2 ``Pair.points``).
IOS = ("in", "out", "param")


class PortPoints(Mapping):
    """A pair's points per io, read from its records' ports each time they are asked for: each point
    once, in the order first carried. Kept as lists, the points of the many-module pair's 8k pairs
    held 3.7 MB through the writing of the outputs; the ports hold them already, and they are read
    a few times (the analysis, output_2)."""
    __slots__ = ("_recs", "_own")

    def __init__(self, recs: list[ModuleRecord], own: bool):
        # ``own``: one record that shares no point with another port, whose ports are the answer.
        self._recs, self._own = recs, own

    def __getitem__(self, io: str) -> list[str]:
        if io not in IOS:
            raise KeyError(io)
        if self._own:
            return [p.point for p in self._recs[0].ports if p.io == io]
        seen: dict[str, None] = {}          # an ordered set
        for r in self._recs:
            for port in r.ports:
                if port.io == io:
                    seen[port.point] = None
        return list(seen)

    def __iter__(self) -> Iterator[str]:
        return iter(IOS)

    def __len__(self) -> int:
        return len(IOS)


@dataclass(slots=True)
class Pair:
    """A train <-> rollout module correspondence."""
    pid: str
    kind: str                  # one_to_one | composite | by_design_difference | cross_role
    train: list[int]
    rollout: list[int]
    layer: int | None
    block: str
    role: str | None
    note: str | None = None
    points: dict[str, list[str]] | PortPoints = field(default_factory=lambda: {io: [] for io in IOS})
    aligned_by: str = "names"  # names | values | order (value_align.py)


@dataclass(slots=True)
class OneSided:
    """A forward module with no counterpart on the other side."""
    side: str
    rec: int
    expected: bool
    reason: str
    activation_like: bool
    before_pair: str | None = None
    after_pair: str | None = None
    pass_through: str | None = None    # "checksum" / "statistics" when it hands its input on (passthrough.py)


@dataclass
class MappingPlan:
    """Everything output_2 holds."""
    pairs: list[Pair]
    one_sided: list[OneSided]
    comparisons: list[PointPlan]
    unmatched_points: dict[str, list[str]]


@dataclass
class Aligned:
    """A pair found here: records of each side, how it was found, and the leaves both carry."""
    train: ModuleRecord
    rollout: ModuleRecord
    by: str                                  # "values" or "order"
    leaves: list[tuple[str, str]]            # (leaf name, io) carried by both, same size

    @property
    def note(self) -> str:
        """Why the two modules pair (output_2 ``note``)."""
        if self.by == "values":
            return "no naming rule explains these modules: paired because their outputs carry the same statistics"
        return ("no naming rule explains these modules: paired by position between aligned modules "
                "(same number of modules, same parameter and output sizes, in order)")

    def point(self, leaf: str) -> str:
        """The point a leaf is compared as: no rule names the tensor, so both paths do."""
        return f"aligned:{self.train.path}={self.rollout.path}:{leaf}"
