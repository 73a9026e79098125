"""The reference forward's per-call judging as columns (refcalls.py) against the one-call judgement
(refjudge.judge_whole) of every call taken apart: the same judgement for each call, whatever mix of
calls the columns batch and the ones they leave to be judged alone."""
import numpy as np

from dumpcompare.callruns import call_leaves, with_row
from dumpcompare.records import Leaf
from dumpcompare.refcalls import judge_calls
from dumpcompare.refjudge import judge_whole
from dumpcompare.refpoints import judge_point
from dumpcompare.tolerances import load_tolerances

WIDTH = 6


def _stats(rows: np.ndarray) -> list[float]:
    w = rows.astype(np.float64)
    return [float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt(np.sum(w * w)))]


def _run(ref: np.ndarray, spans: list[tuple[int, int]], dtype="torch.float32") -> Leaf:
    """One leaf holding the calls of ``spans`` (rows of ``ref``), as the loader folds them."""
    rows = np.array([_stats(ref[s:e]) for s, e in spans])
    n = spans[0][1] - spans[0][0]
    first = rows[0].tolist()
    return Leaf("output.0", dtype, (n, WIDTH), *first, per_call=rows if len(spans) > 1 else None)


def _generation(prompt=4, decode=7, seed=0):
    ref = np.random.default_rng(seed).standard_normal((prompt + decode, WIDTH)).astype(np.float32)
    ends = [prompt] + list(range(prompt + 1, prompt + decode + 1))
    prefill = _run(ref, [(0, prompt)])
    run = _run(ref, [(t, t + 1) for t in range(prompt, prompt + decode)])
    return ref, ends, prefill, run


def _one_by_one(ref, ends, leaves, tolerances):
    starts = [0] + ends[:-1]
    return [judge_whole(ref[s:e] if lf.numel == (e - s) * WIDTH else ref[e - 1:e], None, [lf], 1, tolerances, False,
                        extremes=False) for lf, s, e in zip(leaves, starts, ends)]


def test_columns_judge_every_call_as_the_one_call_judgement_does():
    tol = load_tolerances()
    ref, ends, prefill, run = _generation()
    rows = run.per_call.copy()
    rows[2] = np.nan                    # a call with no statistics (NaN): cannot be judged
    rows[4, 3] *= 1.5                   # a call whose Norm is off: departs
    run = with_row(run, rows[0].tolist(), rows)
    got = judge_calls(ref, None, [prefill, run], True, ends, 1, tol, False)
    want = _one_by_one(ref, ends, [prefill] + call_leaves(run), tol)
    assert got.matches == [j["matches_reference"] for j in want]
    assert got.errors == [j["error"] for j in want]
    assert got.matches[3] == "unknown" and got.matches[5] is False
    assert (got.tolerance, got.how) == (want[-1]["tolerance"], want[-1]["how"])
    point = judge_point(ref, None, [prefill, run], 1, tol, False, ends, stitched=True)
    assert point["matches_reference"] is False and point["first_call"] == 5
    assert point["how"] == "statistics, per call" and point["error"] > point["tolerance"]


def test_a_call_alone_of_its_size_and_a_sampled_row_are_judged_as_before():
    """The prefill keeps only its last row (an engine's logits of the sampled position), and one
    decode call lacks its Norm (judged alone, on the other three, not batched): each call still gets
    judge_whole's answer."""
    tol = load_tolerances()
    ref, ends, _prefill, run = _generation(prompt=3, decode=5, seed=1)
    sampled = Leaf("output.0", "torch.float32", (1, WIDTH), *_stats(ref[2:3]))
    no_norm = Leaf("output.0", "torch.float32", (1, WIDTH), *_stats(ref[3:4])[:3], None)
    rest = _run(ref, [(t, t + 1) for t in range(4, 8)])
    runs = [sampled, no_norm, rest]
    got = judge_calls(ref, None, runs, True, ends, 1, tol, False)
    want = _one_by_one(ref, ends, [sampled, no_norm] + call_leaves(rest), tol)
    assert got.matches == [j["matches_reference"] for j in want] == [True] * 6
    assert got.errors == [j["error"] for j in want]


def test_calls_that_do_not_line_up_with_the_tokens_are_judged_whole():
    tol = load_tolerances()
    ref, ends, prefill, run = _generation()
    assert judge_calls(ref, None, [prefill, run], True, ends[:-1] + [ends[-1] + 1], 1, tol, False) is None
    assert judge_calls(ref, None, [run], True, ends, 1, tol, False) is None       # one call short


def _bf16_generation(prompt=4, decode=40, width=256, seed=3):
    """bf16 reference rows and an engine's calls of the same rows, as the loader folds them."""
    from dumpcompare.arrays import to_dtype
    rng = np.random.default_rng(seed)
    ref = to_dtype(rng.standard_normal((prompt + decode, width)).astype(np.float32), "bfloat16")
    ends = [prompt] + list(range(prompt + 1, prompt + decode + 1))

    def stats(rows):
        w = rows.astype(np.float64)
        return [float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt(np.sum(w * w)))]
    prefill = Leaf("output.0", "torch.bfloat16", (prompt, width), *stats(ref[:prompt]))
    rows = np.array([stats(ref[t:t + 1]) for t in range(prompt, prompt + decode)])
    return ref, ends, prefill, rows, width


def test_one_decode_row_is_judged_on_its_norm_and_mean_not_on_one_extreme_element():
    """A clean bf16 generation whose engine rounds one decode row's largest element 4 % away from the
    reference's (a few bf16 steps: two correct kernels 28 layers deep, README "Generations") stays
    matching: a one-row Max is a single element, drawn once per call. A call whose Norm moves by as
    much departs at that call."""
    tol = load_tolerances()
    ref, ends, prefill, rows, width = _bf16_generation()
    noisy = rows.copy()
    big = 0 if rows[17, 0] >= -rows[17, 1] else 1     # the row's largest element in magnitude
    noisy[17, big] *= 1.05              # call 18's extreme: one element, 5 % of max|x| (tolerance 3 %)
    run = Leaf("output.0", "torch.bfloat16", (1, width), *noisy[0].tolist(), per_call=noisy)
    point = judge_point(ref, None, [prefill, run], 1, tol, False, ends, stitched=True)
    assert point["matches_reference"] is True and point["first_call"] is None
    assert point["error"] < 1e-6        # Norm and Mean of every call are the reference's
    faulty = rows.copy()
    faulty[17, 3] *= 1.04               # call 18's Norm 4 % off: every element moved
    run = Leaf("output.0", "torch.bfloat16", (1, width), *faulty[0].tolist(), per_call=faulty)
    point = judge_point(ref, None, [prefill, run], 1, tol, False, ends, stitched=True)
    assert point["matches_reference"] is False and point["first_call"] == 18
    assert 0.035 < point["error"] < 0.045 and point["tolerance"] == 0.03
