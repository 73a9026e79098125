"""Unit tests of the comparison math: exact statistics combination, scaled errors, tolerances, layouts."""
import math

import numpy as np
import pytest

from dumpcompare.tolerances import grade as _grade, load_tolerances, pair_tolerances
from dumpcompare.compare import tensors as T
from dumpcompare.compare.stats import Stats, combine, nonfinite_one_side, stat_errors


def stats_of(a: np.ndarray, dtype="torch.float32") -> Stats:
    a = np.asarray(a, dtype=np.float64)
    return Stats(float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a)), a.size, dtype)


@pytest.mark.parametrize("seed", range(5))
def test_combine_equals_statistics_of_the_concatenation(seed):
    rng = np.random.default_rng(seed)
    parts = [rng.normal(rng.uniform(-2, 2), rng.uniform(0.1, 3), size=(rng.integers(1, 9), 16))
             for _ in range(rng.integers(2, 5))]
    whole = np.concatenate(parts, axis=0)
    got, want = combine([stats_of(p) for p in parts]), stats_of(whole)
    for attr in ("max", "min", "mean", "norm"):
        assert getattr(got, attr) == pytest.approx(getattr(want, attr), rel=1e-12, abs=1e-12)
    assert got.numel == whole.size and got.dtype == "torch.float32"


def test_combine_is_order_free_so_a_permuted_fused_tensor_looks_the_same():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((n, 8)) for n in (8, 4, 4))
    fused = stats_of(np.concatenate([q, k, v]))
    permuted = stats_of(np.concatenate([k, q, v]))
    assert combine([stats_of(q), stats_of(k), stats_of(v)]).norm == pytest.approx(fused.norm)
    assert stat_errors(fused, permuted)["scaled_error"] == pytest.approx(0, abs=1e-12)


def test_combine_single_part_and_missing_statistic():
    a = stats_of(np.arange(6.0))
    assert combine([a]) is a
    b = Stats(1.0, 0.0, None, None, 4, "torch.int64", True)   # integer tensors have null Mean/Norm
    c = combine([a, b])
    assert c.mean is None and c.norm is None and c.max == 5.0 and c.dtype is None


def test_scaled_error_is_relative_to_magnitude_not_to_a_mean_near_zero():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(4096)
    x -= x.mean()                               # mean exactly ~0, RMS ~1
    y = x + 1e-4 * rng.standard_normal(4096)
    e = stat_errors(stats_of(x), stats_of(y))
    assert e["mean_rel"] > 1.0                  # the raw relative error of the mean is meaningless
    assert e["scaled_error"] < 2e-4             # the scaled error is not


def test_scaled_error_formula():
    t = Stats(max=2.0, min=-4.0, mean=0.5, norm=8.0, numel=16, dtype="torch.float32")
    r = Stats(max=2.2, min=-4.0, mean=0.3, norm=8.4, numel=16, dtype="torch.float32")
    e = stat_errors(t, r)
    rms = 8.4 / math.sqrt(16)
    expected = max(0.4 / 8.4, 0.2 / rms, 0.2 / 4.0, 0.0)
    assert e["scaled_error"] == pytest.approx(expected)
    assert e["norm_diff"] == pytest.approx(0.4) and e["max_rel"] == pytest.approx(0.1)


def test_integer_statistics_must_match_exactly():
    t = Stats(10.0, 0.0, None, None, 8, "torch.int64", True)
    assert stat_errors(t, Stats(10.0, 0.0, None, None, 8, "torch.int64", True))["scaled_error"] == 0
    assert stat_errors(t, Stats(11.0, 0.0, None, None, 8, "torch.int64", True))["scaled_error"] == math.inf


def test_nonfinite_on_one_side_only():
    a = Stats(1.0, -1.0, 0.0, 2.0, 4, "torch.float32")
    b = Stats(math.inf, -1.0, math.nan, math.inf, 4, "torch.float32")
    assert nonfinite_one_side(a, b) and nonfinite_one_side(b, a)
    assert not nonfinite_one_side(b, b)
    assert stat_errors(a, b)["max_diff"] is None


