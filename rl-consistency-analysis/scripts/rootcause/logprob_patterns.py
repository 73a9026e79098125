"""The closed list of log-prob mismatch patterns (references/logprob_triage.md, "Patterns").

Each detector looks at the paired tokens against the noise band and either returns a
:class:`Pattern` (a hypothesis: its ``name``, the numbers that raised it as ``evidence``, and the
``check`` that would settle it) or nothing. None of them is a certainty; the triage judgement
(logprob_judgement.py) decides the verdict from which of them fired.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import logprob_metrics
from .logprob_noise import ALLOWED_PAST, NoiseBand
from .logprob_pairing import Paired

NAMES = ("token_mismatch", "position_shift", "prefill_decode_jump", "from_position", "grows_with_position",
         "temperature", "logit_scale", "sequence_end_gaps", "sparse_gaps", "uniform_offset", "top1_disagreement")
_MIN_TOKENS = 20
# How unlikely, under precision noise, the count of tokens past the band must be before the count
# alone says "not noise" (references/logprob_triage.md, "Few tokens").
NOISE_ALPHA = 1e-3
_GAP_FACTOR = 10.0          # a "gap" is this many times past the band's limit (or not finite)


@dataclass(frozen=True)
class Pattern:
    """One hypothesis about why the two sides' log-probs differ."""

    name: str
    evidence: dict
    check: str
    where: dict = field(default_factory=dict)     # sequence id / positions the check should look at

    def as_dict(self) -> dict:
        return {"name": self.name, "evidence": self.evidence, "check": self.check, "where": self.where}


@dataclass(frozen=True)
class View:
    """What every detector reads: the pair, its deltas and where they pass the band."""

    paired: Paired
    band: NoiseBand
    delta: np.ndarray
    finite: np.ndarray
    past: np.ndarray            # |delta| past the band's limit, or not finite
    limit: np.ndarray
    pos: np.ndarray
    seq: np.ndarray
    meta: dict                  # {"rollout": {...}, "train": {...}} from the files

    @classmethod
    def of(cls, paired: Paired, band: NoiseBand, meta: dict) -> "View":
        delta, finite = logprob_metrics.deltas(paired)
        limit = band.limit(-paired.rollout)
        past = ~finite | (np.abs(np.where(finite, delta, 0.0)) > limit)
        return cls(paired, band, delta, finite, past, limit, paired.position_in_sequence(),
                   paired.sequence_of_token(), meta)

    @property
    def past_rate(self) -> float:
        return float(self.past.mean()) if self.past.size else 0.0


