#!/usr/bin/env python3
"""Mutation fuzzer for the two skills' command lines (issue 5: broken and hostile dumps).

Builds a few base train/rollout dump pairs (the real msprobe samples in tests/data/msprobe and
tiny generated dumps from tests/synth, statistics and tensor mode, .npy and .pt), applies random
mutations to copies of them (truncation at every kind of point, deleted/retyped fields, NaN/Inf
and huge numbers, bad shapes, unicode and duplicate keys, swapped keys, garbage files, JSON that
is not an object, corrupt/hostile/escaping tensor files and data_names), runs
``run_compare.py`` on every case (and ``run_root_cause_analysis.py`` on every k-th) as a
subprocess, and checks the contract:

* exit code 0 or 2 (anything else, or a timeout, is a crash);
* no ``Traceback`` on stderr or stdout;
* exit 2: exactly one non-empty stderr line, and run_compare.py wrote nothing;
* nothing created, changed or deleted outside ``--out-dir`` (a snapshot of the case folder,
  which holds the inputs, the working directory, $HOME and $TMPDIR of the run);
* ``--out-dir`` holds only the documented output files (and what was there before);
* exit 0: every output present and strict JSON, ``partial`` the same in every output and true
  exactly when a side was salvaged;
* a tensor leaf redirected outside its dump folder is never read in tensor mode, and a hostile
  pickle's marker file never appears;
* a dump.json, step folder or construct.json replaced by a link out of its side's folder is never
  read (issue 28): the canary in every module name of the outside copy appears in no output,
  unless the run named that file itself; ``--model`` folders with hostile configs, headers and
  links, and modules returning thousands of tensors, keep the same contract;
* the views hold no dump text in a form their viewer would run or mis-render (issue 18): no
  control or format character on stdout, stderr or in output_4's markdown, every markdown table
  row as wide as its header, no CSV cell that starts like a formula unless it is a number.

Every case is reproducible from ``--seed`` and its index: ``--case I --keep --out DIR`` reruns
one case and keeps its folder (inputs, outputs, and a ``repro.sh``).

Prints progress on stderr, each violation as it is found, and ends with the line
``N cases, T tracebacks, X contract violations``; exits 1 when X > 0.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import math
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

sys.dont_write_bytecode = True  # importing the skills' packages must not leave __pycache__ behind

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
ROOTCAUSE = ROOT / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
SAMPLES = ROOT / "tests" / "data" / "msprobe"
GENERIC_DOC = ROOT / "dump-module-mapping-value-compare" / "references" / "input_formats.md"
for _p in (ROOT / "dump-module-mapping-value-compare" / "scripts", ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

COMPARE_OUTPUTS = ("output_1_key_mapping.json", "output_1_key_mapping.csv", "output_2_mapping.json",
                   "output_2_mapping.csv", "output_3_value_compare.json", "output_3_value_compare.csv",
                   "output_4_module_analysis.json", "output_4_module_analysis.md", "report.html")
ROOTCAUSE_OUTPUTS = COMPARE_OUTPUTS + ("output_5_root_cause_report.json",)
OUTPUT_JSON = [n for n in COMPARE_OUTPUTS if n.endswith(".json")]
MARKER = "PWNED"            # hostile pickles try to create files named PWNED*
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")   # what a spreadsheet runs (safetext.csv_cell)
INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Cs")        # what a terminal or viewer acts on (safetext.visible)
# A CSV number cell as the writer formats them (ints, %.6g floats, NaN/Infinity strings).
NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?(Infinity|inf|NaN|nan)")
STAT_FIELDS = ("Max", "Min", "Mean", "Norm")
LEAF_FIELDS = STAT_FIELDS + ("dtype", "shape", "type", "requires_grad", "data_name", "md5")

# Known, reported crashes: tag -> (text that identifies the failure in a violation, what happens).
# With --skip-known a violation whose text holds a signature counts as known instead of as a
# violation (and mutation variants that only hit it may be left out), so that a
# run guards against new crashes while these are open. Keep in sync with the strict xfail tests in
# tests/fuzz/test_fuzz_crash_repros.py; remove an entry when its crash is fixed (the strict xfail
# turns into an XPASS failure then).
KNOWN_CRASHES: dict[str, tuple[str, str]] = {}   # none open: every crash found so far is fixed


def known_crash(violation: str) -> str | None:
    """The tag of the known crash a violation text shows, or None."""
    return next((tag for tag, (sig, _) in KNOWN_CRASHES.items() if sig in violation), None)



# ==============================================================================================
# JSON with duplicate keys, NaN and raw tokens


class Obj(list):
    """A JSON object as a list of [key, value] pairs (keeps order and duplicate keys)."""

    def get(self, key, default=None):
        for k, v in self:
            if k == key:
                return v
        return default

    def keys(self):
        return [k for k, _ in self]

    def set(self, key, value):
        for pair in self:
            if pair[0] == key:
                pair[1] = value
                return
        self.append([key, value])

    def delete(self, key):
        self[:] = [p for p in self if p[0] != key]


class Raw(str):
    """Text written into the JSON verbatim (numbers json.dumps cannot produce, e.g. 1e400)."""


def parse(text: str):
    return json.loads(text, object_pairs_hook=lambda pairs: Obj([list(p) for p in pairs]))


def emit(value, indent: int | None = 1, level: int = 0, ascii_only: bool = False) -> str:
    """Serialise ``value`` (Obj/list/Raw/...) like json.dumps, allowing NaN and duplicates."""
    nl = "" if indent is None else "\n"
    pad = "" if indent is None else " " * (indent * (level + 1))
    end = "" if indent is None else " " * (indent * level)
    sep = ":" if indent is None else ": "
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Obj) or isinstance(value, dict):
        items = value if isinstance(value, Obj) else [[k, v] for k, v in value.items()]
        if not items:
            return "{}"
        body = ("," + nl).join(pad + json.dumps(str(k), ensure_ascii=ascii_only) + sep
                               + emit(v, indent, level + 1, ascii_only) for k, v in items)
        return "{" + nl + body + nl + end + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        body = ("," + nl).join(pad + emit(v, indent, level + 1, ascii_only) for v in value)
        return "[" + nl + body + nl + end + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=ascii_only)


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


# ==============================================================================================
# Scanning dump text for truncation points


TRUNC_KINDS = ("key", "string", "number", "literal", "structural", "between_entries",
               "inside_data", "before_data", "data_opened", "after_data")


def scan_points(text: str) -> dict[str, list[int]]:
    """Character offsets of ``text`` by the kind of place a cut there would hit."""
    pts: dict[str, list[int]] = {k: [] for k in TRUNC_KINDS}
    stack: list[str] = []
    expect_key = False
    data_key = data_open = data_close = None
    pending_data = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            is_key = bool(stack) and stack[-1] == "{" and expect_key
            pts["key" if is_key else "string"].extend(range(i + 1, min(j, n)))
            if is_key and len(stack) == 1 and text[i + 1:j] == "data" and data_key is None:
                data_key, pending_data = i, True
            i = j + 1
            continue
        if c in "{[":
            stack.append(c)
            expect_key = c == "{"
            if c == "{" and pending_data and len(stack) == 2:
                data_open, pending_data = i, False
                pts["data_opened"].append(i + 1)
            pts["structural"].append(i + 1)
        elif c in "}]":
            if stack:
                stack.pop()
            if c == "}" and len(stack) == 1 and data_open is not None and data_close is None:
                data_close = i
            if len(stack) == 2 and data_open is not None and data_close is None:
                pts["between_entries"].append(i + 1)  # right after an entry's closing brace
            expect_key = False
            pts["structural"].append(i + 1)
        elif c == ",":
            expect_key = bool(stack) and stack[-1] == "{"
            pts["structural"].append(i + 1)
            if len(stack) == 2 and data_open is not None and data_close is None:
                pts["between_entries"].append(i + 1)
        elif c == ":":
            expect_key = False
            pts["structural"].append(i + 1)
        elif c in "-0123456789":
            j = i + 1
            while j < n and text[j] in "0123456789.eE+-":
                j += 1
            pts["number"].extend(range(i + 1, j + 1))
            i = j
            continue
        elif c.isalpha():
            j = i + 1
            while j < n and text[j].isalpha():
                j += 1
            pts["literal"].extend(range(i + 1, j))
            i = j
            continue
        i += 1
    if data_key is not None:
        pts["before_data"] = list(range(1, data_key + 1))
    if data_open is not None:
        stop = data_close if data_close is not None else n
        pts["inside_data"] = list(range(data_open + 1, stop))
    if data_close is not None:
        pts["after_data"] = list(range(data_close + 1, n))
    return {k: v for k, v in pts.items() if v}


# ==============================================================================================
# Hostile and odd tensor files


class _OpenFile:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


class _System:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.target)}",)


class _Exec:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return exec, (f"open({self.target!r}, 'w').close()",)


def _zip(members: dict[str, bytes]) -> bytes:
    import io
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _pt_with_pickle(pkl: bytes, storage: bytes = b"\0" * 64, archive: str = "archive") -> bytes:
    return _zip({f"{archive}/data.pkl": pkl, f"{archive}/byteorder": b"little",
                 f"{archive}/version": b"3\n", f"{archive}/data/0": storage})


def hostile_pt(rng: random.Random, marker: Path) -> tuple[str, bytes]:
    """A .pt-shaped zip whose pickle would create ``marker`` if loaded with plain pickle."""
    kind = rng.choice(["open", "system", "exec", "in_dict", "nested", "proto5"])
    payload = {"open": _OpenFile, "system": _System, "exec": _Exec}.get(kind, _OpenFile)(marker)
    obj = {"in_dict": {"weight": payload}, "nested": [1, (payload,)]}.get(kind, payload)
    proto = 5 if kind == "proto5" else 2
    return f"hostile_pickle:{kind}", _pt_with_pickle(pickle.dumps(obj, protocol=proto))


def odd_pt(rng: random.Random) -> tuple[str, bytes]:
    """Torch-shaped archives with allowed globals but hostile geometry or structure."""
    from dumpcompare import tensorio as tio
    from synth import ptfile
    g, s, i, tup = ptfile._op_global, ptfile._op_str, ptfile._op_int, ptfile._op_tuple
    dt = tio._DTYPES["float32"]

    def tensor(numel, offset, size, stride, storage_cls="FloatStorage"):
        st = tup([s("storage"), g("torch", storage_cls), s("0"), s("cpu"), i(numel)]) + b"Q"
        hooks = g("collections", "OrderedDict") + b")R"
        return (b"\x80\x02" + g("torch._utils", "_rebuild_tensor_v2")
                + tup([st, i(offset), tup(map(i, size)), tup(map(i, stride)), b"\x89", hooks]) + b"R.")

    kind = rng.choice(["huge_expand", "past_storage", "negative", "numel_lie", "not_tensor",
                       "two_pickles", "compressed", "no_pickle", "empty_tensor", "zero_d",
                       "bool_storage", "int_storage", "bad_persid"])
    storage = b"\0" * 64
    if kind == "huge_expand":
        pkl = tensor(16, 0, (10 ** 6, 10 ** 6), (0, 0))
    elif kind == "past_storage":
        pkl = tensor(16, 10, (4, 4), (4, 1))
    elif kind == "negative":
        pkl = tensor(16, 0, (4, 4), (-4, 1))
    elif kind == "numel_lie":
        pkl = tensor(10 ** 12, 0, (4,), (1,))
    elif kind == "not_tensor":
        pkl = pickle.dumps({"a": [1, 2, 3]}, protocol=2)
    elif kind == "two_pickles":
        return "odd_pt:two_pickles", _zip({"a/data.pkl": tensor(16, 0, (16,), (1,)), "a/data/0": storage,
                                            "b/data.pkl": tensor(16, 0, (16,), (1,))})
    elif kind == "compressed":
        import io
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("archive/data.pkl", tensor(1 << 22, 0, (1 << 22,), (1,)))
            zf.writestr("archive/data/0", b"\0" * (1 << 24))
        return "odd_pt:compressed_bomb", buf.getvalue()
    elif kind == "no_pickle":
        return "odd_pt:no_pickle", _zip({"archive/data/0": storage})
    elif kind == "empty_tensor":
        pkl = tensor(0, 0, (0, 4), (4, 1))
        storage = b""
    elif kind == "zero_d":
        pkl = tensor(1, 0, (), ())
        storage = b"\0\0\x80\x7f"
    elif kind == "bool_storage":
        pkl = tensor(16, 0, (16,), (1,), "BoolStorage")
        storage = bytes(range(16))
    elif kind == "int_storage":
        pkl = tensor(8, 0, (8,), (1,), "LongStorage")
    else:
        pkl = b"\x80\x02" + g("torch._utils", "_rebuild_tensor_v2") + tup(
            [tup([s("storage"), s("x")]) + b"Q", i(0), tup([i(1)]), tup([i(1)])]) + b"R."
    del dt
    return f"odd_pt:{kind}", _pt_with_pickle(pkl, storage)


def garbage_bytes(rng: random.Random, n: int | None = None) -> bytes:
    n = rng.choice([0, 1, 7, 64, 1000]) if n is None else n
    return bytes(rng.getrandbits(8) for _ in range(n))


# ==============================================================================================
# Bases


@dataclass
class Side:
    root: str                   # folder under the case dir passed as --train/--rollout
    dump: str                   # dump.json relative to the case dir
    fmt: str = "msprobe"        # msprobe | generic


@dataclass
class Base:
    name: str
    sides: dict[str, Side]
    tensors: bool               # tensor files present next to the dump


TINY = dict(vocab=32, hidden=16, intermediate=32, layers=2, heads=2, kv_heads=1, head_dim=8, seq_len=4)


def build_bases(where: Path) -> dict[str, Base]:
    """Write every base pair under ``where/<name>/`` and describe them."""
    import synth
    bases: dict[str, Base] = {}

    def copy_sample(name, train_src, rollout_src, tensors):
        for side, src in (("train", train_src), ("rollout", rollout_src)):
            shutil.copytree(SAMPLES / src, where / name / side, symlinks=True)
        bases[name] = Base(name, {s: Side(s, f"{s}/step0/proc0/dump.json") for s in ("train", "rollout")},
                           tensors)

    copy_sample("llama_stats", "llama_L0_statistics", "llama_L0_statistics_perturbed", False)
    copy_sample("llama_tensor", "llama_L0_tensor", "llama_L0_tensor", True)
    cc = "consistent_check_fsdp_vs_vllm_synthetic"
    copy_sample("fsdp_vllm", f"{cc}/train", f"{cc}/rollout_bug", False)
    calls = "llama_L0_statistics_3calls"          # repeated calls: the folding loader
    copy_sample("llama_calls", f"{calls}/clean", f"{calls}/updated", False)

    cfg = synth.Config(**TINY)
    from synth import faults as F
    for name, tl, rl, task, fmt, faults in (
            ("synth_stats", "hf", "vllm", "statistics", "npy", [F.CorruptWeight("rollout", "gate", 1)]),
            ("synth_npy", "hf_fsdp", "vllm", "tensor", "npy", []),
            ("synth_pt", "hf", "sglang", "tensor", "pt", [F.NormEps("rollout", 1e-2, 0)]),
            ("synth_megatron", "megatron", "vllm", "statistics", "npy", [])):
        synth.generate_pair(where / name, cfg, tl, rl, faults=faults, task=task, tensor_format=fmt)
        bases[name] = Base(name, {s: Side(s, f"{s}/step0/rank0/dump.json") for s in ("train", "rollout")},
                           task == "tensor")

    text = GENERIC_DOC.read_text(encoding="utf-8")
    example = text.split("## Generic JSON format", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    for side in ("train", "rollout"):
        (where / "generic" / side).mkdir(parents=True)
        (where / "generic" / side / "dump.json").write_text(example, encoding="utf-8")
    bases["generic"] = Base("generic", {s: Side(s, f"{s}/dump.json", "generic") for s in ("train", "rollout")},
                            False)
    return bases


# ==============================================================================================
# A case


@dataclass
class Case:
    index: int
    base: Base
    dir: Path
    rng: random.Random
    skip_known: bool
    mutations: list[str] = field(default_factory=list)
    docs: dict = field(default_factory=dict)             # side -> parsed Obj (after doc mutations)
    raw: dict = field(default_factory=dict)              # side -> bytes, when set directly
    indent: dict = field(default_factory=dict)
    ascii_only: bool = False
    # (side, entry key, leaf name) that must not be read in tensor mode
    must_not_read: list = field(default_factory=list)
    # Two `data` members: the last wins (as in json.load), so a leaf mutated in the other copy is
    # never read and must_not_read says nothing about what was read.
    data_duplicated: bool = False
    exact_check: bool = True                             # the expectations above are reliable
    # Text that only a file outside the case's dump folders holds, reached by a link from inside
    # one: it must appear in no output (issue 28). ``canary_side`` is the side of the link, and
    # ``canary_by_name`` True when a run naming that side's dump file itself may read it (the user's choice).
    canary: str | None = None
    canary_side: str | None = None
    canary_by_name: bool = False
    extra_args: list = field(default_factory=list)       # more command-line arguments (--model ...)

    def dump_path(self, side: str) -> Path:
        return self.dir / self.base.sides[side].dump

    def side_dir(self, side: str) -> Path:
        return self.dump_path(side).parent

    def doc(self, side: str):
        if side not in self.docs:
            path = self.dump_path(side)
            self.docs[side] = parse(path.read_text(encoding="utf-8"))
        return self.docs[side]

    def fmt(self, side: str) -> str:
        return self.base.sides[side].fmt


def _entries(case: Case, side: str):
    """[(container, index)] of the side's entries: data pairs (msprobe) or modules (generic)."""
    doc = case.doc(side)
    if not isinstance(doc, Obj):
        return []
    if case.fmt(side) == "generic":
        mods = doc.get("modules")
        return [(mods, i) for i in range(len(mods))] if isinstance(mods, list) else []
    out = []
    for k, v in doc:
        if k == "data" and isinstance(v, Obj):
            out += [(v, i) for i in range(len(v))]
    return out


