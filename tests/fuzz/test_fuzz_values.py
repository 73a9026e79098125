"""Issue 5, value cases: each odd value the issue lists runs to exit 0 with a sensible output_3 status.

A tiny hf (train) / vllm (rollout) statistics pair is edited at one directly compared leaf (the
layer-0 MLP output, the token ids, the down_proj weight) and run through the compare CLI in this
process with DUMPCOMPARE_DEBUG=1, so that any exception but InputError fails the test with its
traceback. Tensor-file cases (hostile pickle, escaping data_name, symlinks out) use a tiny .pt pair.
"""
from __future__ import annotations

import os
import pickle
from types import SimpleNamespace

import pytest

from fuzz.fuzz_support import (DOWN_W, MLP_OUT, TOKENS, Obj, Raw, compare, copy_pair, direct_result,
                               entry, fuzz_dumps, leaf, outputs, read_doc, results_for, set_stats,
                               tiny_pair, write_doc)

NAN, INF = float("nan"), float("inf")
STATS = ("Max", "Min", "Mean", "Norm")


@pytest.fixture(scope="module")
def stats_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats_base") / "pair"
    tiny_pair(root)
    return root


@pytest.fixture(scope="module")
def pt_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("pt_base") / "pair"
    tiny_pair(root, task="tensor", tensor_format="pt")
    return root


def _pair(base, tmp_path):
    t, r = copy_pair(base, tmp_path / "pair")
    return SimpleNamespace(train=t, rollout=r, t=read_doc(t), r=read_doc(r), out=tmp_path / "out",
                           root=tmp_path)


@pytest.fixture
def pair(stats_base, tmp_path):
    return _pair(stats_base, tmp_path)


@pytest.fixture
def pt_pair(pt_base, tmp_path):
    return _pair(pt_base, tmp_path)


def run(p) -> dict:
    """Write both edited documents, run the compare CLI, assert exit 0, return the outputs."""
    write_doc(p.train, p.t)
    write_doc(p.rollout, p.r)
    rc, _, err = compare(p.train, p.rollout, p.out)
    assert rc == 0, err
    assert err == ""
    return outputs(p.out)


def sides(p, spec):
    """(train leaf, rollout leaf) of a (train key, leaf, rollout key, leaf) spec."""
    return leaf(p.t, spec[0], spec[1]), leaf(p.r, spec[2], spec[3])


def test_unedited_pair_matches(pair):
    d = run(pair)
    for spec in (MLP_OUT, TOKENS, DOWN_W):
        assert direct_result(d[3], spec)["status"] == "match"
    assert d[4]["comparability"]["comparable"] is True


# ---------------------------------------------------------------------------------------------
# NaN and +/-Inf


@pytest.mark.parametrize("spec", [MLP_OUT, DOWN_W], ids=["activation", "parameter"])
@pytest.mark.parametrize("field", STATS)
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("side", ["train", "rollout"])
def test_nonfinite_on_one_side_only_is_nonfinite(pair, spec, field, value, side):
    t, r = sides(pair, spec)
    (t if side == "train" else r).set(field, value)
    res = direct_result(run(pair)[3], spec)
    assert res["status"] == "nonfinite", res
    assert "one side" in res["reason"]


@pytest.mark.parametrize("fields", [("Max",), ("Mean", "Norm"), ("Max", "Min", "Mean")])
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_identical_nonfinite_stats_on_both_sides_are_not_nonfinite(pair, fields, value):
    for lf in sides(pair, MLP_OUT):
        set_stats(lf, **{f: value for f in fields})
    res = direct_result(run(pair)[3], MLP_OUT)
    # The remaining finite statistics still agree, so the tensor matches.
    assert res["status"] == "match", res


def test_all_statistics_nan_on_both_sides_is_incomparable_not_nonfinite(pair):
    for lf in sides(pair, MLP_OUT):
        set_stats(lf, **{f: NAN for f in STATS})
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] not in ("nonfinite", "match", "drift"), res
    assert res["reason"]


def test_msprobe_causal_mask_mean_minus_infinity_on_both_sides_is_fine(pair):
    for lf in sides(pair, MLP_OUT):
        lf.set("Mean", -INF)
        lf.set("Min", -INF)
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "match"


