"""Replays of each side's modules from its own dumped tensors (tensor mode; output_3 ``replays``):
the standard modules (modules.py), the routing of mixture-of-experts layers (routing.py) and the
attention kernels (attention.py), on the math and candidate grids of kernels.py."""
from __future__ import annotations

from . import attention, modules, routing


def run(recs: dict, views: dict, refs: dict, tolerances: dict) -> list[dict]:
    """Every replay of both sides: standard modules, then routing, then attention."""
    return (modules.run(recs, views, refs, tolerances) + routing.run(recs, views, refs, tolerances)
            + attention.run(recs, views, refs, tolerances))
