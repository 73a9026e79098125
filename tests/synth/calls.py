"""Several forward passes of one model written as calls ``forward.0 .. forward.n`` of one dump.

Gradient-accumulation micro-batches (and repeated forwards in general) make each module appear
once per pass with the same structure and different values. Each pass here is a real run of the
numpy model on its own tokens, so the calls differ exactly as real micro-batches do.
"""
from .decode import _call


def as_calls(passes: list) -> list:
    """Entries of ``passes`` (each one run's entry list) renumbered as calls 0..n, pass after pass."""
    out = []
    for n, entries in enumerate(passes):
        for e in entries:
            e.key = _call(e.key, n)
            e.parent = _call(e.parent, n) if e.parent else None
            out.append(e)
    return out