def _walk(value, path=()):
    """Yield (container, index_or_pair, path) for every value nested in ``value``."""
    if isinstance(value, Obj):
        for pair in value:
            yield value, pair, path + (pair[0],)
            yield from _walk(pair[1], path + (pair[0],))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield value, i, path + (i,)
            yield from _walk(v, path + (i,))


def _get(container, slot):
    return slot[1] if isinstance(container, Obj) else container[slot]


def _put(container, slot, value):
    if isinstance(container, Obj):
        slot[1] = value
    else:
        container[slot] = value


def _is_leaf(v) -> bool:
    return isinstance(v, Obj) and any(k in ("dtype", "Max", "shape", "max") for k in v.keys())


def _leaves(case: Case, side: str):
    """[(leaf Obj, entry key, leaf name)] for every tensor-like leaf of the side."""
    out = []
    doc = case.doc(side)
    for cont, idx in _entries(case, side):
        if case.fmt(side) == "generic":
            entry = cont[idx]
            ekey = entry.get("name") if isinstance(entry, Obj) else None
        else:
            ekey, entry = cont[idx]
        for c, slot, path in _walk(entry):
            v = _get(c, slot)
            if _is_leaf(v):
                out.append((v, ekey, _leaf_name(path, ekey)))
    del doc
    return out


