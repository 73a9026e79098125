"""Pause Python's cyclic garbage collector around a stage that builds many objects and no cycles.

Each full collection walks every tracked object, the loaded dumps' millions of leaves included:
a stage that allocates a few objects per leaf triggers such passes again and again, and their
cost, not the stage's own work, then grows faster than the input. Reference counting still frees
everything the stage drops; only cyclic garbage waits until the collector resumes.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """Run the block (or decorated function) with the cyclic collector off, restoring its state."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
