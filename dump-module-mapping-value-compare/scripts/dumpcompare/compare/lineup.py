"""Which of the trainer's logits rows an engine's sampled logits rows stand for.

A trainer scores the whole sequence in one forward: its lm_head output has one row per position.
An engine (vLLM's logits processor) computes logits only where a token is sampled: the last
``first`` rows of the prefill (one row, the last prompt position, unless prompt log-probs were
asked for), then one row per decode call. With a prompt of ``P`` tokens, engine row ``j`` sits at
position ``P - first + j``: the engine's rows are one contiguous run of the trainer's rows.
"""
from __future__ import annotations


def sampled_rows(prompt: int, first: int, decodes: int, full_rows: int) -> slice | None:
    """The trainer rows that an engine's ``first`` prefill rows + ``decodes`` decode rows line up with.

    ``prompt`` is the prompt length (the engine's first call's token count), ``full_rows`` the rows
    the trainer holds. None when the engine's rows do not fit inside the trainer's.
    """
    start = prompt - first
    stop = prompt + decodes
    if first < 1 or decodes < 0 or start < 0 or stop > full_rows:
        return None
    return slice(start, stop)