_TREND_SAMPLE = 100_000


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Rank correlation (no ties correction: enough for a trend test); on an evenly spaced sample
    of at most _TREND_SAMPLE points, which estimates a trend as well as all of them."""
    if x.size > _TREND_SAMPLE:
        step = -(-x.size // _TREND_SAMPLE)
        x, y = x[::step], y[::step]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """argsort(argsort(x)) with one sort: the inverse of the sorting permutation."""
    order = np.argsort(x)
    ranks = np.empty(x.size, np.int64)
    ranks[order] = np.arange(x.size)
    return ranks


def _r(x, n=4):
    return None if x is None else round(float(x), n)


# ------------------------------------------------------------------------------------------------
# detectors


def token_mismatch(v: View) -> Pattern | None:
    m = v.paired.mismatched
    if not m:
        return None
    first = m[0]
    return Pattern("token_mismatch",
                   {"sequences": len(m), "paired_sequences": len(v.paired.ids),
                    "examples": [{"id": x.id, "rollout_tokens": x.rollout_tokens, "train_tokens": x.train_tokens,
                                  "first_differing_position": x.first_differing_position} for x in m[:5]]},
                   "the trainer scored other token ids than the rollout sampled (re-tokenising decoded text, a chat "
                   "template applied on one side, truncation): score the rollout's response ids as they are and "
                   "compare again",
                   {"sequence": first.id, "from_position": first.first_differing_position})


def position_shift(v: View) -> Pattern | None:
    if v.paired.tokens < _MIN_TOKENS or v.past_rate <= ALLOWED_PAST:
        return None
    fit = logprob_metrics.lag_fit(v.paired)
    top = logprob_metrics.topk_lag_overlap(v.paired)
    lag = min((-1, 1), key=lambda k: fit[k] if fit[k] is not None else np.inf)
    if fit[lag] is None or fit[0] is None or not fit[lag] < 0.5 * fit[0]:
        return None
    if top and (top.get(lag) or 0) <= (top.get(0) or 0):
        return None
    return Pattern("position_shift",
                   {"mean_abs_diff_at_lag": {str(k): _r(x, 6) for k, x in fit.items()},
                    "top1_same_at_lag": {str(k): _r(x) for k, x in top.items()} or None, "best_lag": lag},
                   f"the trainer's log-prob at position i fits the rollout's at i{lag:+d}: logits row and token are "
                   "one position apart. The log-prob of response token i must come from the logits row of the "
                   "position before it (logits[:, P-1+i] for a prompt of P tokens): check the trainer's slice "
                   "and the gather index", {"lag": lag})


def prefill_decode_jump(v: View) -> Pattern | None:
    first, rest = v.pos == 0, v.pos > 0
    if len(v.paired.ids) < 2 or not rest.any():
        return None
    at0 = float(v.past[first].mean())
    later = float(v.past[rest].mean())
    if at0 < 0.5 or later > ALLOWED_PAST:
        return None
    ad = np.abs(np.where(v.finite, v.delta, 0.0))
    return Pattern("prefill_decode_jump",
                   {"fraction_past_band_at_first_token": _r(at0), "fraction_past_band_later": _r(later),
                    "mean_abs_diff_first_token": _r(ad[first].mean(), 6), "mean_abs_diff_later": _r(ad[rest].mean(), 6)},
                   "only the first response token (the one the prefill call's last row predicts) is off: compare "
                   "the engine's prefill path with the trainer's forward (a dump with one step per forward call; "
                   "the prefill's last row against the trainer's row P-1)", {"position": 0})


_FINE = 8192


def _best_split(hits: np.ndarray, totals: np.ndarray | None = None) -> tuple[int, float, float] | None:
    """Split of an ordered series of past-band counts (over ``totals`` items each; one item each
    when None) maximising (rate after - rate before), with at least 3 entries on each side.

    Long series are searched coarse to fine: the best split between blocks of about n/4096 entries,
    then every split within a block of it."""
    n = hits.size
    if n < 6:
        return None
    if n <= _FINE:
        return _split_between(hits, totals, 0, n, 0.0, 0.0)
    size = -(-n // 4096)
    starts = np.arange(0, n, size)
    block_totals = np.diff(np.append(starts, n)) if totals is None else np.add.reduceat(totals, starts)
    coarse = _split_between(np.add.reduceat(hits, starts, dtype=np.float64), block_totals, 0, starts.size, 0.0, 0.0)
    if coarse is None:
        return None
    lo, hi = int(starts[max(coarse[0] - 1, 0)]), min(n, int(starts[coarse[0]]) + size)
    c0 = float(hits[:lo].sum())
    w0 = float(lo if totals is None else totals[:lo].sum())
    return _split_between(hits, totals, lo, hi, c0, w0)


def _split_between(hits, totals, lo: int, hi: int, c0: float, w0: float) -> tuple[int, float, float] | None:
    """The best split k in [max(lo, 3), min(hi, n - 3)] (c0, w0: sums of the entries before lo)."""
    n = hits.size
    c = c0 + np.cumsum(hits[lo:hi], dtype=np.float64)
    w = w0 + (np.arange(1, hi - lo + 1, dtype=np.float64) if totals is None
              else np.cumsum(totals[lo:hi], dtype=np.float64))
    c_all = c0 + float(hits[lo:].sum()) if hi < n else float(c[-1])
    w_all = (w0 + float(n - lo) if totals is None else w0 + float(totals[lo:].sum())) if hi < n else float(w[-1])
    k = np.arange(lo + 1, hi + 1)                   # split before entry k: entries lo..k-1 summed in c
    ok = (k >= 3) & (k <= n - 3)
    if not ok.any():
        return None
    c, w, k = c[ok], w[ok], k[ok]
    before = c / np.maximum(w, 1e-12)
    after = (c_all - c) / np.maximum(w_all - w, 1e-12)
    i = int(np.argmax(after - before))
    return int(k[i]), float(before[i]), float(after[i])


def from_position(v: View) -> Pattern | None:
    """A change from one point on: in token order (a weight sync while requests ran one after
    another), or from one response position on in every sequence (a sync during a batched decode)."""
    cands = []
    s = _best_split(v.past)
    if s:
        k, b, a = s
        cands.append((a - b, "token_order", {"sequence": v.paired.ids[v.seq[k]], "position": int(v.pos[k]),
                                              "sequence_index": int(v.seq[k])}, b, a))
    if len(v.paired.ids) >= 2:
        n = np.bincount(v.pos)
        hits = np.bincount(v.pos, weights=v.past.astype(float))
        s = _best_split(hits, n)
        if s:
            k, b, a = s
            cands.append((a - b, "response_position", {"position": k}, b, a))
    if not cands:
        return None
    _, scope, where, before, after = max(cands, key=lambda c: c[0])
    if before > 2 * ALLOWED_PAST or after < 0.5:
        return None
    return Pattern("from_position",
                   {"scope": scope, "fraction_past_band_before": _r(before), "fraction_past_band_after": _r(after)},
                   "the two sides agree up to one point and disagree from it on: weights (or another input) changed "
                   "there on one side, e.g. a weight sync landing mid-generation or between requests. Dump that "
                   "sequence with one msprobe step per forward call and find the first call that departs; compare "
                   "the weight versions each side used for it", where)


def grows_with_position(v: View, exclude: set) -> Pattern | None:
    """|delta| rising with the position: the absolute one (prompt + response) where the prompt
    lengths are known, as RoPE and the KV cache see it, else the response position. Token level:
    per-position means of a few tokens are too noisy for a trend."""
    if "from_position" in exclude or v.paired.tokens < _MIN_TOKENS:
        return None
    absolute = v.paired.absolute_position()
    f = v.finite
    pos = (absolute if absolute is not None else v.pos)[f]
    ad = np.abs(v.delta[f])
    if pos.size < _MIN_TOKENS or np.ptp(pos) < 6:
        return None
    rho = spearman(pos.astype(float), ad)
    lo, hi = logprob_metrics.quantiles(pos, (1 / 3, 2 / 3))
    early, late = float(ad[pos <= lo].mean()), float(ad[pos >= hi].mean())
    late_past = float(v.past[f][pos >= hi].mean())
    if rho is None or rho < max(0.25, 3 / np.sqrt(pos.size)) or late < 1.5 * max(early, 1e-12) \
            or late_past <= ALLOWED_PAST:
        return None
    return Pattern("grows_with_position",
                   {"position": "prompt + response" if absolute is not None else "response",
                    "spearman_position_vs_abs_diff": _r(rho), "mean_abs_diff_first_third": _r(early, 6),
                    "mean_abs_diff_last_third": _r(late, 6), "fraction_past_band_last_third": _r(late_past)},
                   "|delta| grows with the position: something position-dependent differs (RoPE theta or scaling, "
                   "position ids, the KV cache, a sliding window). Dump layers 0-1 (rotary embedding, attention) "
                   "with a long prompt and compare", {"positions_from": int(hi)})


def _temperature_fit(v: View) -> dict | None:
    """Fit logp_train = logp_rollout / T + c (c per position) over the top-k entries both sides list."""
    if v.paired.rollout_top is None or v.paired.train_top is None:
        return None
    (ri, rl), (ti, tl) = v.paired.rollout_top, v.paired.train_top
    match = (ri[:, :, None] == ti[:, None, :]) & (ri[:, :, None] >= 0)        # [N, k_r, k_t]
    shared = match.any(axis=2) & np.isfinite(rl)
    y_all = np.where(match, np.nan_to_num(tl, neginf=0.0)[:, None, :], 0.0).sum(axis=2)
    shared &= np.isfinite(y_all)
    cnt = shared.sum(axis=1)
    rows = cnt >= 2
    if rows.sum() < 10:
        return None
    sh, c = shared[rows], cnt[rows][:, None]
    x = np.where(sh, rl[rows], 0.0)
    y = np.where(sh, y_all[rows], 0.0)
    x = np.where(sh, x - x.sum(axis=1, keepdims=True) / c, 0.0)
    y = np.where(sh, y - y.sum(axis=1, keepdims=True) / c, 0.0)
    xx = float((x * x).sum())
    if not xx > 0:
        return None
    slope = float((x * y).sum()) / xx
    resid = y - slope * x
    r2 = 1.0 - float((resid * resid).sum()) / max(float((y * y).sum()), 1e-30)
    return {"slope": slope, "r2": r2, "positions": int(rows.sum())}


def temperature(v: View) -> Pattern | None:
    if v.past_rate <= ALLOWED_PAST:
        return None
    fit = _temperature_fit(v)
    if fit is None or fit["r2"] < 0.9 or abs(fit["slope"] - 1.0) < 0.05:
        return None
    t_rel = 1.0 / fit["slope"]
    r_meta, t_meta = v.meta.get("rollout", {}), v.meta.get("train", {})
    stated = [m.get("temperature") for m in (r_meta, t_meta) if isinstance(m.get("temperature"), (int, float))]
    explain = (f"the trainer's log-probs are the rollout's with logits divided by {t_rel:.3g} "
               "(train = log_softmax(z / T) where the rollout used z)")
    fits_raw = None
    if r_meta.get("logprobs_mode") == "raw_logprobs" and stated:
        temp = stated[-1]
        fits_raw = abs(t_rel - temp) <= 0.05 * max(temp, 1e-6)
        explain += (f"; the rollout's raw_logprobs are before its temperature {temp:g} and the trainer divides by "
                    f"{temp:g}: the fit {'matches' if fits_raw else 'does not match'} that explanation")
    return Pattern("temperature",
                   {"fitted_train_over_rollout_temperature": _r(t_rel), "slope": _r(fit["slope"]), "r2": _r(fit["r2"]),
                    "positions": fit["positions"], "stated_temperatures": stated or None,
                    "rollout_logprobs_mode": r_meta.get("logprobs_mode"), "raw_logprobs_explains_it": fits_raw},
                   explain + ". Make both sides score at the same temperature: start vLLM with "
                   "logprobs_mode='processed_logprobs' (or divide the trainer's logits only where the rollout's "
                   "log-probs were taken after temperature); a softcap or a final-norm scale also scales the logits")


def logit_scale(v: View, exclude: set) -> Pattern | None:
    """Without top-k: delta tied to the token's surprisal, as a scaled logit vector gives."""
    if "temperature" in exclude or v.past_rate <= 0.3 or v.paired.tokens < _MIN_TOKENS:
        return None
    if v.paired.rollout_top is not None and v.paired.train_top is not None:
        return None                 # with top-k the temperature fit decides
    f = v.finite
    rho = spearman(-v.paired.rollout[f], v.delta[f])
    if rho is None or abs(rho) < 0.8:
        return None
    return Pattern("logit_scale",
                   {"spearman_surprisal_vs_delta": _r(rho)},
                   "the signed difference follows how unlikely each token was, as when one side's logits are "
                   "scaled (temperature on one side only, a softcap, a different final norm). Write top-k log-probs "
                   "on both sides (logprobs=k) so the temperature can be fitted")


