"""Minimal reproductions of the crashes the fuzzer found (tools/fuzz_dumps.py KNOWN_CRASHES).

Each test states the contract (exit 0 or 2, one line on stderr, no traceback) for one input that
currently breaks it, so each is a strict xfail: when the crash is fixed the test passes, strict
makes that an XPASS failure, and the marker (and the KNOWN_CRASHES entry) should be removed.
They run the real scripts as subprocesses, as a user would. ``raises=AssertionError`` with the
signature check in ``assert_contract`` keeps them precise: a different failure of the same input
is an error, not an expected failure.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fuzz.fuzz_support import (COMPARE, MLP_OUT, ROOTCAUSE, SAMPLES, Raw, copy_pair, emit, fuzz_dumps,
                               leaf, read_doc, run_script, tiny_pair, write_doc)

LLAMA = SAMPLES / "llama_L0_statistics" / "step0" / "proc0" / "dump.json"
GENERIC_DOC = fuzz_dumps.GENERIC_DOC


def known(tag: str):
    """Strict xfail for the known crash ``tag`` (an AssertionError from assert_contract)."""
    return pytest.mark.xfail(strict=True, raises=AssertionError,
                             reason=f"known crash {tag}: {fuzz_dumps.KNOWN_CRASHES[tag][1]}")


def assert_contract(proc, tag: str):
    """Exit 0 or 2, one stderr line for 2, no traceback; a break that is not ``tag`` is an error."""
    broken = ("Traceback" in proc.stderr or proc.returncode not in (0, 2)
              or proc.returncode == 2 and (len(proc.stderr.strip().splitlines()) != 1
                                           or "internal error" in proc.stderr))
    if broken and fuzz_dumps.KNOWN_CRASHES[tag][0] not in proc.stderr:
        raise RuntimeError(f"contract broken, but not by known crash {tag}: exit {proc.returncode}: "
                           f"{proc.stderr[-500:]}")
    assert not broken, f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("known") / "pair"
    tiny_pair(root)
    return root


@pytest.fixture
def pair(base, tmp_path):
    t, r = copy_pair(base, tmp_path / "pair")
    return SimpleNamespace(train=t, rollout=r, t=read_doc(t), r=read_doc(r), out=tmp_path / "out",
                           root=tmp_path)


def _run(p, script=COMPARE):
    write_doc(p.train, p.t)
    write_doc(p.rollout, p.r)
    return run_script(script, p.train, p.rollout, p.out)


@known("huge_int")
def test_integer_statistic_beyond_float_range(pair):
    # {"Max": 1000...0 (401 digits)} -> loaders/msprobe._num: float(int) OverflowError.
    leaf(pair.r, MLP_OUT[2], MLP_OUT[3]).set("Max", Raw("1" + "0" * 400))
    assert_contract(_run(pair), "huge_int")


@known("huge_int")
def test_element_count_beyond_float_range_on_both_sides(pair):
    # "shape": [10**200, 10**200] on both sides -> compare/stats.stat_errors: math.sqrt(numel).
    for doc, key, name in ((pair.t, MLP_OUT[0], MLP_OUT[1]), (pair.r, MLP_OUT[2], MLP_OUT[3])):
        leaf(doc, key, name).set("shape", [10 ** 200, 10 ** 200])
    assert_contract(_run(pair), "huge_int")


@known("deep_nesting")
@pytest.mark.parametrize("depth", [990, 100000])
def test_deeply_nested_value_in_dump_json(pair, depth):
    # "output": [[[[...]]]] nested `depth` deep -> RecursionError from the JSON decoder, uncaught.
    for p in pair.r.get("data"):
        if p[0] == MLP_OUT[2]:
            p[1].set("output", Raw("[" * depth + "]" * depth))
    assert_contract(_run(pair), "deep_nesting")


@known("deep_nesting")
def test_deeply_nested_construct_json(pair):
    # construct.json {"a": [[[...]]]} -> loaders._read_construct catches only OSError/ValueError.
    (pair.rollout / "construct.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    assert_contract(_run(pair), "deep_nesting")


@known("generic_container")
@pytest.mark.parametrize("member, value", [("kwargs", [1]), ("parameters", "weight"), ("kwargs", 3)])
def test_generic_module_member_of_the_wrong_type(tmp_path, member, value):
    text = GENERIC_DOC.read_text(encoding="utf-8")
    doc = json.loads(text.split("## Generic JSON format", 1)[1].split("```json\n", 1)[1].split("```", 1)[0])
    doc["modules"][0][member] = value
    bad = tmp_path / "generic.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "out"
    proc = run_script(COMPARE, LLAMA, bad, out)
    assert_contract(proc, "generic_container")
    # A malformed generic dump is an input error naming the file.
    assert proc.returncode == 2 and "generic.json" in proc.stderr


@known("surrogates")
@pytest.mark.parametrize("how", ["escaped_lone_surrogate", "invalid_utf8_byte"])
def test_key_that_is_not_valid_unicode(tmp_path, how):
    text = LLAMA.read_text(encoding="utf-8")
    old = '"Module.model.layers.0.mlp.down_proj'
    if how == "escaped_lone_surrogate":
        blob = text.replace(old, old.replace("down", "do\\ud800wn"), 1).encode()
    else:
        blob = text.encode().replace(old.encode(), old.replace("down", "do\xffwn").encode("latin-1"), 1)
    bad = tmp_path / "dump.json"
    bad.write_bytes(blob)
    out = tmp_path / "out"
    assert_contract(run_script(COMPARE, LLAMA, bad, out), "surrogates")


@known("nonfinite_margin")
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_root_cause_with_nonfinite_output_on_one_side(pair, value):
    # The rank that hit NaN: one module output's Max is NaN on the rollout side only. The compare
    # step marks it nonfinite (exit 0); the root-cause step crashes on the margin "Infinity".
    leaf(pair.r, MLP_OUT[2], MLP_OUT[3]).set("Max", value)
    proc = _run(pair, ROOTCAUSE)
    assert_contract(proc, "nonfinite_margin")
    assert proc.returncode == 0
    report = json.loads((pair.out / "output_5_root_cause_report.json").read_text())
    assert report["verdict"] in ("root_cause_found", "inconclusive")


def test_the_known_crash_table_names_each_signature_once():
    sigs = [sig for sig, _ in fuzz_dumps.KNOWN_CRASHES.values()]
    assert len(set(sigs)) == len(sigs)
    assert fuzz_dumps.known_crash("internal error: RecursionError: maximum recursion depth exceeded") \
        == "deep_nesting"
    assert fuzz_dumps.known_crash("exit 1: internal error: ZeroDivisionError") is None
    assert emit([Raw("1e400")], None) == "[1e400]"
