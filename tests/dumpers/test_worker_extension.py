"""The vLLM worker extension's two layouts, on a stand-in worker and a stand-in msprobe debugger
(the extension's logic is ours; vLLM and msprobe only provide the objects it calls)."""
import sys
import types
from types import SimpleNamespace

import pytest

from dumping import vllm_worker_ext as ext


class FakeDebugger:
    def __init__(self, config_path=None):
        self.config_path = config_path
        self.events = []

    def start(self, model=None):
        self.events.append(("start", model))

    def stop(self):
        self.events.append(("stop",))

    def step(self):
        self.events.append(("step",))


@pytest.fixture
def debugger(monkeypatch):
    one = FakeDebugger()
    pkg = types.ModuleType("msprobe")
    sub = types.ModuleType("msprobe.pytorch")
    sub.PrecisionDebugger = lambda config_path=None: one  # one per process, as msprobe's
    pkg.pytorch = sub
    monkeypatch.setitem(sys.modules, "msprobe", pkg)
    monkeypatch.setitem(sys.modules, "msprobe.pytorch", sub)
    return one


def _worker():
    calls = []

    def execute_model(scheduler_output, *args):
        calls.append(scheduler_output.total_num_scheduled_tokens)
        return "output"

    runner = SimpleNamespace(model="the-model", execute_model=execute_model)
    return SimpleNamespace(model_runner=runner), calls, execute_model


def _sched(n):
    return SimpleNamespace(total_num_scheduled_tokens=n)


def test_per_call_gives_one_step_per_forward_call(debugger):
    worker, calls, original = _worker()
    ext.start_dump_fn(worker, "cfg.json", per_call=True)
    assert debugger.events == []
    for n in (8, 0, 1, 1):  # prefill, an empty scheduler step, two decode calls
        assert worker.model_runner.execute_model(_sched(n)) == "output"
    assert calls == [8, 0, 1, 1]
    assert debugger.events == [("start", "the-model"), ("stop",), ("step",)] * 3
    assert ext.stop_dump_fn(worker) == 3
    assert worker.model_runner.execute_model is original


def test_one_step_spans_the_whole_generation(debugger):
    worker, _, original = _worker()
    ext.MsprobeWorkerExtension.start_dump(worker, "cfg.json")
    for n in (8, 1, 1):
        worker.model_runner.execute_model(_sched(n))
    assert debugger.events == [("start", "the-model")]
    assert ext.MsprobeWorkerExtension.stop_dump(worker) == 1
    assert debugger.events == [("start", "the-model"), ("stop",), ("step",)]
    assert worker.model_runner.execute_model is original


def test_a_step_is_closed_when_the_forward_raises(debugger):
    worker, _, _ = _worker()

    def boom(_s):
        raise RuntimeError("forward failed")
    worker.model_runner.execute_model = boom
    ext.start_dump_fn(worker, "cfg.json", per_call=True)
    with pytest.raises(RuntimeError):
        worker.model_runner.execute_model(_sched(4))
    assert debugger.events[-2:] == [("stop",), ("step",)]


def test_start_twice_and_stop_without_start_are_refused(debugger):
    worker, _, _ = _worker()
    with pytest.raises(RuntimeError, match="no dump running"):
        ext.stop_dump_fn(worker)
    ext.start_dump_fn(worker, "cfg.json")
    with pytest.raises(RuntimeError, match="already running"):
        ext.start_dump_fn(worker, "cfg.json")


def test_extension_methods_do_not_clash_with_worker_names():
    # vLLM refuses an extension attribute the worker class already has; these are the only ones.
    own = {n for n in vars(ext.MsprobeWorkerExtension) if not n.startswith("__")}
    assert own == {"start_dump", "stop_dump"}
