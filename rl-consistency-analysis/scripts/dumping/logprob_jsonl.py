"""The generic log-prob JSONL both dumpers write: one JSON object per sequence.

Record keys: ``id``, ``token_ids`` (the response ids), ``logprobs`` (one per response token, of
that token); optional ``prompt_ids``, ``top_logprobs`` (per response token, a list of
``{"token_id", "logprob"}`` best first), ``dtype``, ``temperature``, ``logprobs_mode`` (vLLM's
vocabulary: ``raw_logprobs`` before temperature, ``processed_logprobs`` after it).

Public API:
    record(seq_id, token_ids, logprobs, **optional) -> dict
    write(path, records)
"""
from __future__ import annotations

import json
from pathlib import Path

_OPTIONAL = ("prompt_ids", "top_logprobs", "dtype", "temperature", "logprobs_mode")


def record(seq_id, token_ids, logprobs, **optional):
    """One sequence's record; optional keys left None are omitted."""
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{seq_id}: {len(token_ids)} token ids but {len(logprobs)} log-probs")
    unknown = set(optional) - set(_OPTIONAL)
    if unknown:
        raise ValueError(f"unknown log-prob record keys {sorted(unknown)}")
    rec = {"id": seq_id, "token_ids": [int(t) for t in token_ids], "logprobs": [float(v) for v in logprobs]}
    rec.update({k: v for k, v in optional.items() if v is not None})
    return rec


def write(path, records):
    """Write the records, one JSON object a line."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
