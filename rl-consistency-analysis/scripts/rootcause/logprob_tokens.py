"""output_5's ``logprobs``: the log-prob of every sampled response token on both sides, and its
metrics, on every run, or why there are none; and the run's one verdict on whether they are within
precision noise.

Two sources, each optional: the compare step's per-token log-probs of the dumped logits (output_3,
the logits result's ``logprob.tokens``, tensor mode), and the log-prob files the user passes
(``--rollout-logprobs``/``--train-logprobs``). The metrics of both come from logprob_metrics.py, the
one implementation the log-prob triage uses too (formulas: references/logprob_triage.md, "Metrics").

One noise model: ``noise`` judges the tokens against the measured noise band (logprob_noise.py)
through the triage's own judgement, the files' tokens when given (they are the numbers the user
watches, and the triage already judged them), else the dumps'. The compare step's analytic
``clean_level`` (the worst log-prob change logits within their element tolerance can cause) is
carried as a note only: it is a bound from the tolerance table, not a measurement of noise, and for
float32 it sits about ten times above the measured band (references/logprob_triage.md, "One noise
model").
"""
from __future__ import annotations

import html

import numpy as np

from . import logprob_consistency, logprob_inputs, logprob_judgement, logprob_metrics
from .logprob_pairing import Paired

# 2.0: dumps.first_position_past_clean_level removed (the analytic bound judged noise a second way);
# dumps.dtypes, dumps.temperature, dumps.analytic_bound, noise (the one verdict) and consistency (the
# files against the dumps) added.
SCHEMA_VERSION = "2.0"
# The importance-ratio bounds of the rollout_is_ratio_fraction_* metrics (the triage's default).
RATIO_BOUNDS = (0.5, 2.0)
# Files may hold millions of tokens: output_5 lists the first ones, the metrics cover them all.
MAX_LISTED = 4096
ANALYTIC_NOTE = ("the compare step's clean level: the largest log-prob change logits within their element tolerance "
                 "could cause, a worst case from the tolerance table; a note, not the noise verdict (see noise)")
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
            "prompt_tokens": lv.get("prompt_tokens"), "dtypes": lv.get("dtypes"), "temperature": lv.get("temperature"),
            "analytic_bound": {"median": lv.get("clean_level_median"), "max": lv.get("clean_level_max"),
                               "note": ANALYTIC_NOTE},
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


def _dump_sides(dumps: dict) -> tuple:
    """The dumped logits' tokens as two one-sequence sides, each with the dtype of its logits."""
    toks = dumps["tokens"]
    dtypes = dumps.get("dtypes") or [None, None]
    prompt = dumps.get("prompt_tokens")
    first = toks[0]["position"] + 1
    ids = [t["token_id"] for t in toks]
    # Prompt ids are not in output_3; a placeholder of the right length gives the triage the
    # absolute positions (grows_with_position counts from the sequence start) when the prompt is known.
    prompt_ids = [0] * first if prompt else None
    return tuple(logprob_inputs.one_sequence(f"output_3 {dumps.get('cid')} ({side})", "dumped_logits", "dumped",
                                             ids, [t[side] for t in toks], prompt_ids,
                                             {"dtype": dt} if dt else {})
                 for side, dt in (("rollout", dtypes[1]), ("train", dtypes[0])))


def _first_past(worst: list[dict]) -> dict | None:
    at = worst[0]["positions_past_band"] if worst else []
    return {"sequence": worst[0]["id"], "response_index": at[0]} if at else None


def noise(dumps: dict, files: dict, triage: dict | None) -> dict:
    """The run's one verdict on "is it within precision noise": the log-prob triage of the files when
    given (``triage``, the document under output_5 ``logprob_triage``), else the same judgement on
    the dumped logits' tokens, else none with the reason."""
    if triage is not None:
        src, verdict, reason, patterns = "logprob_files", triage["verdict"], triage["reason"], triage["patterns"]
        band, metrics, notes = triage["noise_band"], triage["metrics"], triage["notes"]
    elif dumps["tokens"]:
        rollout, train = _dump_sides(dumps)
        notes: list[str] = []
        band_obj = logprob_judgement.band_for(rollout, train, None, None, notes)
        t = logprob_judgement.judge(rollout, train, RATIO_BOUNDS, band_obj, notes)
        src, verdict, reason, patterns = "dumped_logits", t.verdict, t.reason, t.patterns
        band, metrics, notes = t.noise, t.metrics, t.notes
    else:
        return {"verdict": None, "source": None, "reason": f"no per-token log-probs: {dumps['reason']}; "
                f"{files['reason']}", "analytic_bound": None}
    return {"verdict": verdict, "source": src, "reason": reason, "patterns": [p["name"] for p in patterns],
            "precision": band["precision"], "band_source": band["source"], "tokens": metrics.get("tokens"),
            "fraction_past_band": (metrics.get("noise_signature") or {}).get("fraction_past_band"),
            "first_past_band": _first_past(metrics.get("worst_sequences") or []), "notes": notes,
            "analytic_bound": dumps.get("analytic_bound")}


