"""Load several dump files at once, one process per core.

Parsing JSON is CPU-bound and the standard library holds the GIL while it does it, so the two
sides (and the ranks of a tensor-parallel side) are read in separate processes. Each worker
returns its :class:`Dump` already folded (loaders/folding.py), which keeps what travels back
small. Inputs are read in this process when the files besides the largest are small: reading runs
no faster than the largest file alone, so workers would only add their start and the trip back
(a generation's one large engine dump beside a small trainer dump).
"""
from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterator

from ..records import Dump

# Bytes outside the largest file (the work that can run beside it) from which workers pay.
PARALLEL_MIN_BYTES = 32 << 20


def default_jobs() -> int:
    """Worker processes to use: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def load_files(paths: list, load: Callable[[Any], Dump], jobs: int | None = None,
               progress: Callable[[str], None] | None = None) -> Iterator[Dump]:
    """``load`` every path (a file, or an SGLang dumper part), in parallel when it pays; yields
    the dumps in the order of ``paths``.

    At most ``jobs`` files are read ahead of the one the caller is working on, so a caller that
    drops each dump before taking the next holds about ``jobs`` + 1 of them, whatever the count.
    """
    sizes = [input_size(p) for p in paths]
    if jobs is None:
        jobs = default_jobs() if sum(sizes) - max(sizes, default=0) >= PARALLEL_MIN_BYTES else 1
    jobs = max(1, min(jobs, len(paths)))
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    say(f"reading {len(paths)} dump file(s), {sum(sizes) / 1e6:.0f} MB, with {jobs} process(es)")
    if jobs == 1:
        for p, n in zip(paths, sizes):
            dump = load(p)
            say(f"read {p} ({n / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")
            yield dump
            del dump        # not held while the next file is read
        return
    # fork is cheap and needs no re-import; platforms without it use their default start method.
    # The workers are forked before any dump is held here, so they do not carry copies of them.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method)) as pool:
        ahead: deque = deque()
        todo = iter(zip(paths, sizes))
        for p, n in itertools.islice(todo, jobs):
            ahead.append((p, n, pool.submit(load, p)))
        while ahead:
            p, n, fut = ahead.popleft()
            dump = fut.result()
            del fut
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append((*nxt, pool.submit(load, nxt[0])))
            say(f"read {p} ({n / 1e6:.0f} MB) in {time.perf_counter() - start:.1f} s")
            yield dump
            del dump


def input_size(p) -> int:
    """Bytes of one input unit: a file, or anything reporting ``nbytes`` (an SGLang dumper part)."""
    if hasattr(p, "nbytes"):
        return p.nbytes
    try:
        return p.stat().st_size
    except OSError:
        return 0
