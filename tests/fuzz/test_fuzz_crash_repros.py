"""Minimal reproductions of the crashes tools/fuzz_dumps.py found, run as a user would (subprocess).

Crashes that are fixed stay here as regression tests. Crashes still open are listed in the fuzzer's
KNOWN_CRASHES and marked strict xfail: when one is fixed its test passes, strict turns that into
an XPASS failure, and the marker and the KNOWN_CRASHES entry should go. ``raises=AssertionError``
with the signature check in ``assert_contract`` keeps the xfails precise: a different failure of
the same input is an error, not an expected failure.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from fuzz.fuzz_support import (COMPARE, MLP_OUT, ROOTCAUSE, SAMPLES, Raw, copy_pair, emit, fuzz_dumps,
                               leaf, outputs, read_doc, run_script, tiny_pair, write_doc)

LLAMA = SAMPLES / "llama_L0_statistics" / "step0" / "proc0" / "dump.json"
GENERIC_DOC = fuzz_dumps.GENERIC_DOC
Q_OUT = ("Module.model.layers.0.self_attn.q_proj.Linear.forward.0", "output.0")   # part of q+k+v
MAX_FLOAT = 1.7976931348623157e308


def known(tag: str):
    """Strict xfail for the open crash ``tag`` (an AssertionError from assert_contract)."""
    return pytest.mark.xfail(strict=True, raises=AssertionError,
                             reason=f"known crash {tag}: {fuzz_dumps.KNOWN_CRASHES[tag][1]}")


def assert_contract(proc, tag: str | None = None):
    """Exit 0 or 2, one stderr line for 2, no traceback; for an open crash, only its own signature."""
    broken = ("Traceback" in proc.stderr or proc.returncode not in (0, 2)
              or proc.returncode == 2 and (len(proc.stderr.strip().splitlines()) != 1
                                           or "internal error" in proc.stderr))
    if broken and tag and fuzz_dumps.KNOWN_CRASHES[tag][0] not in proc.stderr:
        raise RuntimeError(f"contract broken, but not by known crash {tag}: exit {proc.returncode}: "
                           f"{proc.stderr[-500:]}")
    assert not broken, f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro") / "pair"
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


# ---------------------------------------------------------------------------------------------
# Fixed (regression tests). None is open; an open crash gets @known("tag") and a KNOWN_CRASHES
# entry. Each of these crashed with exit 1 until bf73caf, the first two until 716441f.


def test_norm_near_float_max_in_a_composite_part(pair):
    # Train q_proj output "Norm": 1.7976931348623157e308; q+k+v is compared against the fused
    # qkv_proj, so compare/stats.combine computed sqrt(sum(norm ** 2)) -> OverflowError (34).
    leaf(pair.t, *Q_OUT).set("Norm", MAX_FLOAT)
    proc = _run(pair)
    assert_contract(proc)
    assert proc.returncode == 0


def test_element_count_beyond_float_range_in_a_composite_part(pair):
    # Train q_proj output "shape": [10**200, 10**200] (integers): combine's p.mean * p.numel
    # converted the 401-digit element count to float -> OverflowError. No tensor has that many
    # elements: the dump is refused when read, naming the entry (issue 28).
    leaf(pair.t, *Q_OUT).set("shape", [10 ** 200, 10 ** 200])
    proc = _run(pair)
    assert_contract(proc)
    assert proc.returncode == 2
    assert f"{Q_OUT[0]}, leaf {Q_OUT[1]}: shape of 2^63 elements or more" in proc.stderr


def test_integer_statistic_beyond_float_range(pair):
    # {"Max": 1000...0 (401 digits)} -> loaders/msprobe._num: float(int) OverflowError.
    leaf(pair.r, MLP_OUT[2], MLP_OUT[3]).set("Max", Raw("1" + "0" * 400))
    proc = _run(pair)
    assert_contract(proc)
    assert proc.returncode == 0


def test_element_count_beyond_float_range_on_both_sides_of_a_direct_pair(pair):
    # "shape": [10**200, 10**200] on both sides -> compare/stats.stat_errors: math.sqrt(numel).
    for doc, key, name in ((pair.t, MLP_OUT[0], MLP_OUT[1]), (pair.r, MLP_OUT[2], MLP_OUT[3])):
        leaf(doc, key, name).set("shape", [10 ** 200, 10 ** 200])
    proc = _run(pair)
    assert_contract(proc)
    assert proc.returncode == 2 and "shape of 2^63 elements or more" in proc.stderr


@pytest.mark.parametrize("depth", [990, 100000])
def test_deeply_nested_value_in_dump_json(pair, depth):
    # "output": [[[[...]]]] nested `depth` deep -> RecursionError from the JSON decoder.
    for p in pair.r.get("data"):
        if p[0] == MLP_OUT[2]:
            p[1].set("output", Raw("[" * depth + "]" * depth))
    assert_contract(_run(pair))


def test_deeply_nested_construct_json(pair):
    # construct.json {"a": [[[...]]]} -> loaders._read_construct caught only OSError/ValueError.
    (pair.rollout / "construct.json").write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    proc = _run(pair)
    assert_contract(proc)
    assert proc.returncode == 0


@pytest.mark.parametrize("member, value", [("kwargs", [1]), ("parameters", "weight"), ("kwargs", 3)])
def test_generic_module_member_of_the_wrong_type(tmp_path, member, value):
    # A generic-format module whose kwargs/parameters is not an object -> AttributeError.
    text = GENERIC_DOC.read_text(encoding="utf-8")
    doc = json.loads(text.split("## Generic JSON format", 1)[1].split("```json\n", 1)[1].split("```", 1)[0])
    doc["modules"][0][member] = value
    bad = tmp_path / "generic.json"
    bad.write_text(json.dumps(doc))
    out = tmp_path / "out"
    proc = run_script(COMPARE, LLAMA, bad, out)
    assert_contract(proc)
    # A malformed generic dump is an input error naming the file.
    assert proc.returncode == 2 and "generic.json" in proc.stderr


@pytest.mark.parametrize("how", ["escaped_lone_surrogate", "invalid_utf8_byte"])
def test_key_that_is_not_valid_unicode(tmp_path, how):
    # A key with a byte that is not UTF-8 (read with surrogateescape) or an escaped lone
    # surrogate reached the output writer -> UnicodeEncodeError.
    text = LLAMA.read_text(encoding="utf-8")
    old = '"Module.model.layers.0.mlp.down_proj'
    if how == "escaped_lone_surrogate":
        blob = text.replace(old, old.replace("down", "do\\ud800wn"), 1).encode()
    else:
        blob = text.encode().replace(old.encode(), old.replace("down", "do\xffwn").encode("latin-1"), 1)
    bad = tmp_path / "dump.json"
    bad.write_bytes(blob)
    out = tmp_path / "out"
    proc = run_script(COMPARE, LLAMA, bad, out)
    assert_contract(proc)
    if proc.returncode == 0:
        outputs(out)  # strict UTF-8 JSON


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_root_cause_with_nonfinite_output_on_one_side(pair, value):
    # The rank that hit NaN: one module output's Max is NaN on the rollout side only. The compare
    # step marks it nonfinite; the root-cause step compared the margin "Infinity" (a string) with 2.
    leaf(pair.r, MLP_OUT[2], MLP_OUT[3]).set("Max", value)
    proc = _run(pair, ROOTCAUSE)
    assert_contract(proc)
    assert proc.returncode == 0
    report = json.loads((pair.out / "output_5_root_cause_report.json").read_text())
    assert report["verdict"] in ("root_cause_found", "inconclusive")


def test_the_known_crash_table_is_consistent():
    sigs = [sig for sig, _ in fuzz_dumps.KNOWN_CRASHES.values()]
    assert len(set(sigs)) == len(sigs)
    assert fuzz_dumps.known_crash("exit 1: internal error: OverflowError: (34, 'x')") is None
    assert fuzz_dumps.known_crash("exit 1: internal error: ZeroDivisionError") is None
    assert emit([Raw("1e400")], None) == "[1e400]"