def section(compare: dict, results: dict, mode: str | None, paired: Paired | None = None,
            paths: tuple[str, str] | None = None, triage: dict | None = None) -> dict:
    """output_5 ``logprobs``: both sources, each with its tokens and metrics or the reason it has none,
    and ``noise``, the one verdict on them (``triage``: the files' log-prob triage document)."""
    dumps, files = from_dumps(compare, results, mode), from_files(paired, paths)
    meta = {side: (triage or {}).get("inputs", {}).get(side, {}) for side in ("rollout", "train")}
    return {"schema_version": SCHEMA_VERSION, "log_softmax": LOG_SOFTMAX, "dumps": dumps, "files": files,
            "noise": noise(dumps, files, triage),
            "consistency": logprob_consistency.check(dumps, paired, meta, dumps.get("temperature"))}


def _numbers(src: dict) -> str:
    m = src["metrics"]
    if not m.get("tokens"):
        return "no token with finite log-probs on both sides"
    return f"max |delta| {m['log_prob_abs_diff_max']:.3g}, mean {m['log_prob_abs_diff_mean']:.3g}"


_VERDICT_WORDS = {"precision_noise": "within the {p} precision noise band",
                  "likely_bug": "past the {p} noise band in a known pattern ({names}): likely a bug",
                  "undetermined": "not decided against the {p} noise band ({reason})"}


def noise_words(nz: dict) -> str:
    """The noise verdict in a person's words (console and report.html)."""
    if nz["verdict"] is None:
        return "no noise verdict: no per-token log-probs"
    words = _VERDICT_WORDS[nz["verdict"]].format(p=nz["precision"], names=", ".join(nz["patterns"]),
                                                 reason=nz["reason"])
    where = "the log-prob files" if nz["source"] == "logprob_files" else "the dumped logits"
    return f"judged on {where}: {words}"


def console_line(lp: dict) -> str:
    """The one log-prob line of the console: what each source gave, or why there is none, and the
    one noise verdict."""
    dumps, files = lp["dumps"], lp["files"]
    parts = []
    if dumps["tokens"]:
        parts.append(f"{len(dumps['tokens'])} response tokens lined up from the dumped logits, {_numbers(dumps)} "
                     "(trainer vs rollout, raw log-softmax before temperature)")
    if files["tokens"] is not None:
        parts.append(f"{files['tokens_total']} response tokens from the log-prob files, {_numbers(files)}")
    if not parts:
        return (f"log-probs: none: {dumps['reason']}; pass --rollout-logprobs/--train-logprobs"
                + (" or dump in tensor mode" if dumps["reason_code"] == "statistics_mode" else ""))
    if not dumps["tokens"]:
        parts.append(f"none from the dumps: {dumps['reason']}")
    return "log-probs: " + "; ".join(parts) + "; " + noise_words(lp["noise"])


def html_section(lp: dict) -> str:
    """report.html: the one noise verdict beside the log-prob chart, with the analytic bound as a note."""
    nz = lp["noise"]
    rows = [noise_words(nz)]
    if nz.get("first_past_band"):
        at = nz["first_past_band"]
        rows.append(f"first token past the band in sequence {at['sequence']}: response token {at['response_index']}")
    if nz.get("analytic_bound") and nz["analytic_bound"].get("max") is not None:
        ab = nz["analytic_bound"]
        rows.append(f"note: the analytic bound of the dumped logits is {ab['median']:.3g} (median, {ab['max']:.3g} at "
                    f"most): {ab['note']}")
    return ("<section id='logprob-noise'><h3>Within precision noise?</h3>"
            + "".join(f"<p>{html.escape(r)}</p>" for r in rows) + "</section>\n")