def _leaf_name(path, entry_key) -> str:
    """The name dumpcompare gives the leaf at ``path`` inside an entry (see loaders/msprobe)."""
    if isinstance(entry_key, str) and ".parameters_grad" in entry_key:
        return f"parameters_grad.{path[0]}"
    head, *rest = path
    head = {"input": "input", "inputs": "input_args", "kwargs": "input_kwargs", "outputs": "output"}.get(
        head, head)
    return ".".join([str(head)] + [str(p) for p in rest])


# ---------------------------------------------------------------------------------------------
# Value pools


def _odd_value(rng: random.Random, skip_known: bool):
    """(tag, value) of a non-finite, huge, tiny or odd number."""
    pool = [("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf")),
            ("max_float", 1.7976931348623157e308), ("-max_float", -1.7976931348623157e308),
            ("overflow_literal", Raw("1e400")), ("-overflow_literal", Raw("-1e999")),
            ("denormal", 5e-324), ("neg_zero", -0.0), ("int64_max", 2 ** 63 - 1), ("big_int", 10 ** 30),
            ("nan_string", "NaN"), ("inf_string", "-Infinity"), ("bool", True), ("null", None),
            ("long_float", Raw("0." + "1" * 400)), ("many_digits", Raw("1" + "0" * 5000))]
    pool += [("huge_int", Raw("1" + "0" * 400)), ("huge_int", -(10 ** 309))]
    return rng.choice(pool)


def _retype_value(rng: random.Random, old):
    """(type name, value) of a JSON type different from ``old``'s."""
    choices = [("str", lambda: rng.choice(["", "x", "NaN", "1e5", "torch.float32", "ü\u202e名", "\x00"])),
               ("list", lambda: rng.choice([[], [1, 2], [None], [[]], ["a"], [{"dtype": "torch.float32"}]])),
               ("null", lambda: None),
               ("number", lambda: rng.choice([0, -1, 3, 1.5, -2.5e10, float("nan")])),
               ("bool", lambda: rng.choice([True, False])),
               ("object", lambda: rng.choice([Obj(), Obj([["a", 1]]),
                                              Obj([["dtype", "torch.float32"], ["shape", [2]], ["Max", 1.0]]),
                                              Obj([["type", "int"], ["value", 3]])]))]
    kind = {str: "str", list: "list", type(None): "null", int: "number", float: "number", bool: "bool",
            Obj: "object"}.get(type(old), "")
    name, make = rng.choice([c for c in choices if c[0] != kind])
    return name, make()


UNICODE = ["é", "名字", "🙂", "\u202e", "\u0000", "\ud800", "Ω\u0301", "\ufeff", "М", "\x7f", "\u2028"]


def _unicode_variant(rng: random.Random, text: str) -> str:
    u = rng.choice(UNICODE)
    how = rng.choice(["prefix", "suffix", "middle", "replace_char", "whole"])
    if how == "prefix":
        return u + text
    if how == "suffix":
        return text + u
    if how == "whole":
        return u * rng.randint(1, 3)
    if not text:
        return u
    p = rng.randrange(len(text))
    return text[:p] + u + text[p + (how == "replace_char"):]


# ---------------------------------------------------------------------------------------------
# Mutations. Each takes (case, side) and returns a short description.

MUTATIONS: dict[str, tuple[str, str | None, object]] = {}   # name -> (phase, needs, fn)


def mutation(phase: str, needs: str | None = None):
    def deco(fn):
        MUTATIONS[fn.__name__] = (phase, needs, fn)
        return fn
    return deco


def _pick_leaf(case, side):
    leaves = _leaves(case, side)
    return case.rng.choice(leaves) if leaves else None


@mutation("doc")
def delete_field(case, side):
    rng = case.rng
    doc = case.doc(side)
    where = rng.choice(["leaf", "leaf", "leaf", "entry", "header", "any"])
    if where == "leaf" and (picked := _pick_leaf(case, side)):
        leaf, key, name = picked
        if leaf:
            f = rng.choice(leaf.keys())
            leaf.delete(f)
            return f"delete {f} of {key}:{name}"
    if where == "entry" and (ents := _entries(case, side)):
        cont, i = rng.choice(ents)
        val = cont[i] if isinstance(cont, list) and not isinstance(cont, Obj) else cont[i][1]
        if isinstance(val, Obj) and val:
            f = rng.choice(val.keys())
            val.delete(f)
            return f"delete {f} of entry {i}"
    if where == "header" and isinstance(doc, Obj) and doc:
        f = rng.choice(doc.keys())
        doc.delete(f)
        return f"delete top-level {f}"
    objs = [(c, s) for c, s, _ in _walk(doc) if isinstance(_get(c, s), Obj) and _get(c, s)]
    if not objs:
        return "delete: nothing"
    c, s = rng.choice(objs)
    o = _get(c, s)
    f = rng.choice(o.keys())
    o.delete(f)
    return f"delete {f} of some object"


@mutation("doc")
def retype_field(case, side):
    rng = case.rng
    doc = case.doc(side)
    where = rng.choice(["leaf_field", "leaf_field", "leaf", "entry", "container", "header", "data", "any"])
    if where == "leaf_field" and (picked := _pick_leaf(case, side)):
        leaf, key, name = picked
        f = rng.choice(leaf.keys() + ["Max"])
        tname, val = _retype_value(rng, leaf.get(f))
        leaf.set(f, val)
        return f"retype {key}:{name}.{f} -> {tname}"
    if where in ("leaf", "entry", "container") and (ents := _entries(case, side)):
        cont, i = rng.choice(ents)
        generic = case.fmt(side) == "generic"
        entry = cont[i] if generic else cont[i][1]
        if where == "entry":
            tname, val = _retype_value(rng, entry)
            if generic:
                cont[i] = val
            else:
                cont[i][1] = val
            return f"retype entry {i} -> {tname}"
        if isinstance(entry, Obj) and entry:
            if where == "container":
                pair = rng.choice(entry)
                tname, val = _retype_value(rng, pair[1])
                pair[1] = val
                return f"retype entry {i}.{pair[0]} -> {tname}"
            slots = [(c, s) for c, s, _ in _walk(entry) if _is_leaf(_get(c, s))]
            if slots:
                c, s = rng.choice(slots)
                tname, val = _retype_value(rng, _get(c, s))
                _put(c, s, val)
                return f"retype a leaf of entry {i} -> {tname}"
    if where == "header" and isinstance(doc, Obj) and doc:
        pair = rng.choice(doc)
        if pair[0] != "data" or rng.random() < 0.5:
            tname, val = _retype_value(rng, pair[1])
            pair[1] = val
            return f"retype top-level {pair[0]} -> {tname}"
    if where == "data" and isinstance(doc, Obj):
        key = "modules" if case.fmt(side) == "generic" else "data"
        tname, val = _retype_value(rng, doc.get(key))
        doc.set(key, val)
        return f"retype {key} -> {tname}"
    slots = list(_walk(doc))
    if not slots:
        return "retype: nothing"
    c, s, path = rng.choice(slots)
    tname, val = _retype_value(rng, _get(c, s))
    _put(c, s, val)
    return f"retype {'.'.join(map(str, path[-3:]))} -> {tname}"


@mutation("doc")
def inject_value(case, side):
    rng = case.rng
    leaves = _leaves(case, side)
    if not leaves:
        return "inject: no leaf"
    scope = rng.choice(["one", "one", "one", "entry", "all"])
    chosen = [rng.choice(leaves)] if scope == "one" else leaves
    if scope == "entry":
        key = rng.choice(leaves)[1]
        chosen = [lf for lf in leaves if lf[1] == key]
    tag, val = _odd_value(rng, case.skip_known)
    fields = [rng.choice(STAT_FIELDS)] if rng.random() < 0.7 else list(STAT_FIELDS)
    for leaf, _, _ in chosen:
        for f in fields:
            if case.fmt(side) == "generic" and f not in leaf.keys():
                f = f.lower()
            leaf.set(f, val)
    return f"inject {tag} into {'/'.join(fields)} of {len(chosen)} leaves ({scope})"


@mutation("doc")
def bad_shape(case, side):
    rng = case.rng
    picked = _pick_leaf(case, side)
    if not picked:
        return "bad_shape: no leaf"
    leaf, key, name = picked
    shape = rng.choice([[-1, 4], [-0], [2 ** 63], [2 ** 64 + 1], [10 ** 12, 10 ** 12], [], [0], [0, 7],
                        [1.5], [True], [None], "3,4", None, [[1]], [3] * 64, Obj([["0", 1]]),
                        [float("nan")], [Raw("1e400")], [10 ** 200, 10 ** 200]])
    leaf.set("shape", shape)
    return f"shape {json.dumps(shape, default=str)[:30]} at {key}:{name}"


