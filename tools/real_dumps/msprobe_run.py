"""Run msprobe's PrecisionDebugger around a forward or a generation, laid out as msprobe lays it out.

msprobe keeps one debugger per process (a singleton that counts steps), so every dump is made in
a fresh process: ``run_ranks`` starts them.

Public API:
    Probe(dump_path, task="statistics", summary_mode="statistics", level="L0")
        one PrecisionDebugger per process; writes ``dump_path/step<i>/rank<r>/`` (``proc<pid>``
        when torch.distributed is not initialised)
    probe.forward(model, fn) -> fn()        one msprobe step around ``fn`` (a training forward)
    probe.step_scope(model) -> (i -> context manager)
        for vllm_like.generate: each engine forward is start/stop/step, so the prefill is
        ``step0`` and decoded token i is ``step<i+1>``, ``forward.N`` restarting at 0 in each
    run_ranks(target, tp, *args)            call ``target(*args)`` in ``tp`` forked processes with
        a gloo process group of size ``tp`` (rank r is ``rank<r>`` in the dump; ``tp=0``: one
        process without torch.distributed, as a plain training script runs)
    stable_proc_names(root)                 rename ``proc<pid>`` folders to ``proc0`` so that a
        regenerated dump has the same paths
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import tempfile
from pathlib import Path


class Probe:
    def __init__(self, dump_path, task="statistics", summary_mode="statistics", level="L0"):
        from msprobe.pytorch import PrecisionDebugger

        cfg = {"task": task, "dump_path": str(dump_path), "rank": [], "step": [], "level": level,
               "async_dump": False,
               task: {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}}
        if task == "tensor":
            del cfg[task]["summary_mode"]
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(cfg, fh)
        try:
            self.debugger = PrecisionDebugger(config_path=path)
        finally:
            os.unlink(path)

    def forward(self, model, fn):
        import torch

        self.debugger.start(model=model)
        try:
            with torch.no_grad():
                return fn()
        finally:
            self.debugger.stop()
            self.debugger.step()

    def step_scope(self, model):
        @contextlib.contextmanager
        def scope(_i):
            self.debugger.start(model=model)
            try:
                yield
            finally:
                self.debugger.stop()
                self.debugger.step()
        return scope


def _child(rank, tp, store, target, args):
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    if tp:
        tdist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=tp)
    try:
        target(*args)
    finally:
        if tp:
            tdist.destroy_process_group()


def run_ranks(target, tp, *args):
    # fork: the children inherit the parent's imports (torch, transformers, msprobe take ~15 s to
    # import on this machine); each child still creates its own debugger.
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_child, args=(r, tp, store, target, args)) for r in range(max(tp, 1))]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        bad = [p.exitcode for p in procs if p.exitcode]
        if bad:
            raise RuntimeError(f"{getattr(target, '__name__', target)} failed in a child (exit {bad})")


def stable_proc_names(root):
    for proc in sorted(Path(root).glob("step*/proc*")):
        if proc.name != "proc0":
            proc.rename(proc.with_name("proc0"))
