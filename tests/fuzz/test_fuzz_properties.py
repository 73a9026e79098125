"""Issue 5, property tests (hypothesis, derandomized): truncated and mutated dumps never crash.

* Any truncation of a real (or generated) dump either loads with salvage information that is exactly right
  (every complete entry before the cut recovered, ``last_complete_key`` the last of them, the
  byte offset inside the kept part) or raises InputError (only when the cut comes before the
  ``data`` object), never another exception.
* Damage (garbage after a cut, bytes overwritten) likewise loads or raises InputError.
* Any mutation of a leaf's fields goes through ``dumpcompare.cli.main`` to exit 0 or 2; with
  DUMPCOMPARE_DEBUG=1 any other exception propagates and fails the property with its traceback.

Values cover the whole float range with NaN and +/-Inf, and integers far beyond it (the crashes
the fuzzer found at the edges have regression tests in test_fuzz_crash_repros.py).
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dumpcompare.errors import InputError
from dumpcompare.loaders import load_path
from fuzz.fuzz_support import TINY, SAMPLES, Obj, compare, outputs, parse, synth, tiny_pair, write_doc

REAL = {
    "llama_statistics": SAMPLES / "llama_L0_statistics" / "step0" / "proc0" / "dump.json",
    "llama_tensor": SAMPLES / "llama_L0_tensor" / "step0" / "proc0" / "dump.json",
    "fsdp_train": SAMPLES / "consistent_check_fsdp_vs_vllm_synthetic" / "train" / "step0" / "proc0" / "dump.json",
    "vllm_rollout": SAMPLES / "consistent_check_fsdp_vs_vllm_synthetic" / "rollout" / "step0" / "proc0" / "dump.json",
}
SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Layout:
    """Byte offsets of one dump file: where each entry ends and where ``data`` starts."""

    def __init__(self, blob: bytes):
        self.blob = blob
        text = self.blob.decode("utf-8")
        assert text.isascii()  # byte offsets == character offsets below
        doc = parse(text)
        self.keys = [k for k, _ in doc.get("data")]
        # Entry ends: a '}' that brings the nesting back to the data object's level.
        depth, in_str, esc, ends = 0, False, False, []
        data_key = text.index('"data"')
        self.data_open = text.index("{", data_key)
        for i in range(self.data_open, len(text)):
            c = text[i]
            if in_str:
                esc = (c == "\\") and not esc
                if c == '"' and not esc:
                    in_str = False
                continue
            if c == '"':
                in_str = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 1 and c == "}":
                    ends.append(i + 1)
                if depth == 0:
                    self.data_close = i + 1
                    break
        assert len(ends) == len(self.keys)
        self.ends = ends
        self.data_key = data_key


def _generated() -> dict[str, bytes]:
    """Dumps from the synthetic generator (megatron train with autograd, sglang rollout)."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = synth.generate_pair(Path(tmp), synth.Config(**TINY), "megatron", "sglang", task="tensor")
        return {f"synth_{side}": (d / "dump.json").read_bytes() for side, d in zip(("megatron", "sglang"), dirs)}


LAYOUTS = {**{name: Layout(path.read_bytes()) for name, path in REAL.items()},
           **{name: Layout(blob) for name, blob in _generated().items()}}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("cuts")


def _load(scratch: Path, name: str, blob: bytes):
    folder = scratch / name
    folder.mkdir(exist_ok=True)
    path = folder / "dump.json"
    path.write_bytes(blob)
    return path, load_path(path)


@settings(max_examples=250, **SETTINGS)
@given(name=st.sampled_from(sorted(LAYOUTS)), data=st.data())
def test_any_truncation_salvages_exactly_or_refuses(scratch, name, data):
    lay = LAYOUTS[name]
    cut = data.draw(st.one_of(st.integers(0, len(lay.blob)),
                              st.sampled_from(lay.ends).flatmap(lambda e: st.integers(e - 2, e + 2)))
                    .filter(lambda c: 0 <= c <= len(lay.blob)), label="cut")
    try:
        path, dump = _load(scratch, name, lay.blob[:cut])
    except InputError as exc:
        msg = str(exc)
        assert "\n" not in msg and "dump.json" in msg
        assert cut <= lay.data_open, f"cut at {cut} inside data ({lay.data_open}) refused: {msg}"
        return
    assert cut > lay.data_key, "a cut before the data object must be refused"
    complete = [k for k, end in zip(lay.keys, lay.ends) if end <= cut]
    keys = [e.key for e in dump.entries]
    if dump.salvage is None:
        assert cut >= lay.data_close, f"cut at {cut} before the end of data but no salvage"
        assert keys == lay.keys
        return
    s = dump.salvage
    assert s.entries_recovered == len(complete) <= len(lay.keys)
    assert keys == complete
    if complete:
        assert s.last_complete_key == complete[-1] and s.last_complete_key in lay.keys
    else:
        assert s.last_complete_key is None
    assert 0 <= s.byte_offset <= cut
    assert s.reason