@mutation("doc")
def unicode_key(case, side):
    rng = case.rng
    where = rng.choice(["entry", "entry", "leaf_field", "kwarg", "header", "value"])
    if where == "entry" and (ents := _entries(case, side)):
        cont, i = rng.choice(ents)
        if case.fmt(side) == "generic":
            ent = cont[i]
            if isinstance(ent, Obj) and isinstance(ent.get("name"), str):
                ent.set("name", _unicode_variant(rng, ent.get("name")))
                case.exact_check = False
                return "unicode module name"
        else:
            old = cont[i][0]
            parts = old.split(".")
            j = rng.randrange(len(parts))
            parts[j] = _unicode_variant(rng, parts[j])
            cont[i][0] = ".".join(parts)
            case.exact_check = False
            return f"unicode in entry key part {j}"
    if where in ("leaf_field", "value") and (picked := _pick_leaf(case, side)):
        leaf, key, name = picked
        pair = rng.choice(leaf)
        if where == "leaf_field":
            pair[0] = _unicode_variant(rng, pair[0])
            return f"unicode leaf field name at {key}:{name}"
        pair[1] = _unicode_variant(rng, str(pair[1]))
        case.exact_check = False
        return f"unicode leaf value {pair[0]} at {key}:{name}"
    if where == "kwarg":
        for cont, i in _entries(case, side):
            ent = cont[i] if case.fmt(side) == "generic" else cont[i][1]
            kw = ent.get("input_kwargs") if isinstance(ent, Obj) else None
            if isinstance(kw, Obj) and kw:
                pair = rng.choice(kw)
                pair[0] = _unicode_variant(rng, pair[0])
                case.exact_check = False
                return "unicode kwarg name"
    doc = case.doc(side)
    if isinstance(doc, Obj):
        doc.append([_unicode_variant(rng, "task"),
                    _unicode_variant(rng, "value")])
    return "unicode top-level member"


@mutation("doc")
def duplicate_key(case, side):
    rng = case.rng
    doc = case.doc(side)
    where = rng.choice(["entry", "entry", "leaf_field", "data", "header"])
    ents = _entries(case, side)
    if where == "entry" and ents and case.fmt(side) == "msprobe":
        cont, i = rng.choice(ents)
        k, v = cont[i]
        copy = parse(emit(v))
        for leaf in [x for c, s, _ in _walk(copy) if _is_leaf(x := _get(c, s))]:
            if rng.random() < 0.5:
                leaf.set("Max", rng.choice([float("nan"), 123.0, None]))
        pos = rng.randint(0, len(cont))
        cont.insert(pos, [k, copy])
        case.exact_check = False
        return f"duplicate entry {k.rsplit('.', 3)[0][-40:]} at {pos}"
    if where == "leaf_field" and (picked := _pick_leaf(case, side)):
        leaf, key, name = picked
        f = rng.choice(leaf.keys())
        _, val = _retype_value(rng, leaf.get(f)) if rng.random() < 0.5 else (None, float("nan"))
        leaf.insert(rng.randint(0, len(leaf)), [f, val])
        return f"duplicate field {f} at {key}:{name}"
    if where == "data" and isinstance(doc, Obj):
        key = "modules" if case.fmt(side) == "generic" else "data"
        val = doc.get(key)
        second = parse(emit(val)) if val is not None else Obj()
        if isinstance(second, Obj) and second and rng.random() < 0.5:
            second[:] = second[: rng.randint(0, len(second))]
        doc.insert(rng.randint(0, len(doc)), [key, second])
        case.exact_check = False
        case.data_duplicated = True
        return f"duplicate top-level {key}"
    if isinstance(doc, Obj) and doc:
        k = rng.choice(doc.keys())
        if k in ("data", "modules"):
            k = "task"
        doc.append([k, rng.choice(["tensor", "statistics", None, 3, ["x"]])])
        return f"duplicate top-level {k}"
    return "duplicate: nothing"


@mutation("doc")
def swap_keys(case, side):
    rng = case.rng
    ents = _entries(case, side)
    how = rng.choice(["entry_keys", "entry_keys", "leaf_fields", "entry_values"])
    case.exact_check = False
    if how == "leaf_fields" and (picked := _pick_leaf(case, side)):
        leaf = picked[0]
        if len(leaf) >= 2:
            a, b = rng.sample(range(len(leaf)), 2)
            leaf[a][0], leaf[b][0] = leaf[b][0], leaf[a][0]
            return f"swap leaf fields {leaf[a][0]}<->{leaf[b][0]}"
    if len(ents) < 2:
        return "swap: too few entries"
    (ca, ia), (cb, ib) = rng.sample(ents, 2)
    if case.fmt(side) == "generic":
        a, b = ca[ia], cb[ib]
        if isinstance(a, Obj) and isinstance(b, Obj):
            na, nb = a.get("name"), b.get("name")
            a.set("name", nb)
            b.set("name", na)
        return "swap module names"
    if how == "entry_values":
        ca[ia][1], cb[ib][1] = cb[ib][1], ca[ia][1]
        return f"swap values of entries {ia} and {ib}"
    ca[ia][0], cb[ib][0] = cb[ib][0], ca[ia][0]
    return f"swap keys of entries {ia} and {ib}"


@mutation("doc")
def drop_or_shuffle_entries(case, side):
    rng = case.rng
    ents = _entries(case, side)
    if not ents:
        return "drop: nothing"
    cont = ents[0][0]
    how = rng.choice(["drop_some", "keep_one", "drop_all", "shuffle", "reverse"])
    case.exact_check = False
    if how == "drop_some":
        keep = [x for x in cont if rng.random() < 0.5]
        cont[:] = keep
    elif how == "keep_one":
        cont[:] = [rng.choice(cont)]
    elif how == "drop_all":
        cont[:] = []
    elif how == "shuffle":
        rng.shuffle(cont)
    else:
        cont.reverse()
    return f"entries: {how}"


@mutation("doc")
def deep_nesting(case, side):
    rng = case.rng
    depth = rng.choice([50, 500, 990, 2000, 100000])
    nested = Raw("[" * depth + "]" * depth) if rng.random() < 0.5 else Raw('{"a":' * depth + "1" + "}" * depth)
    picked = _pick_leaf(case, side)
    ents = _entries(case, side)
    if ents and case.fmt(side) == "msprobe":
        cont, i = rng.choice(ents)
        ent = cont[i][1]
        if isinstance(ent, Obj):
            ent.set(rng.choice(["output", "input_args", "parameters", "input_kwargs"]), nested)
            return f"nesting depth {depth} in an entry"
    if picked:
        picked[0].set("shape", nested)
    return f"nesting depth {depth}"


