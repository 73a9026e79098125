"""The mapping plan's records (output_2): module pairs, one-sided modules, planned point
comparisons, and the pairs value alignment finds. Plain data: the planner (mapping.py) and value
alignment (value_align.py) build them, the executor, the analysis and the writers read them."""
from __future__ import annotations

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
    # (what, side, carrier), see _head_carriers.
    heads: list[tuple[str, str, Carrier]] = field(default_factory=list)


@dataclass
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
    points: dict[str, list[str]] = field(default_factory=lambda: {"in": [], "out": [], "param": []})
    aligned_by: str = "names"  # names | values | order (value_align.py)


@dataclass
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
