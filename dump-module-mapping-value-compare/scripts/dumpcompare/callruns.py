"""A module's calls one by one, where the loader folded a run of them into one entry.

The loader folds consecutive calls of a module that share their structure into one entry whose
leaves carry a row of statistics per call (loaders/folding.py). A generation folds that way into
two runs per module: the prefill, then every decode call. Code that lines calls up with tokens
(stitching, bounds, the reference forward's per-call judging) reads them one call at a time;
these helpers give it that view without the loader keeping thousands of entries.
"""
from __future__ import annotations

from .records import Leaf


def call_leaves(leaf: Leaf | None) -> list[Leaf | None]:
    """The calls a leaf holds, each as a leaf of its own (one call: the leaf itself)."""
    if leaf is None or leaf.per_call is None or len(leaf.per_call) <= 1:
        return [leaf]
    # A statistic the run's calls lack is None in every call; one they hold keeps its value, NaN
    # included (a NaN statistic is data, not an absence). Built field by field rather than with
    # dataclasses.replace, which costs several times more and runs once per call of a generation.
    has = (leaf.max is not None, leaf.min is not None, leaf.mean is not None, leaf.norm is not None)
    out = []
    for mx, mn, mean, norm in leaf.per_call.tolist():
        out.append(Leaf(leaf.name, leaf.dtype, leaf.shape, mx if has[0] else None, mn if has[1] else None,
                        mean if has[2] else None, norm if has[3] else None, leaf.requires_grad, leaf.checksum,
                        leaf.data_name, leaf.value, leaf.is_tensor, leaf.merge, leaf.shards, None, leaf.shard_hint))
    return out


def calls_held(leaf: Leaf | None) -> int:
    """How many calls a leaf holds."""
    return 1 if leaf is None or leaf.per_call is None else len(leaf.per_call)


def call_keys(key: str, n: int) -> list[str]:
    """The dump keys of ``n`` calls from call ``key`` on (a run's first key and its length)."""
    if n <= 1:
        return [key]
    base, first = key.rsplit(".", 1)
    return [f"{base}.{int(first) + i}" for i in range(n)]


def side_leaves(leaves: list[dict], carriers, by_call: bool) -> list[Leaf | None]:
    """The leaves ``carriers`` name (``leaves``: per record, leaf name -> Leaf); with ``by_call``
    (a side whose calls are stitched along the tokens) one per call."""
    got = [leaves[c.rec].get(c.leaf) for c in carriers]
    return [x for lf in got for x in call_leaves(lf)] if by_call else got
