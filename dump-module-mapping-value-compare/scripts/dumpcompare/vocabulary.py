"""output_4 ``vocabulary``: the words this skill owns and its readers would otherwise re-derive
(references/output_schemas.md): the status groups, the dtype precision order, the parsed form
of every point name the outputs use and what the names stand for. The root-cause skill reads
them from output_4 (its evidence.py), so a change here reaches it through the file alone."""
from __future__ import annotations

from collections.abc import Iterable

from . import points
from .outputs import Members
from .dtypes import PRECISION
from .tolerances import BOUNDED, CLEAN, DIVERGED


def published(point_names: Iterable[str]) -> dict:
    """The ``vocabulary`` record for the given point names; each part of a fused name is a point
    of its own too (a reader may name the part that departs)."""
    names = set()
    for p in point_names:
        names.add(p)
        names.update(points.parts(p))
    return {"statuses": {"clean": list(CLEAN), "diverged": list(DIVERGED), "bounded": list(BOUNDED)},
            "dtype_precision": list(PRECISION),
            "point_words": dict(points.WORDS),
            # Parsed when written or read: a large pair uses tens of thousands of point names.
            "points": Members(points.form, sorted(names))}
