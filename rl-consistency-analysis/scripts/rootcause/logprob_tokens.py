"""output_5's ``logprobs``: the log-prob of every sampled response token on both sides, and its
metrics, on every run, or why there are none.

Two sources, each optional: the compare step's per-token log-probs of the dumped logits (output_3,
the logits result's ``logprob.tokens``, tensor mode), and the log-prob files the user passes
(``--rollout-logprobs``/``--train-logprobs``). The metrics of both come from logprob_metrics.py, the
one implementation the log-prob triage uses too (formulas: references/logprob_triage.md, "Metrics").
"""
from __future__ import annotations

import numpy as np

from . import logprob_metrics
from .logprob_pairing import Paired

SCHEMA_VERSION = "1.0"
# The importance-ratio bounds of the rollout_is_ratio_fraction_* metrics (the triage's default).
RATIO_BOUNDS = (0.5, 2.0)
# Files may hold millions of tokens: output_5 lists the first ones, the metrics cover them all.
MAX_LISTED = 4096
LOG_SOFTMAX = ("raw log-softmax of the logits, before any temperature: both dumps hold the logits before the "
               "job's temperature, which RL trainers divide by before their log-softmax")


def _one_sequence(token_ids, train, rollout) -> Paired:
    """A Paired of one sequence (the dumps hold one), for logprob_metrics."""
    n = len(token_ids)
    return Paired(ids=("dumped",), offsets=np.array([0, n], np.int64), token_ids=np.asarray(token_ids, np.int64),
                  rollout=np.asarray(rollout, np.float64), train=np.asarray(train, np.float64),
                  rollout_top=None, train_top=None, rollout_ranks=None, prompt_lengths=None, paired_by="order",
                  mismatched=(), rollout_only=(), train_only=())


def _metrics(p: Paired) -> dict:
    return logprob_metrics.batch(p, RATIO_BOUNDS) if p.tokens else {"tokens": 0}


def _dumps_reason(compare: dict, mode: str | None) -> tuple[str, str]:
    """(code, sentence): why the dumps gave no per-token log-probs."""
    lv = compare.get("logprob")
    if mode == "statistics":
        return "statistics_mode", "statistics mode holds no per-token values"
    if lv is None:
        return "no_logits", "no logits were compared (neither side's dump holds the lm_head or logits output)"
    if lv.get("kind") == "per_token_logprob":
        return "not_listed", "the compare step's output_3 lists no per-token log-probs (written by an older version)"
    if lv.get("reason"):
        return "logits_not_compared", f"the logits were not compared: {lv['reason']}"
    return "not_computed", "the token ids both sides ran are not known (pass --token-ids) or the logits are not finite"


def from_dumps(compare: dict, results: dict, mode: str | None) -> dict:
    """The per-token log-probs of the dumped logits, as the compare step lined them up, or why none."""
    lv = compare.get("logprob") or {}
    tokens = ((results.get(lv.get("cid")) or {}).get("logprob") or {}).get("tokens")
    if not tokens:
        code, reason = _dumps_reason(compare, mode)
        return {"source": "dumped_logits", "tokens": None, "reason_code": code, "reason": reason}
    p = _one_sequence([t["token_id"] for t in tokens], [t["train"] for t in tokens], [t["rollout"] for t in tokens])
    return {"source": "dumped_logits", "cid": lv.get("cid"), "point": lv.get("point"),
            "prompt_tokens": lv.get("prompt_tokens"),
            "first_position_past_clean_level": lv.get("first_position_past_clean_level"),
            "tokens": tokens, "metrics": _metrics(p)}


def from_files(paired: Paired | None, paths: tuple[str, str] | None) -> dict:
    """The per-token log-probs of the user's files (paired as the triage pairs them), or why none."""
    if paired is None:
        return {"source": "logprob_files", "tokens": None,
                "reason": "no log-prob files were passed (--rollout-logprobs/--train-logprobs)"}
    delta, _ = logprob_metrics.deltas(paired)
    seq = paired.sequence_of_token()[:MAX_LISTED]
    where = paired.position_in_sequence()[:MAX_LISTED]
    absolute = paired.absolute_position()
    listed = [{"sequence": paired.ids[s], "response_index": int(i),
               "position": int(absolute[k]) - 1 if absolute is not None else None,
               "token_id": int(paired.token_ids[k]), "train": float(paired.train[k]),
               "rollout": float(paired.rollout[k]), "delta": float(delta[k])}
              for k, (s, i) in enumerate(zip(seq, where))]
    return {"source": "logprob_files", "rollout": paths[0], "train": paths[1], "tokens": listed,
            "tokens_total": paired.tokens, "metrics": _metrics(paired)}


def section(compare: dict, results: dict, mode: str | None, paired: Paired | None = None,
            paths: tuple[str, str] | None = None) -> dict:
    """output_5 ``logprobs``: both sources, each with its tokens and metrics or the reason it has none."""
    return {"schema_version": SCHEMA_VERSION, "log_softmax": LOG_SOFTMAX,
            "dumps": from_dumps(compare, results, mode), "files": from_files(paired, paths)}


def _numbers(src: dict) -> str:
    m = src["metrics"]
    if not m.get("tokens"):
        return "no token with finite log-probs on both sides"
    return f"max |delta| {m['log_prob_abs_diff_max']:.3g}, mean {m['log_prob_abs_diff_mean']:.3g}"


def console_line(lp: dict) -> str:
    """The one log-prob line of the console: what each source gave, or why there is none."""
    dumps, files = lp["dumps"], lp["files"]
    parts = []
    if dumps["tokens"]:
        first = dumps.get("first_position_past_clean_level")
        parts.append(f"{len(dumps['tokens'])} response tokens lined up from the dumped logits, {_numbers(dumps)} "
                     "(trainer vs rollout, raw log-softmax before temperature), "
                     + (f"past what rounding explains from the token at position {first}" if first is not None
                        else "all within what rounding explains"))
    if files["tokens"] is not None:
        parts.append(f"{files['tokens_total']} response tokens from the log-prob files, {_numbers(files)}")
    if not parts:
        return (f"log-probs: none: {dumps['reason']}; pass --rollout-logprobs/--train-logprobs"
                + (" or dump in tensor mode" if dumps["reason_code"] == "statistics_mode" else ""))
    if not dumps["tokens"]:
        parts.append(f"none from the dumps: {dumps['reason']}")
    return "log-probs: " + "; ".join(parts)