def gaps(v: View, exclude: set) -> Pattern | None:
    """A few tokens with huge gaps and the rest clean: sequence_end_gaps or sparse_gaps."""
    if exclude & {"position_shift", "from_position", "prefill_decode_jump"}:
        return None
    ad = np.abs(np.where(v.finite, v.delta, 0.0))
    gap = ~v.finite | (ad > _GAP_FACTOR * v.limit)
    n_gap = int(gap.sum())
    if n_gap == 0 or n_gap > 0.1 * v.paired.tokens:
        return None
    rest = ~gap
    if float(v.past[rest].mean()) > ALLOWED_PAST:
        return None
    lengths = np.diff(v.paired.offsets)
    last = v.pos == (lengths[v.seq] - 1)
    at_ends = float((gap & (last | (v.pos == 0))).sum() / n_gap)
    idx = np.flatnonzero(gap)[:5]
    examples = [{"sequence": v.paired.ids[v.seq[i]], "position": int(v.pos[i]),
                 "rollout": _r(v.paired.rollout[i]), "train": _r(v.paired.train[i])} for i in idx]
    ev = {"gap_tokens": n_gap, "non_finite": int((~v.finite).sum()), "fraction_at_sequence_ends": _r(at_ends),
          "examples": examples}
    if at_ends >= 0.6:
        return Pattern("sequence_end_gaps", ev,
                       "the gaps sit at the first or last response token: a padding or mask misalignment (the "
                       "response_mask one token short or long, EOS handled differently, left vs right padding). "
                       "Check the mask and the padding side each framework uses against the response lengths",
                       {"examples": examples})
    return Pattern("sparse_gaps", ev,
                   "a few tokens are far off and the rest clean: sampling masks in the returned log-probs (top-k/"
                   "top-p in processed_logprobs), non-finite values, or a mask misalignment inside the sequence. "
                   "Look at the listed tokens on both sides", {"examples": examples})


