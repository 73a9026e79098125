"""Folding a run's later calls from their text (loaders/folding.py, _Template): a call whose text
matches the run's pattern is read from the match without being decoded, and reads exactly as the
same call loaded call by call; any text the pattern does not cover is decoded as before."""
import dataclasses
import json
import math
import re

import numpy as np
import pytest

from dumpcompare.callruns import call_keys, call_leaves, with_row
from dumpcompare.loaders import folding, jsonstream, load_path
from dumpcompare.records import Leaf

MODULE = "Module.model.layers.0.mlp.MLP.forward"
CALLS = 12


def _item(mx, mn, mean, norm, shape=(1, 8), dtype="torch.float32"):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape),
            "Max": mx, "Min": mn, "Mean": mean, "Norm": norm, "requires_grad": False}


def _entry(i):
    """Call i: statistics of every kind JSON and msprobe write (integers, -0, exponents, NaN,
    infinities, null), a non-tensor argument and a dict argument with a "Max" key of its own."""
    return {"input_args": [_item(1.5 + i, -0.25 * i, 1e-7 * (i + 1), float(i))],
            "input_kwargs": {"scale": {"type": "float", "value": 0.5},
                             "cfg": {"Max": 3, "name": "keep"},
                             "ids": _item(10 + i, 0, None, None, dtype="torch.int64")},
            "output": [_item(float("nan") if i % 3 == 0 else 2.0 ** (i - 6),
                             float("-inf") if i % 4 == 0 else -1.0e300 * i,
                             float("inf") if i == 5 else 0.125, 7)]}


def _text(entries, indent=None, raw=None):
    """A dump.json of ``entries`` ([(key, entry)]) as msprobe writes it (bare NaN/Infinity); ``raw``
    replaces a value's text by key."""
    body = []
    for key, entry in entries:
        value = (raw or {}).get(key) or json.dumps(entry, indent=indent)
        body.append(json.dumps(key) + ": " + value)
    return '{"task": "statistics", "level": "L0", "data": {\n' + ",\n".join(body) + "\n}}"


def _calls(n=CALLS):
    return [(f"{MODULE}.{i}", _entry(i)) for i in range(n)]


def _every_call(dump):
    """key -> per leaf (name, dtype, shape, Max, Min, Mean, Norm as repr: -0.0 and NaN compare)."""
    out = {}
    for e in dump.entries:
        per_leaf = [call_leaves(lf) if lf.is_tensor else [lf] * e.n_calls for lf in e.leaves]
        for i, key in enumerate(call_keys(e.key, e.n_calls)):
            out[key] = [(lf.name, lf.dtype, lf.shape, *map(repr, (lf.max, lf.min, lf.mean, lf.norm)), lf.value)
                        for lf in (calls[i] for calls in per_leaf)]
    return out


@pytest.fixture
def decoded(monkeypatch):
    """Counts the calls folding decodes and checks (the rest were read from their text)."""
    seen = {"n": 0}
    check = folding.CallFolder._fold_call

    def counting(self, g, value):
        seen["n"] += 1
        return check(self, g, value)
    monkeypatch.setattr(folding.CallFolder, "_fold_call", counting)
    return seen


@pytest.mark.parametrize("indent", [None, 1])
def test_calls_read_from_text_equal_the_calls_read_one_by_one(tmp_path, decoded, indent):
    p = tmp_path / "dump.json"
    p.write_text(_text(_calls(), indent))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert [(e.key, e.n_calls) for e in folded.entries] == [(f"{MODULE}.0", CALLS)]
    assert decoded["n"] == 1            # call 1 checked by decoding; calls 2.. matched as text
    assert _every_call(folded) == _every_call(apart)     # as repr: -0.0 and 0.0 differ


def test_integer_minus_zero_reads_as_json_does(tmp_path, decoded):
    calls = _calls()
    raw = {key: re.sub(r'"Min": [^,]+', '"Min": -0', json.dumps(entry), count=1) for key, entry in calls[1:]}
    p = tmp_path / "dump.json"
    p.write_text(_text(calls, raw=raw))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert decoded["n"] == 1
    assert _every_call(folded) == _every_call(apart)
    # JSON reads the integer -0 as int 0, which has no sign (a float -0.0 keeps its sign)
    mins = folded.entries[0].leaves[0].per_call[:, 1]
    assert math.copysign(1, mins[0]) == -1 and all(math.copysign(1, m) == 1 for m in mins[1:])