@pytest.mark.parametrize("text", ["NaN", "nan", "Infinity", "-inf"])
def test_quoted_nonfinite_statistic_counts_as_nonfinite(pair, text):
    sides(pair, MLP_OUT)[1].set("Max", text)
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "nonfinite"


# ---------------------------------------------------------------------------------------------
# null statistics and missing fields


def test_null_statistics_on_one_side_are_incomparable_with_a_reason(pair):
    set_stats(sides(pair, MLP_OUT)[1], **{f: None for f in STATS})
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] == "incomparable" and "no statistics" in res["reason"], res


@pytest.mark.parametrize("field", STATS)
def test_one_null_statistic_leaves_the_others_to_compare(pair, field):
    sides(pair, MLP_OUT)[1].set(field, None)
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "match"


@pytest.mark.parametrize("field", STATS + ("dtype", "shape", "requires_grad", "type"))
def test_missing_field_still_compares(pair, field):
    sides(pair, MLP_OUT)[1].delete(field)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] == "match", res


def test_all_statistics_missing_is_incomparable(pair):
    lf = sides(pair, MLP_OUT)[1]
    for f in STATS:
        lf.delete(f)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] == "incomparable" and res["reason"]


@pytest.mark.parametrize("field", ["output", "input_args", "parameters", "input_kwargs"])
def test_missing_entry_member_runs(pair, field):
    entry(pair.r, MLP_OUT[2]).delete(field)
    d = run(pair)
    if field == "output":
        assert not results_for(d[3], "rollout", MLP_OUT[2], "output.0")


# ---------------------------------------------------------------------------------------------
# integer, boolean, 0-d and empty tensors


def test_integer_tensor_identical_matches_and_differs_exactly(pair):
    d = run(pair)
    assert direct_result(d[3], TOKENS)["status"] == "match"
    r = sides(pair, TOKENS)[1]
    r.set("Max", r.get("Max") + 1)
    res = direct_result(run(pair)[3], TOKENS)
    assert res["status"] == "mismatch", res


def test_integer_against_float_tensor_is_a_dtype_conflict(pair):
    sides(pair, TOKENS)[1].set("dtype", "torch.float32")
    res = direct_result(run(pair)[3], TOKENS)
    assert res["status"] == "incomparable" and "dtype conflict" in res["reason"]


@pytest.mark.parametrize("rollout_max, status", [(True, "match"), (False, "mismatch")])
def test_bool_tensors(pair, rollout_max, status):
    for lf, mx in zip(sides(pair, TOKENS), (True, rollout_max)):
        set_stats(lf, dtype="torch.bool", Max=mx, Min=False, Mean=None, Norm=None)
    res = direct_result(run(pair)[3], TOKENS)
    assert res["status"] == status, res


@pytest.mark.parametrize("rollout_value, status", [(2.5, "match"), (7.0, "mismatch")])
def test_zero_dim_tensors(pair, rollout_value, status):
    for lf, v in zip(sides(pair, MLP_OUT), (2.5, rollout_value)):
        set_stats(lf, shape=[], Max=v, Min=v, Mean=v, Norm=v)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] == status, res
    assert res["train"]["stats"]["numel"] == 1


def test_empty_tensors_on_both_sides_match(pair):
    for lf in sides(pair, MLP_OUT):
        set_stats(lf, shape=[0, 16], **{f: None for f in STATS})
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] == "match" and "empty" in res["reason"], res


def test_empty_tensor_against_full_one_is_a_size_problem(pair):
    set_stats(sides(pair, MLP_OUT)[1], shape=[0, 16], **{f: None for f in STATS})
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] in ("incomparable", "structural") and res["reason"], res


@pytest.mark.parametrize("shape", ["4,16", None, {"rows": 4}])
def test_shape_that_is_not_a_list_runs(pair, shape):
    sides(pair, MLP_OUT)[1].set("shape", shape)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] in ("match", "incomparable", "structural"), res


@pytest.mark.parametrize("shape, problem", [
    ([-1, 16], "dimension '-1', not a non-negative integer"), ([1.5], "dimension '1.5'"),
    ([True], "dimension 'True'"), ([[4]], "dimension '[4]'"), ([2 ** 63], "2^63 elements or more"),
    ([10 ** 12] * 2, "2^63 elements or more"), ([1] * 65, "65 dimensions (a tensor has at most 64)")])