@mutation("doc")
def long_strings(case, side):
    rng = case.rng
    n = rng.choice([1000, 100000])
    ents = _entries(case, side)
    if ents and case.fmt(side) == "msprobe" and rng.random() < 0.5:
        cont, i = rng.choice(ents)
        cont[i][0] = "Module." + "a." * (n // 2) + "Linear.forward.0"
        case.exact_check = False
        return f"entry key of {n} chars"
    picked = _pick_leaf(case, side)
    if picked:
        picked[0].set(rng.choice(["dtype", "data_name", "type"]), "x" * n)
    return f"leaf string of {n} chars"


@mutation("doc", "tensor")
def data_name_escape(case, side):
    rng = case.rng
    leaves = [lf for lf in _leaves(case, side) if isinstance(lf[0].get("data_name"), str)]
    if not leaves:
        return "data_name: no tensor leaf"
    leaf, key, name = rng.choice(leaves)
    outside = case.dir / "outside" / "decoy.pt"
    choice = rng.choice(["dotdot", "dotdot_deep", "dotdot_inner", "absolute", "absolute_sys", "dir",
                         "empty", "nul", "backslash", "trailing_slash", "home", "dot", "long"])
    value = {"dotdot": "../outside/decoy.pt",
             "dotdot_deep": "../" * 8 + str(outside).lstrip("/"),
             "dotdot_inner": "dump_tensor_data/../../../../outside/decoy.pt",
             "absolute": str(outside),
             "absolute_sys": "/etc/hostname",
             "dir": "dump_tensor_data",
             "empty": "",
             "nul": "decoy\x00.pt",
             "backslash": "..\\..\\outside\\decoy.pt",
             "trailing_slash": "dump_tensor_data/",
             "home": "~/decoy.pt",
             "dot": ".",
             "long": "a" * 5000 + ".pt"}[choice]
    leaf.set("data_name", value)
    case.must_not_read.append((side, key, name))
    return f"data_name {choice} at {key}:{name}"


@mutation("doc", "tensor")
def dump_data_dir(case, side):
    rng = case.rng
    doc = case.doc(side)
    if not isinstance(doc, Obj):
        return "dump_data_dir: not an object"
    outside = case.dir / "outside"
    choice = rng.choice(["dotdot", "root", "abs_outside", "rel_outside", "empty", "nul", "list",
                         "backslash", "symlinked_name"])
    value = {"dotdot": "..", "root": "/", "abs_outside": str(outside), "rel_outside": "../../outside",
             "empty": "", "nul": "dump\x00data", "list": ["dump_tensor_data"],
             "backslash": "C:\\dumps\\..\\..", "symlinked_name": "/somewhere/else/escape"}[choice]
    doc.set("dump_data_dir", value)
    if choice == "symlinked_name":
        link = case.side_dir(side) / "escape"
        if not os.path.lexists(link):
            os.symlink(outside, link)
        # Every leaf now resolves first through the symlinked folder, where a same-named decoy
        # waits: none may be read.
        for lf, key, name in _leaves(case, side):
            dn = lf.get("data_name")
            if isinstance(dn, str) and dn and "/" not in dn and "\x00" not in dn:
                _decoy_copy(case, dn)
                case.must_not_read.append((side, key, name))
    return f"dump_data_dir {choice}"


@mutation("text")
def truncate(case, side):
    rng = case.rng
    text = case.raw[side].decode("utf-8", "surrogateescape")
    pts = scan_points(text)
    if not pts:
        case.raw[side] = b""
        return "truncate: empty"
    kind = rng.choice(sorted(pts))
    pos = rng.choice(pts[kind])
    case.raw[side] = text[:pos].encode("utf-8", "surrogateescape")
    case.exact_check = False
    return f"truncate {kind} at char {pos}"


@mutation("text")
def truncate_bytes(case, side):
    data = case.raw[side]
    pos = case.rng.randint(0, len(data))
    case.raw[side] = data[:pos]
    case.exact_check = False
    return f"truncate at byte {pos}/{len(data)}"


@mutation("text")
def damage(case, side):
    rng = case.rng
    data = bytearray(case.raw[side])
    if not data:
        return "damage: empty"
    how = rng.choice(["overwrite", "insert", "delete", "flip", "tail_garbage", "trailing"])
    pos = rng.randrange(len(data))
    junk = rng.choice([b"}", b"]", b",,", b'"', b"\x00", b"\xff\xfe", b"{", b":", b"NaNx", b"\\u12",
                       garbage_bytes(rng, rng.randint(1, 16))])
    if how == "overwrite":
        data[pos:pos + len(junk)] = junk
    elif how == "insert":
        data[pos:pos] = junk
    elif how == "delete":
        del data[pos:pos + rng.randint(1, 20)]
    elif how == "flip":
        data[pos] ^= 1 << rng.randrange(8)
    elif how == "tail_garbage":
        data[pos:] = garbage_bytes(rng, rng.randint(1, 200))
    else:
        data += junk
    case.raw[side] = bytes(data)
    case.exact_check = False
    return f"damage {how} at byte {pos}"


@mutation("text")
def replace_file(case, side):
    rng = case.rng
    original = case.raw[side]
    kinds = {
        "empty": b"",
        "whitespace": b" \n\t ",
        "garbage": garbage_bytes(rng, rng.choice([1, 100, 5000])),
        "garbage_brace": b"{" + garbage_bytes(rng, 200),
        "nul": b"\x00" * 100,
        "array": b"[]",
        "array_of_dump": b"[" + original + b"]",
        "number": b"42",
        "string": b'"data"',
        "null": b"null",
        "true": b"true",
        "nan": b"NaN",
        "empty_object": b"{}",
        "data_list": b'{"data": []}',
        "data_null": b'{"data": null}',
        "data_empty": b'{"task": "tensor", "data": {}}',
        "data_scalars": b'{"data": {"Module.a.Linear.forward.0": 1, "x": [1]}}',
        "no_known_key": b'{"data": {"not a key": {}, "neither": {"output": []}}}',
        "utf16": original.decode("utf-8", "surrogateescape").encode("utf-16", "surrogatepass"),
        "bom": b"\xef\xbb\xbf" + original,
        "gzip": __import__("gzip").compress(original),
        "latin1_key": original.replace(b'"Module.', b'"Mod\xfcle.', 1),
        "generic_marker": b'{"format": "dumpcompare-generic/1", "modules": ' + original[:200] + b"}",
    }
    kind = rng.choice(sorted(kinds))
    case.raw[side] = kinds[kind]
    case.exact_check = False
    return f"replace dump.json with {kind}"


@mutation("fs", "tensor")
def tensor_file(case, side):
    rng = case.rng
    folder = case.side_dir(side) / "dump_tensor_data"
    files = sorted(folder.glob("*")) if folder.is_dir() else []
    files = [f for f in files if f.is_file() and not f.is_symlink()]
    if not files:
        return "tensor: no file"
    target = rng.choice(files)
    data = target.read_bytes()
    how = rng.choice(["corrupt", "truncate", "garbage", "hostile", "hostile", "odd_pt", "hostile_npy",
                      "symlink_out", "symlink_abs_sys", "symlink_loop", "delete", "directory", "fifo",
                      "empty", "npy_as_pt", "folder_symlink_out", "all_deleted"])
    marker = case.dir / f"{MARKER}_{side}"
    desc = f"tensor {how} {target.name[-40:]}"
    if how == "corrupt":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            p = rng.randrange(len(buf))
            buf[p] = rng.getrandbits(8)
        target.write_bytes(bytes(buf))
    elif how == "truncate":
        target.write_bytes(data[: rng.randrange(len(data))])
    elif how == "garbage":
        prefix = rng.choice([b"", b"PK\x03\x04", b"\x93NUMPY", b"\x80\x02"])
        target.write_bytes(prefix + garbage_bytes(rng, rng.choice([0, 10, 500])))
    elif how == "hostile":
        kind, blob = hostile_pt(rng, marker)
        target.write_bytes(blob)
        desc += f" ({kind})"
    elif how == "odd_pt":
        kind, blob = odd_pt(rng)
        target.write_bytes(blob)
        desc += f" ({kind})"
    elif how == "hostile_npy":
        with open(target, "wb") as fh:
            np.save(fh, np.array([_OpenFile(marker)], dtype=object), allow_pickle=True)
    elif how == "symlink_out":
        target.unlink()
        os.symlink(case.dir / "outside" / "decoy.pt", target)
        _forbid(case, side, target.name)
    elif how == "symlink_abs_sys":
        target.unlink()
        os.symlink("/etc/hostname", target)
        _forbid(case, side, target.name)
    elif how == "symlink_loop":
        target.unlink()
        os.symlink(target.name, target)
    elif how == "delete":
        target.unlink()
    elif how == "directory":
        target.unlink()
        target.mkdir()
    elif how == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif how == "empty":
        target.write_bytes(b"")
    elif how == "npy_as_pt":
        with open(target, "wb") as fh:
            np.save(fh, rng.choice([np.zeros((0,), np.float32), np.array(3.0), np.array(["s"]),
                                    np.full((2, 2), np.nan), np.arange(4, dtype=">i8")]))
    elif how == "folder_symlink_out":
        shutil.rmtree(folder)
        os.symlink(case.dir / "outside", folder)
        for f in files:
            _decoy_copy(case, f.name)
            _forbid(case, side, f.name)
    elif how == "all_deleted":
        shutil.rmtree(folder)
    return desc


def _decoy_copy(case: Case, file_name: str) -> None:
    """Put a NaN-filled tensor named ``file_name`` in the case's outside/ folder."""
    target = case.dir / "outside" / file_name
    if not os.path.lexists(target):
        shutil.copy(case.dir / "outside" / "decoy.pt", target)


def _forbid(case: Case, side: str, file_name: str) -> None:
    try:
        leaves = _leaves(case, side)
    except ValueError:  # the dump text was damaged by another mutation
        case.exact_check = False
        return
    for leaf, key, name in leaves:
        dn = leaf.get("data_name")
        if isinstance(dn, str) and dn.rsplit("/", 1)[-1] == file_name:
            case.must_not_read.append((side, key, name))


@mutation("fs")
def side_files(case, side):
    rng = case.rng
    d = case.side_dir(side)
    how = rng.choice(["construct_garbage", "construct_list", "construct_deep", "extra_rank",
                      "extra_step", "dump_fifo", "dump_dir", "dump_symlink_loop", "side_missing",
                      "dump_symlink_inside"])
    dump = case.dump_path(side)
    case.exact_check = False
    if how.startswith("construct"):
        content = {"construct_garbage": garbage_bytes(rng, 300), "construct_list": b"[1, 2, 3]",
                   "construct_deep": b'{"Module.a.Linear.forward.0": ' + b"[" * 100000 + b"]" * 100000
                   + b"}"}[how]
        (d / "construct.json").write_bytes(content)
    elif how in ("extra_rank", "extra_step"):
        if case.base.sides[side].fmt == "generic":
            return "side: generic has no step folders"
        parent = d.parent if how == "extra_rank" else d.parent.parent
        twin = parent / ("rank7" if how == "extra_rank" else "step9")
        if how == "extra_step":
            twin = twin / d.name
        twin.mkdir(parents=True, exist_ok=True)
        shutil.copy(dump, twin / "dump.json")
    elif how == "dump_fifo":
        dump.unlink()
        os.mkfifo(dump)
    elif how == "dump_dir":
        dump.unlink()
        dump.mkdir()
    elif how == "dump_symlink_loop":
        dump.unlink()
        os.symlink("dump.json", dump)
    elif how == "dump_symlink_inside":
        os.replace(dump, d / "real_dump.data")
        os.symlink("real_dump.data", dump)
    else:
        shutil.rmtree(case.dir / case.base.sides[side].root)
    return f"side {how}"


CANARY = "canaryoutside"
MODEL = ROOT / "tests" / "data" / "real" / "_models" / "llama"


def _canary_copy(src: Path, dst: Path) -> None:
    """Copy dump ``src`` to ``dst`` (outside the dump folders) with the canary in every module name."""
    text = src.read_text(encoding="utf-8", errors="replace")
    text = re.sub(r'"Module\.', f'"Module.{CANARY}.', text).replace('"name": "', f'"name": "{CANARY}.')
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text, encoding="utf-8")