@pytest.mark.parametrize("change", ["shape", "quoted_nan", "null_stat", "non_tensor_value", "leaf_field",
                                    "key_order", "spacing"])
def test_a_call_whose_text_differs_beyond_its_numbers_is_decoded(tmp_path, decoded, change):
    calls = _calls()
    key, entry = calls[7]
    text = json.dumps(entry)
    raw = {key: {"shape": text.replace("[1, 8]", "[1, 9]", 1),
                 "quoted_nan": text.replace('"Max": 8.5', '"Max": "nan"'),
                 "null_stat": text.replace('"Max": 8.5', '"Max": null'),
                 "non_tensor_value": text.replace('"value": 0.5', '"value": 0.75'),
                 "leaf_field": text.replace('"name": "keep"', '"name": "drop"'),
                 "key_order": json.dumps({k: entry[k] for k in reversed(list(entry))}),
                 "spacing": text.replace(", ", ",  ", 1)}[change]}
    assert raw[key] != text
    p = tmp_path / "dump.json"
    p.write_text(_text(calls, raw=raw))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert _every_call(folded) == _every_call(apart)
    runs = [(e.call, e.n_calls) for e in folded.entries]
    if change in ("key_order", "spacing", "quoted_nan"):
        # the same structure in other text (a quoted non-finite is a statistic too): decoded, checked,
        # and folded into the run
        assert runs == [(0, CALLS)] and decoded["n"] == 2
    else:
        assert runs[0] == (0, 7) and sum(n for _, n in runs) == CALLS and decoded["n"] >= 2


def test_a_statistic_key_inside_a_string_makes_no_template(tmp_path, decoded):
    # '"Max": 3' inside a key of a non-tensor dict looks like a statistic to a text scan
    calls = [(k, dict(e, input_kwargs=dict(e["input_kwargs"], cfg={'the "Max': 3}))) for k, e in _calls()]
    p = tmp_path / "dump.json"
    p.write_text(_text(calls))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert [(e.key, e.n_calls) for e in folded.entries] == [(f"{MODULE}.0", CALLS)]
    assert decoded["n"] == CALLS - 1    # every later call decoded: no pattern was made
    assert _every_call(folded) == _every_call(apart)


def test_calls_across_window_ends_read_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "_CHUNK", 700)      # about one call per window
    p = tmp_path / "dump.json"
    p.write_text(_text(_calls(40)))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert [(e.key, e.n_calls) for e in folded.entries] == [(f"{MODULE}.0", 40)]
    assert _every_call(folded) == _every_call(apart)


@pytest.mark.parametrize("cut", [0.55, 0.8])
def test_damage_or_truncation_in_matched_calls_is_salvaged_as_without_folding(tmp_path, cut):
    text = _text(_calls(30))
    at = text.index('"Max"', int(len(text) * cut))
    for name, blob in (("damaged", text[:at] + "#" + text[at + 1:]), ("truncated", text[:at + 3])):
        p = tmp_path / f"{name}.json"
        p.write_text(blob)
        folded, apart = load_path(p), load_path(p, fold=False)
        assert folded.salvage is not None and folded.salvage == apart.salvage, name
        assert _every_call(folded) == _every_call(apart)


def test_an_integer_json_refuses_is_refused_in_matched_calls_too(tmp_path):
    # the scanner refuses an integer of more digits than Python converts (float() would take it)
    calls = _calls()
    key, entry = calls[6]
    raw = {key: json.dumps(entry).replace('"Max": 7.5', '"Max": ' + "7" * 5000)}
    p = tmp_path / "dump.json"
    p.write_text(_text(calls, raw=raw))
    folded, apart = load_path(p), load_path(p, fold=False)
    assert folded.salvage is not None and folded.salvage == apart.salvage
    assert folded.salvage.last_complete_key == f"{MODULE}.5"
    assert _every_call(folded) == _every_call(apart)


def test_a_call_of_a_folded_leaf_keeps_every_other_field():
    # callruns.with_row builds the leaf positionally: a field added to or moved in Leaf must follow
    names = [f.name for f in dataclasses.fields(Leaf)]
    leaf = Leaf(**{n: f"<{n}>" for n in names})
    got = with_row(leaf, [1.0, 2.0, 3.0, 4.0], np.zeros((2, 4)))
    want = dataclasses.replace(leaf, max=1.0, min=2.0, mean=3.0, norm=4.0, per_call=got.per_call)
    assert [getattr(got, n) for n in names] == [getattr(want, n) for n in names]