def test_shape_no_tensor_has_is_refused_naming_the_entry(pair, shape, problem):
    # Issue 28: a count this large reached Python's integer-digit limit in a reason string.
    sides(pair, MLP_OUT)[1].set("shape", shape)
    write_doc(pair.train, pair.t)
    write_doc(pair.rollout, pair.r)
    rc, out, err = compare(pair.train, pair.rollout, pair.out)
    assert rc == 2 and out == "" and not pair.out.exists()
    assert err.count("\n") == 1 and err.startswith(f"error: {pair.rollout}")
    assert f"entry {MLP_OUT[2]}, leaf {MLP_OUT[3]}: shape " in err and problem in err, err


# ---------------------------------------------------------------------------------------------
# huge numbers


def test_huge_identical_statistics_match(pair):
    for lf in sides(pair, MLP_OUT):
        set_stats(lf, Max=1.7976931348623157e308, Norm=1.7976931348623157e308)
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "match"


def test_huge_opposite_statistics_are_a_mismatch_not_a_crash(pair):
    t, r = sides(pair, MLP_OUT)
    t.set("Max", 1.7976931348623157e308)
    r.set("Max", -1.7976931348623157e308)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] in ("mismatch", "nonfinite"), res


def test_overflowing_float_literal_reads_as_infinity(pair):
    sides(pair, MLP_OUT)[1].set("Max", Raw("1e400"))
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "nonfinite"


@pytest.mark.parametrize("value", [2 ** 63 - 1, 10 ** 30, 5e-324, -0.0])
def test_big_int_tiny_and_negative_zero_statistics_run(pair, value):
    sides(pair, MLP_OUT)[1].set("Max", value)
    res = direct_result(run(pair)[3], MLP_OUT)
    assert res["status"] in ("match", "drift", "mismatch"), res


# ---------------------------------------------------------------------------------------------
# duplicate keys


def test_duplicate_entry_key_keeps_the_last_and_says_so(pair):
    data = pair.r.get("data")
    copy = fuzz_dumps.parse(fuzz_dumps.emit(entry(pair.r, MLP_OUT[2])))
    leaf_obj = copy.get("output")[0]
    leaf_obj.set("Max", NAN)
    data.append([MLP_OUT[2], copy])
    d = run(pair)
    assert direct_result(d[3], MLP_OUT)["status"] == "nonfinite"
    notes = d[1]["sources"]["rollout"]["notes"]
    assert any("duplicate entry key" in n and MLP_OUT[2] in n for n in notes), notes


def test_duplicate_leaf_field_last_one_wins(pair):
    r = sides(pair, MLP_OUT)[1]
    r.append(["Max", NAN])
    assert direct_result(run(pair)[3], MLP_OUT)["status"] == "nonfinite"


def test_duplicate_header_member_runs(pair):
    pair.r.insert(0, ["task", ["not", "a", "task"]])
    pair.r.append(["level", None])
    run(pair)


# ---------------------------------------------------------------------------------------------
# unicode in names


def test_unicode_module_name_is_kept_and_reported(pair):
    data = pair.r.get("data")
    odd = MLP_OUT[2].replace("down_proj", "down_pröj_名🙂")
    for p in data:
        if p[0] == MLP_OUT[2]:
            p[0] = odd
    d = run(pair)
    assert odd in [rec["key"] for rec in d[1]["rollout"]]
    csv = (pair.out / "output_1_key_mapping.csv").read_text(encoding="utf-8")
    assert odd in csv


def test_unicode_kwarg_and_dtype_names_run(pair):
    for doc in (pair.t, pair.r):
        for _, ent in doc.get("data"):
            kw = ent.get("input_kwargs")
            if isinstance(kw, Obj):
                for p in kw:
                    p[0] = p[0] + "_ü\u202e"
    sides(pair, MLP_OUT)[1].set("dtype", "torch.flöat32")
    run(pair)


# ---------------------------------------------------------------------------------------------
# tensor files


class _OpenFile:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


class _System:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch '{self.target}'",)


def _rollout_file(p, spec=MLP_OUT):
    name = leaf(p.r, spec[2], spec[3]).get("data_name")
    return p.rollout / "dump_tensor_data" / name


def _pt_run(p) -> dict:
    d = run(p)
    assert d[3]["mode"] == "tensor"
    return d