@mutation("fs")
def link_out(case, side):
    """A dump.json, its step folder or its construct.json replaced by a link out of the folder."""
    rng = case.rng
    dump = case.dump_path(side)
    if not dump.is_file() or dump.is_symlink():
        return "link_out: no dump file"
    how = rng.choice(["dump_json", "dump_json_relative", "step_folder", "construct"])
    outside = case.dir / "outside" / f"run_{side}"
    case.exact_check = False
    if how == "construct":
        target = outside / "construct.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({f"Module.{CANARY}.Linear.forward.0": None}), encoding="utf-8")
        construct = dump.parent / "construct.json"
        if os.path.lexists(construct):
            construct.unlink()
        os.symlink(target, construct)
        by_name = False
    elif how.startswith("dump_json"):
        _canary_copy(dump, outside / "dump.json")
        dump.unlink()
        os.symlink(os.path.relpath(outside / "dump.json", dump.parent) if how.endswith("relative")
                   else outside / "dump.json", dump)
        by_name = True
    else:
        step = dump.parent if dump.parent != case.dir / side else None
        if step is None:
            return "link_out: the dump has no folder of its own"
        shutil.move(str(step), str(outside / step.name))
        _canary_copy(outside / step.name / dump.name, outside / step.name / dump.name)
        os.symlink(outside / step.name, step, target_is_directory=True)
        by_name = True
    case.canary, case.canary_side, case.canary_by_name = CANARY, side, by_name
    return f"link_out {how}"


