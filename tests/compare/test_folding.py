"""Folding repeated calls at load time: exact per-call statistics, a new run where a call differs, and a
clean fallback when calls arrive out of order."""
import json
import math
from dataclasses import replace

import pytest

from dumpcompare.callruns import call_keys, call_leaves
from dumpcompare.loaders import load_path
from synth import Config, init_weights, run_side, write_dump
from synth.calls import as_calls

CFG = Config(layers=2, hidden=16, intermediate=32, heads=2, kv_heads=1, head_dim=8, vocab=32, seq_len=4)
CALLS = 3


@pytest.fixture(scope="module")
def dump_doc(tmp_path_factory):
    w = init_weights(CFG)
    passes = [run_side(replace(CFG, seed=5 + i), "hf", grad=True, weights=w) for i in range(CALLS)]
    folder = write_dump(tmp_path_factory.mktemp("calls") / "d", as_calls(passes))
    return json.loads((folder / "dump.json").read_text())


def _write(tmp_path, doc, data):
    p = tmp_path / "dump.json"
    p.write_text(json.dumps(dict(doc, data=data)))
    return p


def _stats(lf):
    return (lf.name, lf.dtype, lf.shape, lf.max, lf.min, lf.mean, lf.norm)


def _same(a, b):
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a, b))


def _unfolded(dump):
    return [(e.key, [_stats(lf) for lf in e.leaves]) for e in dump.entries]


def _every_call(dump):
    """key -> leaf statistics of every call, runs taken apart."""
    out = {}
    for e in dump.entries:
        per_leaf = [call_leaves(lf) if lf.is_tensor else [lf] * e.n_calls for lf in e.leaves]
        for i, key in enumerate(call_keys(e.key, e.n_calls)):
            out[key] = [_stats(calls[i]) for calls in per_leaf]
    return out


def test_folded_rows_hold_every_call_exactly(tmp_path, dump_doc):
    p = _write(tmp_path, dump_doc, dump_doc["data"])
    folded, apart = load_path(p), load_path(p, fold=False)
    assert folded.folded and not apart.folded
    assert len(apart.entries) == CALLS * len(folded.entries)
    by_key = {e.key: e for e in apart.entries}
    for e in folded.entries:
        assert e.n_calls == CALLS
        for call in range(CALLS):
            other = by_key[e.key.rsplit(".", 1)[0] + f".{call}"]
            for lf, ref in zip(e.leaves, other.leaves):
                if not lf.is_tensor:
                    continue
                row = tuple(None if math.isnan(v) and s is None else v
                            for v, s in zip(lf.per_call[call], (lf.max, lf.min, lf.mean, lf.norm)))
                assert _same(row, (ref.max, ref.min, ref.mean, ref.norm)), (e.key, lf.name, call)


def _mutations(data):
    keys = list(data)
    later = next(k for k in keys if k.endswith(".forward.2") and "mlp.down_proj" in k)
    first = later[:-1] + "0"

    def shape(d):
        d[later]["output"][0]["shape"] = [9, 9]

    def mean_null(d):
        d[later]["output"][0]["Mean"] = None

    def extra_kwarg(d):
        d[later]["input_kwargs"]["scale"] = {"type": "float", "value": 0.5}

    def retyped(d):
        d[later]["output"][0] = 3        # a tensor item written as a plain number

    def reorder(d):
        order = [k for k in keys if k != later]
        order.insert(order.index(first), later)      # call 2 before call 0
        return {k: d[k] for k in order}


    return {"shape": shape, "mean_null": mean_null, "extra_kwarg": extra_kwarg, "retyped": retyped,
            "reorder": reorder}


@pytest.mark.parametrize("name", ["shape", "mean_null", "extra_kwarg", "retyped"])
def test_a_call_that_differs_starts_a_new_run_and_loses_nothing(tmp_path, dump_doc, name):
    data = json.loads(json.dumps(dump_doc["data"]))
    _mutations(data)[name](data)
    p = _write(tmp_path, dump_doc, data)
    folded, apart = load_path(p), load_path(p, fold=False)
    assert folded.folded
    # the changed call 2 of down_proj is a run of its own, after the run of calls 0 and 1
    runs = [(e.call, e.n_calls) for e in folded.entries if "mlp.down_proj" in e.key and e.direction == "forward"
            and ".layers.0." in e.key]
    assert runs == [(0, 2), (2, 1)]
    got, want = _every_call(folded), dict(_unfolded(apart))
    assert sorted(got) == sorted(want)
    for key, stats in want.items():
        assert len(got[key]) == len(stats) and all(_same(x, y) for x, y in zip(got[key], stats)), key


def test_calls_that_keep_changing_stay_apart_and_lose_nothing(tmp_path, dump_doc):
    # call 1 of down_proj differs from calls 0 and 2: after a second run of one call the module's
    # calls are read as they are instead of starting a run per call
    data = json.loads(json.dumps(dump_doc["data"]))
    key = next(k for k in data if k.endswith(".forward.1") and "layers.0.mlp.down_proj" in k)
    data[key]["output"][0]["shape"] = [9, 9]
    p = _write(tmp_path, dump_doc, data)
    folded, apart = load_path(p), load_path(p, fold=False)
    runs = [(e.call, e.n_calls) for e in folded.entries if "layers.0.mlp.down_proj" in e.key and e.direction == "forward"]
    assert runs == [(0, 1), (1, 1), (2, 1)]
    assert folded.folded          # the other modules still fold
    got, want = _every_call(folded), dict(_unfolded(apart))
    assert sorted(got) == sorted(want)
    for k, stats in want.items():
        assert all(_same(x, y) for x, y in zip(got[k], stats)), k


def test_calls_out_of_order_turn_folding_off_and_lose_nothing(tmp_path, dump_doc):
    data = json.loads(json.dumps(dump_doc["data"]))
    changed = _mutations(data)["reorder"](data)
    p = _write(tmp_path, dump_doc, changed)
    folded, apart = load_path(p), load_path(p, fold=False)
    assert not folded.folded
    got, want = _unfolded(folded), _unfolded(apart)
    assert [k for k, _ in got] == [k for k, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def test_a_repeated_key_turns_folding_off_and_the_last_one_wins(tmp_path, dump_doc):
    data = dump_doc["data"]
    later = next(k for k in data if k.endswith(".forward.1"))
    text = json.dumps(dict(dump_doc, data=data))
    body = json.dumps({later: data[later]})[1:-1]
    p = tmp_path / "dump.json"
    p.write_text(text[:-2] + ", " + body + "}}")
    dump = load_path(p)
    assert not dump.folded
    assert any("duplicate entry key" in n for n in dump.notes)
    assert [e.key for e in dump.entries].count(later) == 1


def test_dotted_argument_names_that_collide_turn_folding_off(tmp_path, dump_doc):
    data = json.loads(json.dumps(dump_doc["data"]))
    for key, entry in data.items():
        if "mlp.down_proj" in key:
            leaf = entry["output"][0]
            entry["input_kwargs"] = {"x": {"y": dict(leaf)}, "x.y": dict(leaf, Max=leaf["Max"] * 2)}
    p = _write(tmp_path, dump_doc, data)
    folded, apart = load_path(p), load_path(p, fold=False)
    assert not folded.folded
    assert _unfolded(folded) == _unfolded(apart)