def chance_under_noise(past: int, n: int, rate: float = ALLOWED_PAST) -> float:
    """An upper bound on the chance that precision noise puts ``past`` or more of ``n`` tokens past the
    band, when a clean pair has at most ``rate`` of them there: the Chernoff bound
    exp(-n KL(past/n || rate)) of the binomial tail (one closed form for six tokens and for 10^6)."""
    if n == 0 or past <= rate * n:
        return 1.0
    q = past / n
    kl = q * np.log(q / rate) + ((1 - q) * np.log((1 - q) / (1 - rate)) if q < 1 else 0.0)
    return float(np.exp(-n * kl))


def uniform_offset(v: View, exclude: set) -> Pattern | None:
    """Most tokens past the band. The count of tokens decides through how unlikely that many past
    the band is under noise, not a minimum length: six tokens all past the band are as clear as
    thirty (below _MIN_TOKENS it fires only when the chance bound is under NOISE_ALPHA)."""
    past = int(v.past.sum())
    chance = chance_under_noise(past, v.paired.tokens)
    if exclude or v.past_rate < 0.3 or chance > NOISE_ALPHA:
        return None
    ad = np.abs(np.where(v.finite, v.delta, 0.0))
    ratio = float(np.median(ad) / np.median(v.limit))
    return Pattern("uniform_offset",
                   {"fraction_past_band": _r(v.past_rate), "tokens_past_band": past, "tokens": v.paired.tokens,
                    "chance_under_noise_at_most": float(f"{chance:.3g}"),
                    "median_abs_diff_over_band_limit": _r(ratio, 2), "mean_abs_diff": _r(ad.mean(), 6)},
                   "most tokens are off by similar amounts from the first token on: the two sides do not run the "
                   "same weights (a stale or partial weight sync, another checkpoint, a quantised weight) or the "
                   "same config. Dump both sides at module level (statistics) on one sequence and run the "
                   "root-cause analysis with --model to find the first module and the side")