@mutation("fs")
def model_folder(case, side):
    """--model: a copy of a small Llama folder with a hostile config.json, header or link."""
    rng = case.rng
    model = case.dir / "model"
    if not model.exists():
        shutil.copytree(MODEL, model)
    how = rng.choice(["deep_config", "nan_values", "string_heads", "zero_heads", "negative_heads",
                      "many_layers", "config_list", "config_device", "config_fifo", "blob_links",
                      "deep_header", "shard_dangling", "shard_device"])
    config = model / "config.json"
    doc = json.loads((MODEL / "config.json").read_text(encoding="utf-8"))
    case.exact_check = False
    if how == "deep_config":
        config.write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    elif how in ("nan_values", "string_heads", "zero_heads", "negative_heads", "many_layers"):
        key = rng.choice(["num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                          "rms_norm_eps", "rope_theta", "num_hidden_layers", "vocab_size"])
        value = {"nan_values": float("nan"), "string_heads": "32", "zero_heads": 0, "negative_heads": -4,
                 "many_layers": 10 ** 9}[how]
        doc[key if how != "many_layers" else "num_hidden_layers"] = value
        config.write_text(json.dumps(doc))
    elif how == "config_list":
        config.write_text("[1, 2]")
    elif how in ("config_device", "shard_device"):
        target = config if how == "config_device" else model / "model.safetensors"
        target.unlink()
        os.symlink("/dev/zero", target)
    elif how == "config_fifo":
        config.unlink()
        os.mkfifo(config)
    elif how == "blob_links":
        blobs = case.dir / "blobs"
        blobs.mkdir(exist_ok=True)
        for f in list(model.iterdir()):
            shutil.move(str(f), str(blobs / f.name))
            os.symlink(os.path.relpath(blobs / f.name, model), f)
    elif how == "deep_header":
        header = ('{"a": ' + "[" * 100000 + "]" * 100000 + "}").encode()
        (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    elif how == "shard_dangling":
        (model / "model.safetensors").unlink()
        os.symlink("missing_blob", model / "model.safetensors")
    if "--model" not in case.extra_args:
        case.extra_args += ["--model", str(model)]
    return f"model {how}"


@mutation("doc")
def wide_module(case, side):
    """One entry's output becomes thousands of tensors (a module returning a long tuple)."""
    rng = case.rng
    ents = [(c, i) for c, i in _entries(case, side) if isinstance(_entry_value(case, side, c, i), Obj)]
    if not ents:
        return "wide_module: no entry"
    cont, i = rng.choice(ents)
    value = _entry_value(case, side, cont, i)
    member = "outputs" if case.fmt(side) == "generic" else "output"
    out = value.get(member)
    first = out if _is_leaf(out) else next(
        (_get(c, slot) for c, slot, _ in _walk(out) if _is_leaf(_get(c, slot))), None)
    if first is None:
        return "wide_module: entry without an output tensor"
    n = rng.choice([2000, 5000, 20000])
    value.set(member, [first] * n)
    case.exact_check = False
    return f"wide_module {n} outputs"


def _entry_value(case, side, cont, i):
    return cont[i] if case.fmt(side) == "generic" else cont[i][1]


# ==============================================================================================
# Running and checking


def snapshot(root: Path, exclude: list[Path]) -> dict:
    """{relative path: (kind, size, mtime_ns, link target)} of everything under ``root``."""
    ex = {os.path.abspath(p) for p in exclude}
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        keep = []
        for dn in dirnames:
            full = os.path.join(dirpath, dn)
            if full in ex:
                continue
            keep.append(dn)
        dirnames[:] = keep
        for name in [*dirnames, *filenames, "."]:
            full = os.path.normpath(os.path.join(dirpath, name))
            if full in ex:
                continue
            try:
                st = os.lstat(full)
            except OSError:
                continue
            kind = ("link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
                    else "fifo" if stat.S_ISFIFO(st.st_mode) else "file")
            target = os.readlink(full) if kind == "link" else None
            # A folder's mtime moves when an excluded out-dir is created in it; skip those.
            parents_of_excluded = any(os.path.dirname(e) == full for e in ex)
            mtime = None if kind == "dir" and parents_of_excluded else st.st_mtime_ns
            snap[os.path.relpath(full, root)] = (kind, st.st_size if kind == "file" else None, mtime, target)
    return snap


def diff_snapshots(before: dict, after: dict) -> list[str]:
    out = []
    for k in sorted(set(before) | set(after)):
        if k not in after:
            out.append(f"deleted {k}")
        elif k not in before:
            out.append(f"created {k}")
        elif before[k] != after[k]:
            out.append(f"changed {k}")
    return out


@dataclass
class Run:
    tool: str
    argv: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Outcome:
    index: int
    base: str
    mutations: list[str]
    runs: list[Run]
    violations: list[str]
    tracebacks: int
    known: list[str] = field(default_factory=list)     # violations of known crashes (--skip-known)


def run_tool(script: Path, argv: list[str], cwd: Path, env: dict, timeout: float) -> Run:
    cmd = [sys.executable, str(script), *argv]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return Run(script.name, argv, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
               time.monotonic() - t0)


def check_run(run: Run, case: Case, out_dir: Path, expected: tuple, before: dict, after: dict,
              pre_existing: dict, compare_rc: int | None = None) -> list[str]:
    v = []
    name = run.tool
    if run.returncode is None:
        v.append(f"{name}: hang (killed after timeout)")
    elif run.returncode not in (0, 2):
        v.append(f"{name}: exit {run.returncode}: {_last_line(run.stderr)}")
    if "Traceback" in run.stderr or "Traceback" in run.stdout:
        v.append(f"{name}: traceback: {_last_line(run.stderr)}")
    if run.returncode == 2:
        lines = [ln for ln in run.stderr.splitlines()]
        if len(lines) != 1 or not lines[0].strip():
            v.append(f"{name}: exit 2 with {len(lines)} stderr lines: {run.stderr[:300]!r}")
        if "internal error" in run.stderr:
            v.append(f"{name}: exit 2 hides an internal error: {_last_line(run.stderr)}")
        elif lines and not _names_a_file(lines[0], run.argv):
            v.append(f"{name}: exit 2 message names no file: {lines[0][:200]!r}")
    for d in diff_snapshots(before, after):
        v.append(f"{name}: wrote outside --out-dir: {d}")
    present = {p.name: p for p in out_dir.iterdir()} if out_dir.is_dir() else {}
    for n, p in present.items():
        if n in pre_existing:
            if (p.stat().st_size, p.stat().st_mtime_ns) != pre_existing[n]:
                v.append(f"{name}: changed pre-existing {n} in --out-dir")
        elif n not in expected:
            v.append(f"{name}: unexpected file in --out-dir: {n}")
    if run.returncode == 2 and name == COMPARE.name and set(present) - set(pre_existing):
        v.append(f"{name}: exit 2 but wrote {sorted(set(present) - set(pre_existing))}")
    if run.returncode == 0:
        missing = [n for n in expected if n not in present]
        if missing:
            v.append(f"{name}: exit 0 but missing outputs {missing}")
        else:
            v += check_outputs(name, out_dir, case)
            v += check_views(name, out_dir, run.stdout)
    if bad := _invisible(run.stderr):
        v.append(f"{name}: control character {bad[0]!r} on stderr")
    if case.canary and _shows_canary(case.canary, run, out_dir):
        v.append(f"{name}: read a file through a link out of the {case.canary_side} folder "
                 f"(its canary is in the output)")
    if compare_rc is not None and run.returncode is not None and compare_rc in (0, 2) \
            and run.returncode != compare_rc:
        v.append(f"{name}: exit {run.returncode} but run_compare.py exited {compare_rc}: "
                 f"{_last_line(run.stderr)}")
    return v


def _shows_canary(canary: str, run: Run, out_dir: Path) -> bool:
    if canary in run.stdout or canary in run.stderr:
        return True
    files = [p for p in out_dir.iterdir() if p.is_file()] if out_dir.is_dir() else []
    return any(canary in p.read_text(encoding="utf-8", errors="replace") for p in files)


def _names_a_file(line: str, argv: list[str]) -> bool:
    """True when an error line names an input: an argument path, or a dump/tensor file name."""
    paths = [a for a in argv if a and not a.startswith("--")]
    if any(f"{a}:" in line or ("/" in a or "." in a) and a in line for a in paths):
        return True
    return any(w in line for w in ("dump.json", "construct.json", ".pt", ".npy", ".json", ".yaml"))


def _strict_json(path: Path):
    def bad_constant(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=bad_constant)


def check_outputs(name: str, out_dir: Path, case: Case) -> list[str]:
    v = []
    try:
        docs = {n: _strict_json(out_dir / n) for n in OUTPUT_JSON}
    except (ValueError, OSError) as exc:
        return [f"{name}: output is not strict JSON: {exc}"]
    partial = {n: d.get("partial") for n, d in docs.items()}
    sources = docs["output_1_key_mapping.json"].get("sources", {})
    salvaged = any(isinstance(s, dict) and s.get("salvage") for s in sources.values())
    if len(set(map(repr, partial.values()))) != 1 or not isinstance(next(iter(partial.values())), bool):
        v.append(f"{name}: 'partial' differs between outputs: {partial}")
    elif next(iter(partial.values())) != salvaged:
        v.append(f"{name}: partial={next(iter(partial.values()))} but salvage={salvaged}")
    for side, s in sources.items():
        sal = s.get("salvage") if isinstance(s, dict) else None
        if sal:
            if not (isinstance(sal.get("entries_recovered"), int) and sal["entries_recovered"] >= 0):
                v.append(f"{name}: {side} salvage entries_recovered {sal.get('entries_recovered')!r}")
            if sal["entries_recovered"] and not isinstance(sal.get("last_complete_key"), str):
                v.append(f"{name}: {side} salvage without last_complete_key")
            if not isinstance(sal.get("byte_offset"), int) or sal["byte_offset"] < 0:
                v.append(f"{name}: {side} salvage byte_offset {sal.get('byte_offset')!r}")
    if case.must_not_read and not case.data_duplicated:
        res = docs["output_3_value_compare.json"].get("results", [])
        for side, key, leaf in case.must_not_read:
            for r in res:
                if r.get("mode") != "tensor":
                    continue
                carriers = list(zip(r[side]["keys"], r[side]["leaves"]))
                if (key, leaf) in carriers:
                    v.append(f"{name}: {side} {key}:{leaf} was read in tensor mode although its file "
                             f"lies outside the dump folder")
    if name == ROOTCAUSE.name:
        try:
            rep = _strict_json(out_dir / "output_5_root_cause_report.json")
        except (ValueError, OSError) as exc:
            return v + [f"{name}: output_5 is not strict JSON: {exc}"]
        if rep.get("partial") != salvaged:
            v.append(f"{name}: output_5 partial={rep.get('partial')} but salvage={salvaged}")
    return v


def _invisible(text: str) -> list[str]:
    return [c for c in text if c != "\n" and unicodedata.category(c) in INVISIBLE]


def _markdown_columns(row: str) -> int:
    """Columns of a markdown table row: the pipes no backslash escapes, minus the outer two."""
    pipes, i = 0, 0
    while i < len(row):
        if row[i] == "\\":
            i += 2
            continue
        pipes += row[i] == "|"
        i += 1
    return pipes - 1


def check_views(name: str, out_dir: Path, stdout: str) -> list[str]:
    """Dump text in a view in a form the viewer would run or mis-render (issue 18)."""
    v = []
    if bad := _invisible(stdout):
        v.append(f"{name}: control character {bad[0]!r} on stdout")
    for path in sorted(out_dir.glob("output_*.csv")):
        with path.open(encoding="utf-8", errors="replace", newline="") as fh:
            cells = [c for row in csv.reader(fh) for c in row]
        if formula := next((c for c in cells if c.startswith(FORMULA_START) and not NUMBER.fullmatch(c)), None):
            v.append(f"{name}: {path.name} cell starts like a formula: {formula[:60]!r}")
    md = out_dir / "output_4_module_analysis.md"
    if md.is_file():
        text = md.read_text(encoding="utf-8", errors="replace")
        if bad := _invisible(text):
            v.append(f"{name}: control character {bad[0]!r} in {md.name}")
        widths = {_markdown_columns(ln) for ln in text.splitlines() if ln.startswith("|")}
        if len(widths) > 1:
            v.append(f"{name}: {md.name} table rows of {sorted(widths)} columns")
    return v


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def choose_mutations(case: Case) -> list[tuple[str, str]]:
    rng = case.rng
    n = rng.choices([1, 2, 3], weights=[75, 20, 5])[0]
    names = [m for m, (_, needs, _) in MUTATIONS.items() if needs != "tensor" or case.base.tensors]
    weights = {"truncate": 6, "truncate_bytes": 2, "retype_field": 5, "delete_field": 4, "inject_value": 5,
               "tensor_file": 6, "data_name_escape": 3, "dump_data_dir": 2, "replace_file": 3,
               "duplicate_key": 3, "swap_keys": 3, "unicode_key": 3, "bad_shape": 3, "damage": 3}
    picked = rng.choices(names, weights=[weights.get(m, 1) for m in names], k=n)
    return [(m, rng.choice(["train", "rollout"])) for m in picked]


def prepare_case(index: int, seed: int, bases: dict[str, Base], base_dir: Path, work: Path,
                 skip_known: bool, base_name: str | None = None,
                 plan: list[tuple[str, str]] | None = None) -> Case:
    """Copy a base into ``work/caseNNNNN`` and apply the case's mutations (``plan`` forces them)."""
    rng = random.Random(f"{seed}:{index}")
    names = sorted(bases)
    base = bases[base_name or rng.choice(names)]
    cdir = work / f"case{index:05d}"
    if cdir.exists():
        shutil.rmtree(cdir)
    shutil.copytree(base_dir / base.name, cdir, symlinks=True)
    for sub in ("outside", "home", "tmp"):
        (cdir / sub).mkdir()
    (cdir / "outside" / "secret.txt").write_text("secret\n")
    from synth.ptfile import save_pt
    save_pt(cdir / "outside" / "decoy.pt", np.full((1, 4, 16), np.nan, dtype=np.float32))
    case = Case(index, base, cdir, rng, skip_known)
    plan = plan if plan is not None else choose_mutations(case)
    for phase in ("doc", "text", "fs"):
        for mname, side in plan:
            ph, _, fn = MUTATIONS[mname]
            if ph != phase:
                continue
            if phase == "text" and side not in case.raw:
                case.raw[side] = _current_bytes(case, side)
            try:
                desc = fn(case, side)
            except FileNotFoundError:
                desc = f"{mname}: file already gone"
            case.mutations.append(f"{side}: {desc}")
        if phase == "doc":
            for side in list(case.docs):
                if side not in case.raw:
                    case.raw[side] = _current_bytes(case, side)
        if phase == "text":
            for side, data in case.raw.items():
                p = case.dump_path(side)
                if p.is_file() and not p.is_symlink():
                    p.write_bytes(data)
    if len(plan) > 1:
        case.exact_check = False
    return case


def _current_bytes(case: Case, side: str) -> bytes:
    if side in case.raw:
        return case.raw[side]
    if side in case.docs:
        if side not in case.indent:
            case.indent[side] = case.rng.choice([1, 1, 1, None, 2])
        return encode(emit(case.docs[side], case.indent[side], ascii_only=case.rng.random() < 0.2))
    p = case.dump_path(side)
    return p.read_bytes() if p.is_file() else b""


def execute_case(case: Case, run_rootcause: bool, timeout: float) -> Outcome:
    rng = case.rng
    cdir = case.dir
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUMPCOMPARE_", "ROOTCAUSE_"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(cdir.parent.parent / "pycache"),
               HOME=str(cdir / "home"), TMPDIR=str(cdir / "tmp"), PYTHONHASHSEED="0", LC_ALL="C.UTF-8")
    sides = {}
    for s in ("train", "rollout"):
        spec = case.base.sides[s]
        as_file = rng.random() < 0.3
        target = spec.dump if as_file else spec.root
        sides[s] = target if rng.random() < 0.5 else str(cdir / target)
    if case.canary_by_name and sides[case.canary_side].endswith(".json"):
        case.canary = None       # the user named the linked file (or a path through the link) itself
    out_name = rng.choice(["out", "out", "out/nested/deeper", "out dir ü"])
    extra = (["--statistics-only"] if rng.random() < 0.1 else []) + case.extra_args
    pre_create = rng.random() < 0.2
    runs, violations = [], []
    tools = [(COMPARE, COMPARE_OUTPUTS, "out")]
    if run_rootcause:
        tools.append((ROOTCAUSE, ROOTCAUSE_OUTPUTS, "out_rc"))
    compare_rc = None
    for script, expected, top in tools:
        out_dir = cdir / out_name.replace("out", top, 1)
        pre = {}
        if pre_create:
            out_dir.mkdir(parents=True)
            (out_dir / "keep.txt").write_text("user file\n")
            st = (out_dir / "keep.txt").stat()
            pre = {"keep.txt": (st.st_size, st.st_mtime_ns)}
        out_arg = str(out_dir.relative_to(cdir)) if rng.random() < 0.5 else str(out_dir)
        argv = ["--train", sides["train"], "--rollout", sides["rollout"], "--out-dir", out_arg, *extra]
        if script == ROOTCAUSE or rng.random() < 0.5:
            argv.append("--quiet")
        exclude = [cdir / out_dir.relative_to(cdir).parts[0]]
        before = snapshot(cdir, exclude)
        run = run_tool(script, argv, cdir, env, timeout)
        after = snapshot(cdir, exclude)
        runs.append(run)
        violations += check_run(run, case, out_dir, expected, before, after, pre,
                                compare_rc if script == ROOTCAUSE else None)
        if script == COMPARE:
            compare_rc = run.returncode
    for marker in cdir.glob(f"{MARKER}*"):
        violations.append(f"hostile pickle ran: {marker.name} exists")
    tracebacks = sum(1 for r in runs if "Traceback" in r.stderr or "Traceback" in r.stdout)
    return Outcome(case.index, case.base.name, case.mutations, runs, violations, tracebacks)


def write_repro(case: Case, outcome: Outcome) -> None:
    lines = ["#!/bin/sh", f"# case {case.index} base {case.base.name}",
             *[f"# mutation: {m.encode('ascii', 'backslashreplace').decode()}" for m in case.mutations],
             *[f"# violation: {v.encode('ascii', 'backslashreplace').decode()}" for v in outcome.violations],
             f"cd {shlex.quote(str(case.dir))}"]
    for r in outcome.runs:
        script = COMPARE if r.tool == COMPARE.name else ROOTCAUSE
        lines.append(f"PYTHONDONTWRITEBYTECODE=1 {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
                     + " ".join(shlex.quote(a) for a in r.argv))
    (case.dir / "repro.sh").write_text("\n".join(lines) + "\n")


# ==============================================================================================
# Driver


def run_cases(indices, seed: int, work: Path, jobs: int, rootcause_every: int, timeout: float,
              skip_known: bool, keep: bool, progress=None, base_name: str | None = None) -> list[Outcome]:
    """Build the bases under ``work`` and run the given case indices; returns their outcomes."""
    base_dir = work / "bases"
    if not base_dir.exists():
        build_bases(base_dir)
    warm_bytecode(work / "pycache")
    bases = build_bases_index(base_dir)
    cases_dir = work / "cases"
    cases_dir.mkdir(exist_ok=True)
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    done = [0]

    def one(i: int) -> Outcome:
        try:
            case = prepare_case(i, seed, bases, base_dir, cases_dir, skip_known, base_name)
        except Exception as exc:  # noqa: BLE001 - a bug of the fuzzer itself is reported, not hidden
            return Outcome(i, "?", [f"fuzzer error: {type(exc).__name__}: {exc}"], [],
                           [f"fuzzer failed to prepare the case: {type(exc).__name__}: {exc}"], 0)
        outcome = execute_case(case, rootcause_every > 0 and i % rootcause_every == 0, timeout)
        if skip_known:
            outcome.known = [v for v in outcome.violations if known_crash(v)]
            outcome.violations = [v for v in outcome.violations if not known_crash(v)]
        if outcome.violations:
            write_repro(case, outcome)
        if not keep and not outcome.violations:
            shutil.rmtree(case.dir, ignore_errors=True)
        with lock:
            done[0] += 1
            if progress:
                progress(outcome, done[0])
        return outcome

    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for outcome in pool.map(one, list(indices)):
            outcomes.append(outcome)
    return outcomes


def warm_bytecode(prefix: Path) -> None:
    """Compile the skills (and numpy) once into ``prefix``, outside every case folder.

    Runs then use PYTHONDONTWRITEBYTECODE=1 with PYTHONPYCACHEPREFIX=prefix: they read this cache
    and write none, which saves recompiling every module in every run.
    """
    if prefix.is_dir():
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "import dumpcompare.cli, dumpcompare.tensorio, rootcause.cli")
    subprocess.run([sys.executable, "-c", code, str(COMPARE.parent), str(ROOTCAUSE.parent)], env=env,
                   cwd=prefix.parent, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    prefix.mkdir(exist_ok=True)


def build_bases_index(base_dir: Path) -> dict[str, Base]:
    """Describe the bases already written under ``base_dir`` (see build_bases)."""
    bases = {}
    for name in ("llama_stats", "llama_tensor", "fsdp_vllm", "llama_calls"):
        bases[name] = Base(name, {s: Side(s, f"{s}/step0/proc0/dump.json") for s in ("train", "rollout")},
                           name == "llama_tensor")
    for name in ("synth_stats", "synth_npy", "synth_pt", "synth_megatron"):
        bases[name] = Base(name, {s: Side(s, f"{s}/step0/rank0/dump.json") for s in ("train", "rollout")},
                           name in ("synth_npy", "synth_pt"))
    bases["generic"] = Base("generic", {s: Side(s, f"{s}/dump.json", "generic") for s in ("train", "rollout")},
                            False)
    return {k: v for k, v in bases.items() if (base_dir / k).is_dir()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="fuzz_dumps.py",
        description="Mutate real and generated dumps and check that run_compare.py and "
                    "run_root_cause_analysis.py keep their bad-input contract (exit 0 or 2, one-line "
                    "errors, no traceback, nothing written outside --out-dir).",
        epilog="Exit code: 0 no violation, 1 at least one violation. Reproduce a case with "
               "--seed S --case I --keep --out DIR (its folder holds repro.sh).")
    ap.add_argument("--cases", type=int, default=200, help="number of mutated cases (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed; case I of seed S is always the same")
    ap.add_argument("--start", type=int, default=0, help="first case index (default 0)")
    ap.add_argument("--case", type=int, action="append", help="run only this case index (repeatable)")
    ap.add_argument("--base", help="use only this base dump pair (e.g. llama_tensor, synth_pt, generic)")
    ap.add_argument("--out", help="work folder (kept); default: a temporary folder, deleted at the end")
    ap.add_argument("--keep", action="store_true", help="keep every case folder, not only failing ones")
    ap.add_argument("--jobs", type=int, default=2, help="cases run in parallel (default 2)")
    ap.add_argument("--rootcause-every", type=int, default=5, metavar="K",
                    help="also run run_root_cause_analysis.py on every K-th case (0: never; default 5)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a run counts as a hang")
    ap.add_argument("--skip-known", action="store_true",
                    help="leave out mutation variants of known, reported crashes: "
                         + "; ".join(f"{k}: {d}" for k, (_, d) in KNOWN_CRASHES.items()))
    ap.add_argument("--list-mutations", action="store_true", help="print the mutation kinds and exit")
    ap.add_argument("--verbose", action="store_true", help="print every case, not only violations")
    args = ap.parse_args(argv)
    if args.list_mutations:
        for name, (phase, needs, fn) in MUTATIONS.items():
            print(f"{name:24s} {phase:5s} {needs or '':7s} {(fn.__doc__ or '').strip()}")
        return 0
    if args.cases < 0 or args.jobs < 1:
        ap.error("--cases must be >= 0 and --jobs >= 1")
    indices = args.case if args.case else range(args.start, args.start + args.cases)
    temp = args.out is None
    work = Path(tempfile.mkdtemp(prefix="fuzz_dumps_")) if temp else Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    total = len(indices)
    t0 = time.monotonic()
    violations_so_far = [0]

    def progress(o: Outcome, done: int) -> None:
        violations_so_far[0] += len(o.violations)
        if o.violations or args.verbose:
            what = "; ".join(o.mutations).encode("ascii", "backslashreplace").decode()
            print(f"case {o.index} [{o.base}] {what}", file=sys.stderr)
            for r in o.runs:
                if args.verbose:
                    print(f"  {r.tool}: exit {r.returncode} {_last_line(r.stderr)[:160]!r}", file=sys.stderr)
            for v in o.violations:
                print(f"  VIOLATION {v}", file=sys.stderr)
        if done % 25 == 0 or done == total:
            print(f"[{done}/{total}] {violations_so_far[0]} violations, {time.monotonic() - t0:.0f}s",
                  file=sys.stderr)

    keep = args.keep
    try:
        outcomes = run_cases(indices, args.seed, work, args.jobs, args.rootcause_every, args.timeout,
                             args.skip_known, keep, progress, args.base)
    finally:
        if temp and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    n_viol = sum(len(o.violations) for o in outcomes)
    known = {}
    for o in outcomes:
        for v in o.known:
            known[known_crash(v)] = known.get(known_crash(v), 0) + 1
    if known:
        print("known crashes not counted (--skip-known): "
              + ", ".join(f"{k} x{c}" for k, c in sorted(known.items())))
    n_tb = sum(o.tracebacks for o in outcomes)
    bad = [o for o in outcomes if o.violations]
    if bad:
        kinds: dict[str, int] = {}
        for o in bad:
            for v in o.violations:
                k = v.split(": ", 2)[1] if v.count(": ") >= 2 else v
                kinds[k[:120]] = kinds.get(k[:120], 0) + 1
        print("violations by kind:")
        for k, c in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"  {c:5d}  {k}")
        print(f"failing cases (seed {args.seed}): {' '.join(str(o.index) for o in bad[:50])}")
        if not temp:
            print(f"case folders with repro.sh are kept under {work / 'cases'}")
    exits = {}
    for o in outcomes:
        for r in o.runs:
            exits[r.returncode] = exits.get(r.returncode, 0) + 1
    print(f"exit codes: {dict(sorted(exits.items(), key=lambda kv: str(kv[0])))}; "
          f"{time.monotonic() - t0:.0f}s", file=sys.stderr)
    print(f"{len(outcomes)} cases, {n_tb} tracebacks, {n_viol} contract violations")
    return 1 if n_viol else 0


if __name__ == "__main__":
    sys.exit(main())
