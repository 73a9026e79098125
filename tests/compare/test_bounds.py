"""The bounds one side's statistics set on the other's when it holds one token row more
(compare/bounds.py, references/generation_bounds.md): hand-built statistics."""
import math

import numpy as np
import pytest

from dumpcompare.compare.bounds import BOUNDS, judge
from dumpcompare.compare.stats import Stats

ROW = 16          # elements of one token row
FP32 = 2.0e-4     # tolerances.yaml statistics, float32
BF16 = 3.0e-2


def stats_of(a, dtype="torch.float32") -> Stats:
    a = np.asarray(a, dtype=np.float64)
    return Stats(float(a.max()), float(a.min()), float(a.mean()), float(np.linalg.norm(a)), a.size, dtype)


def generation(seed: int, prompt: int = 5, response: int = 4):
    """(engine calls, trainer whole): a prefill over the prompt and one call per fed token; the
    trainer's rows are the same plus the last sampled token's row."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(rng.uniform(-1, 1), rng.uniform(0.2, 3), size=(prompt + response, ROW))
    calls = [rows[:prompt]] + [rows[i:i + 1] for i in range(prompt, prompt + response - 1)]
    return [stats_of(c) for c in calls], stats_of(rows)


@pytest.mark.parametrize("seed", range(20))
def test_the_same_rows_plus_one_always_hold(seed):
    pieces, whole = generation(seed)
    v = judge(pieces, whole, ROW, 1e-12)
    assert v.status == "bounded" and v.broken is None and v.piece is None
    assert v.checked == list(BOUNDS)


def test_rounding_within_the_dtype_tolerance_holds():
    pieces, whole = generation(1)
    # A bf16 engine's Max a little above the trainer's, by less than the tolerance of max |x|.
    amax = max(abs(whole.max), abs(whole.min))
    pieces[2].max = whole.max + 0.5 * BF16 * amax
    assert judge(pieces, whole, ROW, BF16).status == "bounded"
    assert judge(pieces, whole, ROW, FP32).status == "mismatch"


def test_a_call_whose_max_exceeds_the_whole_is_named():
    pieces, whole = generation(2)
    amax = max(abs(whole.max), abs(whole.min))
    pieces[3].max = whole.max + 0.5 * amax
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken, v.piece) == ("mismatch", "max", 3)
    # Scaled as the equal-token comparison scales Max: by max |x| over both sides.
    assert v.error == pytest.approx(0.5 * amax / max(amax, abs(pieces[3].max)))


def test_a_call_whose_min_is_below_the_whole_is_named():
    pieces, whole = generation(3)
    pieces[0].min = whole.min - 1.0
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken, v.piece) == ("mismatch", "min", 0)


def test_a_norm_above_the_whole_breaks_norm_squared():
    # Max/Min within the whole's, but the calls' Norm^2 exceeds the whole's: more energy in fewer rows.
    whole = Stats(2.0, -2.0, 0.0, 4.0, 5 * ROW, "torch.float32")
    pieces = [Stats(1.9, -1.9, 0.0, 3.5, 3 * ROW, "torch.float32"), Stats(1.0, -1.0, 0.0, 2.5, ROW, "torch.float32")]
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken, v.piece) == ("mismatch", "norm_upper", None)


def test_a_whole_norm_one_row_cannot_reach_breaks_the_lower_bound():
    # The one extra row holds elements within [-1, 1]: its Norm^2 is at most ROW.
    pieces = [stats_of(np.full((4, ROW), 0.5))]
    whole = Stats(1.0, -1.0, 0.5, math.sqrt(4 * ROW * 0.25 + ROW + 10.0), 5 * ROW, "torch.float32")
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken) == ("mismatch", "norm_lower")


def test_element_counts_must_add_up_to_one_row_more():
    pieces, whole = generation(4)
    whole.numel += 3
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken) == ("mismatch", "count") and v.error == math.inf


def test_a_last_row_sum_beyond_its_norm_breaks_cauchy_schwarz():
    pieces, whole = generation(5)
    rows = whole.numel
    # Raise the whole's Mean so that the last row would sum to far more than sqrt(n) * its Norm.
    last_norm = math.sqrt(whole.norm ** 2 - sum(p.norm ** 2 for p in pieces))
    whole.mean += 3 * math.sqrt(ROW) * last_norm / rows
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.broken) == ("mismatch", "last_row_sum")


def test_integer_ids_hold_exactly():
    # The engine fed 5 ids of max 9 / min 2; the trainer's 6th (the last sampled) is 3.
    pieces = [Stats(9, 2, None, None, 5, "torch.int32", True)]
    whole = Stats(9, 2, None, None, 6, "torch.int64", True)
    v = judge(pieces, whole, 1, 0.0)
    assert v.status == "bounded" and v.checked == ["count", "max", "min"]
    assert judge([Stats(10, 2, None, None, 5, "torch.int32", True)], whole, 1, 0.0).broken == "max"


def test_nan_only_in_a_call_is_a_divergence_and_in_the_whole_is_not_checked():
    pieces, whole = generation(6)
    pieces[1].max = math.nan
    v = judge(pieces, whole, ROW, FP32)
    assert (v.status, v.piece) == ("nonfinite", 1)
    pieces, whole = generation(6)
    whole.max = math.inf          # the extra row may hold it
    assert judge(pieces, whole, ROW, FP32) is None


def test_folded_per_call_arrays_are_not_checked():
    pieces, whole = generation(7)
    pieces[0].max = np.array([pieces[0].max, pieces[0].max])
    assert judge(pieces, whole, ROW, FP32) is None