def top1_disagreement(v: View) -> Pattern | None:
    info = logprob_metrics.topk(v.paired)
    rate, n = info.get("top1_disagreement"), info.get("topk_positions", 0)
    if rate is None or n < _MIN_TOKENS:
        return None
    base = v.band.top1_disagreement or 0.0
    allowed = 3 * base + 3 * np.sqrt(max(base, 1e-3) * (1 - base) / n) + 0.01
    if rate <= allowed:
        return None
    return Pattern("top1_disagreement",
                   {"top1_disagreement": _r(rate), "band_top1_disagreement": _r(base), "allowed": _r(allowed),
                    "positions": n},
                   "the two sides' most likely token differs far more often than precision allows: the final norm "
                   "or lm_head differs, or the log-probs come from different forwards. Dump the logits (tensor "
                   "task, last layers) on one sequence and compare")


def detect(v: View) -> list[Pattern]:
    """Every pattern of the closed list the data shows, most specific first."""
    found: list[Pattern] = []

    def add(p):
        if p is not None:
            found.append(p)

    add(token_mismatch(v))
    if v.paired.tokens == 0:
        return found
    add(position_shift(v))
    add(prefill_decode_jump(v))
    add(from_position(v))
    names = {p.name for p in found}
    add(grows_with_position(v, names))
    add(temperature(v))
    names = {p.name for p in found}
    add(logit_scale(v, names))
    add(gaps(v, names))
    names = {p.name for p in found} - {"token_mismatch"}
    add(uniform_offset(v, names))
    add(top1_disagreement(v))
    return found