def test_pair_tolerance_is_the_looser_dtype_and_drift_lies_between():
    tol = load_tolerances()
    table = tol["statistics"]
    assert pair_tolerances(table, "torch.float32", "torch.bfloat16") == (table["bfloat16"], table["float32"])
    assert pair_tolerances(table, "torch.float32", "torch.float32") == (table["float32"],) * 2
    assert pair_tolerances(table, None, "torch.float32")[0] == table["default"]
    loose, strict = pair_tolerances(table, "torch.float32", "torch.bfloat16")
    assert _grade(strict / 2, loose, strict) == "match"
    assert _grade((strict + loose) / 2, loose, strict) == "drift"
    assert _grade(loose * 2, loose, strict) == "mismatch"
    assert _grade(math.inf, loose, strict) == "mismatch"


def test_documented_tolerance_numbers():
    tol = load_tolerances()
    assert tol["statistics"] == {"float64": 1e-6, "float32": 2e-4, "float16": 4e-3, "bfloat16": 3e-2,
                                 "default": 5e-2}
    assert tol["tensor"]["rel_l2"] == {"float64": 1e-7, "float32": 1e-4, "float16": 2e-3,
                                       "bfloat16": 1.5e-2, "default": 5e-2}
    assert tol["tensor"]["elementwise"]["bfloat16"] == {"rtol": 1.6e-2, "atol": 1e-3}


def test_user_tolerances_merge_over_the_builtin(tmp_path):
    f = tmp_path / "tol.yaml"
    f.write_text("statistics: {float32: 0.5}\ntensor: {rel_l2: {bfloat16: 0.1}}\n")
    tol = load_tolerances(str(f))
    assert tol["statistics"]["float32"] == 0.5 and tol["statistics"]["bfloat16"] == 3e-2
    assert tol["tensor"]["rel_l2"]["bfloat16"] == 0.1 and tol["tensor"]["rel_l2"]["float32"] == 1e-4


def test_engine_layouts_align_to_tokens_by_features():
    rng = np.random.default_rng(3)
    tokens = rng.standard_normal((2 * 5, 16))           # batch 2, seq 5, in (batch, seq) order
    hf = tokens.reshape(2, 5, 16)                        # [batch, seq, hidden]
    megatron = hf.swapaxes(0, 1).copy()                  # [seq, batch, hidden]
    for arr, fam in ((hf, "hf"), (megatron, "megatron"), (tokens, "vllm")):
        assert np.array_equal(T.as_tokens(arr, fam), tokens)
    t, r, note = T.align(hf, tokens, "hf", "vllm", "features")
    assert np.array_equal(t, r) and note == "layout aligned to [tokens, features]"
    t, r, note = T.align(megatron, hf, "megatron", "hf", "features")
    assert np.array_equal(t, r)


def test_align_flattens_equal_sizes_and_refuses_conflicts():
    a = np.arange(12.0).reshape(3, 4)
    t, r, note = T.align(a, a.reshape(4, 3), "vllm", "vllm", "rows")
    assert t.shape == r.shape == (12,) and note.startswith("flattened")
    with pytest.raises(ValueError, match="shape conflict"):
        T.align(a, np.zeros((5, 4)), "vllm", "vllm", "rows")


def test_tensor_metrics_and_multiset():
    rng = np.random.default_rng(5)
    t = rng.standard_normal((4, 8))
    acc = T.Metrics(1e-4, 1e-5)
    acc.add(t, t.copy())
    same = acc.result()
    assert same["cosine"] == pytest.approx(1) and same["rel_l2"] == 0 and same["frac_within_tol"] == 1
    assert same["first_token_past_tol"] is None
    shuffled = t[::-1].copy()
    assert T.same_multiset(t, shuffled, 1e-6, 0) and not T.same_multiset(t, shuffled + 1, 1e-6, 0)
    moments = T.Moments()
    for block in (t[:1], t[1:]):
        moments.add(block)
    assert moments.result() == pytest.approx((t.max(), t.min(), t.mean(), np.linalg.norm(t)))


def test_partial_elementwise_override_keeps_the_other_builtin_value(tmp_path):
    f = tmp_path / "tol.yaml"
    f.write_text("tensor: {elementwise: {float32: {rtol: 1.0e-3}}}\n")
    tol = load_tolerances(str(f))
    assert tol["tensor"]["elementwise"]["float32"] == {"rtol": 1e-3, "atol": 1e-5}
