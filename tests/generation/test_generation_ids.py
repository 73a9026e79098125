"""Each side gets its own token ids from the one list a user holds: the engine, which never feeds
back the last sampled token, the prefix its calls ran, split call by call."""
from dumpcompare.records import Leaf
from dumpcompare.token_ids import _check_given

PROMPT, RESPONSE = [5, 9, 2, 7], [3, 8, 1]


def _ids_leaf(ids):
    return Leaf("input_args.0", "torch.int64", (len(ids),), float(max(ids)), float(min(ids)))


def test_engine_calls_take_the_prefix_call_by_call():
    full = PROMPT + RESPONSE
    calls = [_ids_leaf(PROMPT), _ids_leaf([3]), _ids_leaf([8])]      # prefill, then two decode calls
    toks = _check_given(full, calls)
    assert toks.unique and toks.ids == full[:-1]
    assert [c["tokens"] for c in toks.calls] == [4, 1, 1]
    assert "1 left out" in toks.detail and "never feeds back" in toks.detail


def test_trainer_takes_every_id():
    full = PROMPT + RESPONSE
    toks = _check_given(full, [_ids_leaf(full)])
    assert toks.unique and toks.ids == full and len(toks.calls) == 1


def test_a_prefix_that_disagrees_with_a_call_is_refused():
    calls = [_ids_leaf(PROMPT), _ids_leaf([4])]                     # the engine sampled 4, not 3
    toks = _check_given(PROMPT + RESPONSE, calls)
    assert not toks.unique and "disagree" in toks.detail


def test_more_ids_in_the_dump_than_given_is_refused():
    toks = _check_given(PROMPT, [_ids_leaf(PROMPT + RESPONSE)])
    assert not toks.unique and "holds 4 ids" in toks.detail