@settings(max_examples=150, **SETTINGS)
@given(name=st.sampled_from(sorted(LAYOUTS)), data=st.data())
def test_damage_loads_what_is_before_it_or_refuses(scratch, name, data):
    lay = LAYOUTS[name]
    pos = data.draw(st.integers(0, len(lay.blob)), label="pos")
    junk = data.draw(st.one_of(st.binary(min_size=1, max_size=12),
                               st.sampled_from([b"}", b"]", b",,", b'"', b"\x00", b"\xff", b"{{", b"NaNa",
                                                b"\\u", b"-", b"1e999999"])), label="junk")
    how = data.draw(st.sampled_from(["overwrite", "insert", "cut_then_junk"]), label="how")
    blob = bytearray(lay.blob)
    if how == "overwrite":
        blob[pos:pos + len(junk)] = junk
    elif how == "insert":
        blob[pos:pos] = junk
    else:
        blob[pos:] = junk
    try:
        _, dump = _load(scratch, name, bytes(blob))
    except InputError as exc:
        assert "\n" not in str(exc) and "dump.json" in str(exc)
        return
    keys = [e.key for e in dump.entries]
    # Every entry that ends before the damage is recovered, in order.
    intact = [k for k, end in zip(lay.keys, lay.ends) if end <= pos]
    assert keys[:len(intact)] == intact
    if dump.salvage is not None:
        s = dump.salvage
        assert len(intact) <= s.entries_recovered and len(keys) <= s.entries_recovered
        assert s.last_complete_key is None or isinstance(s.last_complete_key, str)
        assert 0 <= s.byte_offset <= len(blob)


# ---------------------------------------------------------------------------------------------
# Leaf mutations through the CLI


@pytest.fixture(scope="module")
def cli_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_base")
    stats = tiny_pair(root / "stats", layers=1)
    tensor = tiny_pair(root / "tensor", task="tensor", tensor_format="npy", layers=1)
    bases = {}
    for name, dirs in (("stats", stats), ("tensor", tensor)):
        docs = {s: (d / "dump.json").read_text(encoding="utf-8") for s, d in zip(("train", "rollout"), dirs)}
        counts = {s: len(_leaf_objs(parse(t))) for s, t in docs.items()}
        bases[name] = (dirs, docs, counts)
    return root, bases


def _leaf_objs(doc: Obj) -> list[Obj]:
    found = []

    def walk(v):
        if isinstance(v, Obj):
            if any(k in ("dtype", "Max", "shape") for k in v.keys()):
                found.append(v)
                return
            for _, sub in v:
                walk(sub)
        elif isinstance(v, list):
            for sub in v:
                walk(sub)
    walk(doc.get("data"))
    return found


FIELDS = ("Max", "Min", "Mean", "Norm", "dtype", "shape", "type", "requires_grad", "data_name", "md5",
          "value", "extra_ü")
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 5e-324]))
_ints = st.one_of(st.integers(-(2 ** 63), 2 ** 63), st.sampled_from([10 ** 30, 10 ** 400, -(10 ** 309)]))
VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), _ints, _floats,
              st.text(max_size=6), st.sampled_from(["NaN", "-Infinity", "torch.bool", "torch.int64",
                                                    "../x.npy", "/etc/hostname", "torch.bfloat16"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)
SHAPES = st.lists(st.one_of(st.integers(-2, 2 ** 40), st.just(10 ** 200)), max_size=4)

OP = st.one_of(
    st.tuples(st.just("delete"), st.sampled_from(FIELDS), st.none()),
    st.tuples(st.just("set"), st.sampled_from(FIELDS), VALUES),
    st.tuples(st.just("set"), st.just("shape"), SHAPES),
    st.tuples(st.just("dup"), st.sampled_from(FIELDS), VALUES),
    st.tuples(st.just("replace_leaf"), st.none(), VALUES),
)


def _to_json(v):
    if isinstance(v, dict):
        return Obj([[str(k), _to_json(x)] for k, x in v.items()])
    if isinstance(v, list):
        return [_to_json(x) for x in v]
    return v


@pytest.mark.slow
@settings(max_examples=60, **SETTINGS)
@given(base=st.sampled_from(["stats", "tensor"]), side=st.sampled_from(["train", "rollout"]),
       index=st.integers(0, 10 ** 6), ops=st.lists(OP, min_size=1, max_size=4),
       both=st.booleans())
def test_any_leaf_mutation_exits_0_or_2_through_the_cli(cli_base, base, side, index, ops, both):
    root, bases = cli_base
    dirs, docs, counts = bases[base]
    work = root / "work"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(dirs[0].parents[2], work)
    targets = ("train", "rollout") if both else (side,)
    sides = {}
    for s in ("train", "rollout"):
        doc = parse(docs[s])
        if s in targets:
            leaves = _leaf_objs(doc)
            lf = leaves[index % len(leaves)]
            for kind, field, value in ops:
                value = _to_json(value)
                if kind == "delete":
                    lf.delete(field)
                elif kind == "set":
                    lf.set(field, value)
                elif kind == "dup":
                    lf.append([field, value])
                else:
                    lf[:] = [["replaced", value]] if not isinstance(value, Obj) else value
        d = work / s / "step0" / "rank0"
        write_doc(d, doc)
        sides[s] = d
    rc, _, err = compare(sides["train"], sides["rollout"], work / "out")
    assert rc in (0, 2), err
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert not (work / "out").exists()
    else:
        docs_out = outputs(work / "out")
        assert len({json.dumps(d["partial"]) for d in docs_out.values()}) == 1
        for r in docs_out[3]["results"]:
            assert r["status"] in ("match", "drift", "mismatch", "nonfinite", "incomparable", "structural")
            assert r["error"] is None or isinstance(r["error"], (int, float)) or r["error"] in (
                "NaN", "Infinity", "-Infinity")


@settings(max_examples=60, **SETTINGS)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers()))
def test_any_single_statistic_value_reads_as_a_float_or_none(value):
    from dumpcompare.loaders.msprobe import leaf_from_item
    lf = leaf_from_item("output.0", {"dtype": "torch.float32", "shape": [2], "Max": value})
    assert lf.max is None or isinstance(lf.max, float)
    if isinstance(value, float) and not math.isnan(value):
        assert lf.max == value
