"""Are the log-prob files and the tensor dumps the same forward? output_5 ``logprobs.consistency``.

With tensor dumps and log-prob files both given, each side's file should hold the log-probs its
dumped logits give. Before saying the two are not the same forward, the processing that makes a
file differ from the raw log-softmax of the logits by construction is tested, per side:

- the rollout: vLLM V1 returns ``raw_logprobs`` by default (before temperature, penalties and
  top-k/top-p), ``processed_logprobs`` when the engine was started so (after them: at temperature
  T, the log-softmax of logits / T); greedy sampling (T = 0) applies no temperature;
- the trainer: RL trainers divide the logits by the job's temperature before the log-softmax.

The compare step lists each dumped token's raw log-prob and, with ``--logprob-temperature T`` (the
root-cause run passes the files' stated temperature), its log-prob at T (output_3
``logprob.tokens``). A side fits an explanation when its file is within MATCH_TOL of it on every
dumped token. references/output_schemas.md ("The files against the dumps") gives the rule.
"""
from __future__ import annotations

import numpy as np

from .logprob_inputs import LogprobSide
from .logprob_pairing import Paired

# Same logits, log-softmax computed twice: our float64 against the engine's float32 differs by a few
# float32 ulps of the log-sum-exp (1e-6 for log-probs near -10, the real-vLLM fp32 cases show
# under 1e-6). 1e-4 leaves room for log-probs stored in bf16-rounded logits or a fused kernel, and
# stays far under what a temperature of 0.95 or a stale weight moves (1e-2 and more on those cases).
MATCH_TOL = 1e-4
_RAW, _AT_T = "raw", "temperature"


def _temperature_of(meta: dict) -> float | None:
    t = meta.get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None


def stated_temperature(rollout: LogprobSide, train: LogprobSide) -> float | None:
    """The temperature the files state (the trainer's first), when it changes log-probs: above 0
    (greedy runs apply none) and not 1."""
    for side in (train, rollout):
        t = _temperature_of(side.meta)
        if t is not None and t > 0 and t != 1:
            return t
    return None


def _expected(side: str, meta: dict) -> str:
    """What the file should hold, from what it states: raw, or at the temperature."""
    t = _temperature_of(meta)
    if t is None or t == 0 or t == 1:
        return _RAW
    if side == "rollout":
        return _AT_T if meta.get("logprobs_mode") == "processed_logprobs" else _RAW
    return _AT_T


def _match(dumped: list[dict], paired: Paired) -> tuple[int, int] | None:
    """(paired sequence, index of its first token in the dumped list) whose response ids are the
    dumped tokens' last ids (all of them when the dump lists the response only)."""
    ids = np.array([t["token_id"] for t in dumped], np.int64)
    for s in range(len(paired.ids)):
        seq = paired.token_ids[paired.offsets[s]:paired.offsets[s + 1]]
        if 0 < seq.size <= ids.size and np.array_equal(ids[ids.size - seq.size:], seq):
            return s, ids.size - seq.size
    return None


def _side(side: str, file_lp: np.ndarray, dumped: list[dict], meta: dict, temperature: float | None) -> dict:
    raw = np.array([t[side] for t in dumped])
    diffs = {_RAW: float(np.max(np.abs(file_lp - raw)))}
    key = f"{side}_at_temperature"
    if temperature is not None and all(key in t for t in dumped):
        diffs[_AT_T] = float(np.max(np.abs(file_lp - np.array([t[key] for t in dumped]))))
    fits = next((k for k in (_expected(side, meta), _RAW, _AT_T) if diffs.get(k, np.inf) <= MATCH_TOL), None)
    return {"stated": {k: meta.get(k) for k in ("temperature", "logprobs_mode")}, "expected": _expected(side, meta),
            "fits": fits, "max_abs_diff": diffs}


def _words(kind: str, temperature: float | None) -> str:
    return "the raw log-softmax" if kind == _RAW else f"the log-softmax at temperature {temperature:g}"


def check(dumps: dict, paired: Paired | None, meta: dict, temperature: float | None) -> dict:
    """output_5 ``logprobs.consistency``: whether each side's file holds what its dumped logits give,
    raw or at ``temperature`` (the one output_3 listed), or why it was not checked."""
    if paired is None or not dumps.get("tokens"):
        why = "no log-prob files" if paired is None else f"no per-token log-probs from the dumps ({dumps['reason']})"
        return {"verdict": "not_checked", "reason": why}
    dumped = dumps["tokens"]
    found = _match(dumped, paired)
    if found is None:
        return {"verdict": "not_same_forward", "reason": "no sequence of the files holds the dumped tokens' ids: the "
                "files and the dumps are not the same generation", "tolerance": MATCH_TOL}
    s, start = found
    dumped = dumped[start:]
    sl = slice(paired.offsets[s], paired.offsets[s + 1])
    sides = {side: _side(side, lp[sl], dumped, meta.get(side, {}), temperature)
             for side, lp in (("rollout", paired.rollout), ("train", paired.train))}
    off = [k for k, v in sides.items() if v["fits"] is None]
    tried = "raw" + (f" and at temperature {temperature:g}" if temperature is not None else
                     " (no temperature stated or given: --logprob-temperature T tests one)")
    if off:
        verdict = "not_same_forward"
        gaps = ", ".join(f"{k} by {min(sides[k]['max_abs_diff'].values()):.3g}" for k in off)
        reason = (f"a file departs from its dumped logits ({gaps} at best; tried {tried}): temperature and "
                  "logprobs_mode do not explain it, so the files and the dumps are not the same forward")
    else:
        verdict = "same_forward"
        reason = "; ".join(f"{k} file = {_words(v['fits'], temperature)} of its dumped logits"
                           + ("" if v["fits"] == v["expected"] else
                              f" (it states {v['stated']}, which would give {_words(v['expected'], temperature)})")
                           for k, v in sides.items())
    return {"verdict": verdict, "reason": reason, "sequence": paired.ids[s], "tokens": len(dumped),
            "temperature": temperature, "tolerance": MATCH_TOL, "sides": sides}


def console_line(c: dict) -> str:
    """One console line: the files against the dumps."""
    words = {"same_forward": "the same forward", "not_same_forward": "not the same forward",
             "not_checked": "not checked"}[c["verdict"]]
    return f"log-prob files vs dumped logits: {words}: {c['reason']}"
