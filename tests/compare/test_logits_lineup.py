"""The engine's sampled logits rows lined up with the trainer's rows (compare/lineup.py) and the
per-token log-probs of the sampled tokens (output_3 ``results[].logprob.tokens``)."""
import numpy as np

from dumpcompare.compare.lineup import sampled_rows
from dumpcompare.compare.logprob import LogProbs, token_ids


def _logsoftmax(z):
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def test_a_prefill_of_p_tokens_and_k_decode_calls_take_the_trainer_rows_p_minus_1_to_p_minus_1_plus_k():
    # vLLM: the prefill's last position (P-1), then decode call c's row at P-1+c
    assert sampled_rows(prompt=8, first=1, decodes=2, full_rows=11) == slice(7, 10)
    assert sampled_rows(prompt=8, first=1, decodes=2, full_rows=10) == slice(7, 10)   # trainer without the last token
    assert sampled_rows(prompt=1, first=1, decodes=0, full_rows=1) == slice(0, 1)
    # prompt log-probs asked for: the prefill returns rows for every prompt position
    assert sampled_rows(prompt=8, first=8, decodes=2, full_rows=11) == slice(0, 10)


def test_rows_that_do_not_fit_the_trainer_are_not_lined_up():
    assert sampled_rows(prompt=8, first=1, decodes=5, full_rows=11) is None      # more decode calls than rows
    assert sampled_rows(prompt=2, first=3, decodes=1, full_rows=11) is None      # more prefill rows than prompt
    assert sampled_rows(prompt=8, first=0, decodes=1, full_rows=11) is None


def test_lined_up_rows_score_the_next_input_token_at_each_sampled_position():
    rng = np.random.default_rng(1)
    prompt, response, vocab = 6, 4, 50
    ids = rng.integers(0, vocab, prompt + response)
    train = rng.normal(0, 2, (prompt + response, vocab))          # one row per position
    rows = sampled_rows(prompt, 1, response - 1, train.shape[0])
    engine = train[rows] + rng.normal(0, 1e-3, (response, vocab))  # one row per sampled token
    lp = LogProbs(ids, 1e-4, 1e-5, prompt)
    lp.add(train[rows], engine, rows.start)
    toks = lp.result()["tokens"]
    assert [t["position"] for t in toks] == list(range(prompt - 1, prompt + response - 1))
    assert [t["token_id"] for t in toks] == ids[prompt:].tolist()
    want_t = _logsoftmax(train)[np.arange(prompt - 1, prompt + response - 1), ids[prompt:]]
    want_r = _logsoftmax(engine)[np.arange(response), ids[prompt:]]
    assert np.allclose([t["train"] for t in toks], want_t, rtol=0, atol=1e-12)
    assert np.allclose([t["rollout"] for t in toks], want_r, rtol=0, atol=1e-12)
    assert np.allclose([t["delta"] for t in toks], want_t - want_r, rtol=0, atol=1e-12)


def test_prompt_positions_are_left_out_of_the_per_token_records():
    ids = np.arange(5)
    lp = LogProbs(ids, 1e-4, 1e-5, prompt_tokens=3)
    lp.add(np.zeros((4, 8)), np.zeros((4, 8)), 0)               # every row: prompt and response
    assert [t["position"] for t in lp.result()["tokens"]] == [2, 3]
    unknown = LogProbs(ids, 1e-4, 1e-5, prompt_tokens=None)
    unknown.add(np.zeros((4, 8)), np.zeros((4, 8)), 0)
    assert [t["position"] for t in unknown.result()["tokens"]] == [0, 1, 2, 3]


def test_the_whole_sequence_is_the_longest_side_that_the_others_begin():
    fed, scored = np.array([5, 6, 7]), np.array([[5, 6, 7, 8]])  # the trainer also holds the last sampled token
    assert token_ids(scored, fed).tolist() == [5, 6, 7, 8]
    assert token_ids(fed, fed, np.array([5, 6, 7, 8, 9])).tolist() == [5, 6, 7, 8, 9]
    assert token_ids(fed, np.array([5, 6, 9, 8])) is None