def test_tensor_pair_compares_in_tensor_mode(pt_pair):
    res = direct_result(_pt_run(pt_pair)[3], MLP_OUT)
    assert res["mode"] == "tensor" and res["status"] == "match"


@pytest.mark.parametrize("payload", [_OpenFile, _System], ids=["open", "os.system"])
def test_pickle_that_would_create_a_file_creates_nothing_and_is_reported(pt_pair, payload):
    marker = pt_pair.root / "PWNED"
    blob = pickle.dumps(payload(marker), protocol=2)
    # The payload is live: plain pickle would create the file.
    probe = pt_pair.root / "probe"
    live = pickle.loads(pickle.dumps(payload(probe), protocol=2))
    if hasattr(live, "close"):
        live.close()
    assert probe.exists()
    probe.unlink()
    _rollout_file(pt_pair).write_bytes(fuzz_dumps._pt_with_pickle(blob))
    d = _pt_run(pt_pair)
    assert not marker.exists()
    res = direct_result(d[3], MLP_OUT)
    assert res["mode"] == "statistics" and res["status"] == "match", res
    assert any("refused pickle global" in n for n in res["notes"]), res["notes"]


def _decoy(p):
    outside = p.root / "outside"
    outside.mkdir(exist_ok=True)
    import numpy as np
    from synth.ptfile import save_pt
    decoy = outside / "decoy.pt"
    save_pt(decoy, np.full((4, 16), np.nan, dtype=np.float32))
    return decoy


@pytest.mark.parametrize("how, words", [
    ("dotdot", "'..' refused"),
    ("dotdot_inner", "'..' refused"),
    ("absolute", "absolute data_name refused"),
])
def test_escaping_data_name_is_refused_and_degrades_to_statistics(pt_pair, how, words):
    decoy = _decoy(pt_pair)
    value = {"dotdot": "../../../../outside/decoy.pt",
             "dotdot_inner": "dump_tensor_data/../../../../../outside/decoy.pt",
             "absolute": str(decoy)}[how]
    leaf(pt_pair.r, MLP_OUT[2], MLP_OUT[3]).set("data_name", value)
    res = direct_result(_pt_run(pt_pair)[3], MLP_OUT)
    assert res["mode"] == "statistics" and res["status"] == "match", res
    assert any(words in n for n in res["notes"]), res["notes"]


def test_symlink_out_of_the_dump_folder_is_refused(pt_pair):
    decoy = _decoy(pt_pair)
    target = _rollout_file(pt_pair)
    target.unlink()
    target.symlink_to(decoy)
    res = direct_result(_pt_run(pt_pair)[3], MLP_OUT)
    assert res["mode"] == "statistics" and res["status"] == "match", res
    assert any("leads outside the dump folder" in n for n in res["notes"]), res["notes"]


def test_dump_data_dir_pointing_through_a_symlink_out_is_refused(pt_pair):
    decoy = _decoy(pt_pair)
    # A same-named file waits beyond the symlinked folder, which is looked in first.
    decoy.rename(decoy.with_name(_rollout_file(pt_pair).name))
    (pt_pair.rollout / "escape").symlink_to(pt_pair.root / "outside")
    pt_pair.r.set("dump_data_dir", "/elsewhere/escape")
    d = _pt_run(pt_pair)
    for res in results_for(d[3], "rollout", MLP_OUT[2], MLP_OUT[3]):
        assert res["mode"] == "statistics"
        assert any("leads outside" in n for n in res["notes"]), res["notes"]


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "directory", "empty"])
def test_unreadable_tensor_file_degrades_that_leaf_to_statistics(pt_pair, damage):
    f = _rollout_file(pt_pair)
    data = f.read_bytes()
    f.unlink()
    if damage == "garbage":
        f.write_bytes(b"PK\x03\x04" + bytes(range(256)))
    elif damage == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "directory":
        f.mkdir()
    elif damage == "empty":
        f.write_bytes(b"")
    d = _pt_run(pt_pair)
    res = direct_result(d[3], MLP_OUT)
    assert res["mode"] == "statistics" and res["status"] == "match", res
    assert any("statistics used instead" in n for n in res["notes"]), res["notes"]
    # Other leaves still compare their tensors.
    assert direct_result(d[3], DOWN_W)["mode"] == "tensor"
