"""Per-token log-probs of the dumped tokens (output_3 ``logprob``) and per-token errors."""
import json

import numpy as np

from compare.test_compare_support import SAMPLES, run_cli, synth_run  # noqa: F401
from dumpcompare.compare.logprob import LogProbs, token_ids
from dumpcompare.compare.tensors import Metrics, compact
from synth import faults as F


def _reference_logprobs(logits, ids):
    """log softmax of each row at the next token, written out directly."""
    out = []
    for i in range(len(ids) - 1):
        z = logits[i].astype(np.float64)
        out.append(z[ids[i + 1]] - np.log(np.sum(np.exp(z - z.max()))) - z.max())
    return np.array(out)


def test_logprob_difference_matches_a_direct_computation_and_finds_the_bad_position():
    rng = np.random.default_rng(0)
    t = rng.normal(0, 3, (12, 40))
    ids = rng.integers(0, 40, 12)
    r = t * (1 + 1e-7)
    r[6] += rng.normal(0, 0.5, 40)            # row 6 predicts position 7
    lp = LogProbs(ids, rtol=1e-4, atol=1e-5, prompt_tokens=5)
    lp.add(t[:5], r[:5], 0)                   # two blocks, as a streamed comparison feeds them
    lp.add(t[5:], r[5:], 5)
    res = lp.result()
    want = np.abs(_reference_logprobs(r, ids) - _reference_logprobs(t, ids))
    assert res["positions"] == 11 and res["first_position"] == 1
    assert np.isclose(res["max_abs_diff"], want.max()) and res["max_at_position"] == 7
    assert np.isclose(res["mean_abs_diff"], want.mean())
    assert res["first_position_past_clean_level"] == 7 and res["positions_past_clean_level"] == 1
    assert np.isclose(res["prompt_mean_abs_diff"], want[:4].mean())     # positions 1..4 are prompt tokens
    assert np.isclose(res["response_mean_abs_diff"], want[4:].mean())
    # the clean level bounds what element-tolerance changes can do: a worst-case change stays under it
    bound = lp.bound[0][0]
    z = t[0]
    worst = z + np.where(np.arange(40) == ids[1], -1, 1) * (1e-5 + 1e-4 * np.abs(z))
    got = abs(_reference_logprobs(np.stack([worst, worst]), ids[:2])[0] - _reference_logprobs(t[:2], ids[:2])[0])
    assert got <= bound * (1 + 1e-9)


def test_token_ids_must_agree_and_labels_fit_the_vocabulary():
    assert token_ids(np.array([[1, 2, 3]]), np.array([1, 2, 3])).tolist() == [1, 2, 3]
    assert token_ids(np.array([1, 2, 3]), np.array([1, 2, 4])) is None
    lp = LogProbs(np.array([0, 99]), 1e-4, 1e-5, None)
    lp.add(np.zeros((2, 10)), np.zeros((2, 10)), 0)
    assert lp.result() is None


def test_compact_keeps_bucket_maxima():
    vals = np.arange(1000, dtype=float)
    c = compact(vals, limit=100)
    assert c["tokens"] == 1000 and c["bucket"] == 10 and len(c["values"]) == 100
    assert c["values"][0] == 9.0 and c["values"][-1] == 999.0
    m = Metrics(1e-4, 1e-5, per_token=True)
    t = np.ones((4, 3))
    r = t.copy()
    r[2] *= 1.5
    m.add(t[:2], r[:2], 0)
    m.add(t[2:], r[2:], 2)
    assert m.result()["per_token"]["values"] == [0.0, 0.0, 0.5, 0.0]


def test_tensor_mode_writes_logprob_and_per_token_errors(synth_run):
    out = synth_run(faults=(F.CorruptWeight("rollout", "down", 1),), task="tensor")
    lp = out.d3["logprob"]
    assert lp["kind"] == "per_token_logprob" and lp["point"] == "M.logits"
    assert lp["positions_past_clean_level"] > 0 and lp["first_position_past_clean_level"] == 1
    logits = out.result("M.logits")
    assert logits["logprob"]["abs_diff"]["tokens"] == lp["positions"]
    per = {p: out.result(p)["tensor_metrics"]["per_token"]["values"] for p in ("L0.resid_out", "L1.resid_out")}
    assert max(per["L0.resid_out"]) < out.result("L0.resid_out")["tolerance"]
    assert min(per["L1.resid_out"]) > out.result("L1.resid_out")["tolerance"]
    assert "per_token" not in out.result("L1.q")["tensor_metrics"]


def test_clean_pair_stays_within_the_clean_level(synth_run):
    out = synth_run(faults=(F.KernelNoise("train"), F.KernelNoise("rollout", seed=1)), task="tensor")
    lp = out.d3["logprob"]
    assert lp["positions_past_clean_level"] == 0 and lp["first_position_past_clean_level"] is None
    assert lp["max_abs_diff"] < lp["clean_level_max"]


def test_statistics_mode_frames_the_logits_statistics(synth_run):
    out = synth_run(faults=(F.CorruptWeight("rollout", "down", 1),))
    lp = out.d3["logprob"]
    assert lp["kind"] == "logits_statistics" and lp["status"] == "mismatch"
    assert lp["margin"] == lp["error"] / lp["tolerance"] > 1


def test_real_msprobe_dumps_reproduce_torch_logprobs(tmp_path):
    """Real msprobe 26.2 tensor dumps (tools/make_msprobe_logprob.py, dumped with the config of
    make_dump_config.py): the log-probs computed from the dumped logits and token ids equal those
    torch computed from the models' own logits."""
    base = SAMPLES / "llama_L0_tensor_logprob"
    expected = json.loads((base / "expected.json").read_text())
    out = run_cli(base / "train", base / "rollout", tmp_path / "out")
    lp = out.d3["logprob"]
    assert lp["kind"] == "per_token_logprob" and lp["positions"] == expected["positions"]
    assert lp["max_at_position"] == expected["max_at_position"]
    assert np.isclose(lp["mean_abs_diff"], expected["mean_abs_diff"], rtol=1e-6)
    assert np.isclose(lp["max_abs_diff"], expected["max_abs_diff"], rtol=1e-6)
    got = out.result("M.logits")["logprob"]["abs_diff"]["values"]
    assert np.allclose(got, expected["abs_diff"], rtol=5e-3, atol=0)    # the vector keeps 3 digits
    # a 2% change of one MLP weight moves some positions past what float32 rounding allows
    past_max_level = sum(d > lp["clean_level_max"] for d in expected["abs_diff"])
    assert lp["positions_past_clean_level"] >= past_max_level >= 1
    assert lp["first_position_past_clean_level"] is not None


def test_tokens_at_a_temperature_are_the_log_softmax_of_logits_over_it():
    rng = np.random.default_rng(1)
    t, ids = rng.normal(0, 4, (6, 30)), rng.integers(0, 30, 6)
    r = t + rng.normal(0, 0.1, t.shape)
    lp = LogProbs(ids, 1e-4, 1e-5, prompt_tokens=2, temperature=0.7)
    lp.add(t, r, 0)
    res = lp.result()
    toks = res["tokens"]
    assert res["temperature"] == 0.7 and [x["position"] for x in toks] == [1, 2, 3, 4]
    assert np.allclose([x["train_at_temperature"] for x in toks], _reference_logprobs(t / 0.7, ids)[1:5])
    assert np.allclose([x["rollout_at_temperature"] for x in toks], _reference_logprobs(r / 0.7, ids)[1:5])
    assert np.allclose([x["train"] for x in toks], _reference_logprobs(t, ids)[1:5])
