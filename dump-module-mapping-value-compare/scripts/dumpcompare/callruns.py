"""A module's calls one by one, where the loader folded a run of them into one entry.

The loader folds consecutive calls of a module that share their structure into one entry whose
leaves carry a row of statistics per call (loaders/folding.py). A generation folds that way into
two runs per module: the prefill, then every decode call. Code that lines calls up with tokens
(stitching, bounds, the reference forward's per-call judging) reads them one call at a time;
these helpers give it that view without the loader keeping thousands of entries.
"""
from __future__ import annotations

from .records import Leaf


def with_row(leaf: Leaf, row, per_call=None) -> Leaf:
    """``leaf`` holding ``row`` (Max, Min, Mean, Norm of one call) and ``per_call`` (the rows of the
    calls it still holds, None for one). A statistic the leaf lacks stays absent in every call; one it
    holds keeps the row's value, NaN included (a NaN statistic is data, not an absence). Built field
    by field, in Leaf's field order, rather than with dataclasses.replace, which costs several times
    more and runs once per call of a generation."""
    return Leaf(leaf.name, leaf.dtype, leaf.shape,
                None if leaf.max is None else row[0], None if leaf.min is None else row[1],
                None if leaf.mean is None else row[2], None if leaf.norm is None else row[3],
                leaf.requires_grad, leaf.checksum, leaf.data_name, leaf.value, leaf.is_tensor, leaf.merge,
                leaf.shards, per_call, leaf.shard_hint)


def call_leaves(leaf: Leaf | None) -> list[Leaf | None]:
    """The calls a leaf holds, each as a leaf of its own (one call: the leaf itself)."""
    if leaf is None or leaf.per_call is None or len(leaf.per_call) <= 1:
        return [leaf]
    return [with_row(leaf, row) for row in leaf.per_call.tolist()]


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
