"""The log-prob mismatch metrics, one implementation for every caller (formulas:
references/logprob_triage.md, "Metrics").

With ``delta = logp_train - logp_rollout`` per response token (the log of the importance ratio
``r = exp(delta)``), the batch metrics carry the names verl's rollout correction logs for the same
quantity (``rollout_corr/...``), so a user can set our numbers beside their dashboard. Tokens where
either side is not finite are counted and left out of every statistic.
"""
from __future__ import annotations

import numpy as np

from .logprob_pairing import Paired

QUANTILES = (0.5, 0.9, 0.99)
_MAX_PER_POSITION = 4096


def quantiles(x: np.ndarray, qs) -> list[float]:
    """np.quantile's default (linear) quantiles from one np.partition of ``x`` (non-empty): the same
    numbers without np.quantile's np.unique, which imports numpy.ma (a twentieth of a second, as
    long as the rest of a 10^6-token triage's statistics)."""
    h = (x.size - 1) * np.asarray(qs, np.float64)
    lo = np.floor(h).astype(np.int64)
    hi = np.minimum(lo + 1, x.size - 1)
    part = np.partition(x, sorted({*lo.tolist(), *hi.tolist()}))
    a, b, t = part[lo], part[hi], h - lo
    return [float(v) for v in a + (b - a) * t]


def _quantiles(x: np.ndarray, name: str) -> dict:
    """``{name_p50: .., name_p90: .., name_p99: ..}`` from one pass over ``x``."""
    vals = quantiles(x, QUANTILES) if x.size else [None] * len(QUANTILES)
    return {f"{name}_p{int(q * 100)}": _f(v) for q, v in zip(QUANTILES, vals)}


def _f(x) -> float | None:
    return None if x is None else float(x)


def deltas(p: Paired) -> tuple[np.ndarray, np.ndarray]:
    """(delta, finite mask) per paired token."""
    finite = np.isfinite(p.rollout) & np.isfinite(p.train)
    with np.errstate(invalid="ignore"):
        delta = np.where(finite, p.train - p.rollout, np.nan)
    return delta, finite


def batch(p: Paired, bounds: tuple[float, float], seq: dict | None = None) -> dict:
    """Batch metrics over every finite paired token (``seq``: :func:`sequences` when already computed)."""
    delta, finite = deltas(p)
    d = delta[finite]
    ad = np.abs(d)
    r = np.exp(np.clip(d, -700, 700))
    lo, hi = bounds
    out = {
        "tokens": p.tokens, "sequences": len(p.ids), "non_finite_tokens": int((~finite).sum()),
        "log_prob_abs_diff_mean": _f(ad.mean()) if d.size else None,
        "log_prob_abs_diff_max": _f(ad.max()) if d.size else None,
        **_quantiles(ad, "log_prob_abs_diff"),
        "log_prob_diff_mean": _f(d.mean()) if d.size else None,
        "log_prob_diff_std": _f(d.std()) if d.size else None,
        "rollout_is_mean": _f(r.mean()) if d.size else None,
        "rollout_is_std": _f(r.std()) if d.size else None,
        "rollout_is_min": _f(r.min()) if d.size else None,
        "rollout_is_max": _f(r.max()) if d.size else None,
        **_quantiles(r, "rollout_is"),
        "rollout_is_ratio_fraction_high": _f((r > hi).mean()) if d.size else None,
        "rollout_is_ratio_fraction_low": _f((r < lo).mean()) if d.size else None,
        "ratio_bounds": [lo, hi],
        "kl": _f((-d).mean()) if d.size else None,
        "k3_kl": _f((r - 1.0 - d).mean()) if d.size else None,
    }
    seq = seq or sequences(p, delta, finite)
    if seq["log_ratio"].size:
        out["seq_log_ratio_mean"] = _f(seq["log_ratio"].mean())
        out["seq_log_ratio_min"] = _f(seq["log_ratio"].min())
        out["seq_log_ratio_max"] = _f(seq["log_ratio"].max())
        out["log_ppl_diff"] = _f(seq["log_ppl_diff"].mean())
    out.update(topk(p))
    return out


def sequences(p: Paired, delta: np.ndarray, finite: np.ndarray) -> dict:
    """Per-sequence arrays: finite tokens, mean and max |delta| (and where), the log of the sequence
    importance ratio (sum of delta), and the log-perplexity difference (train minus rollout)."""
    seq = p.sequence_of_token()
    s = len(p.ids)
    d0 = np.where(finite, delta, 0.0)
    n = np.bincount(seq, weights=finite.astype(float), minlength=s)
    tot = np.bincount(seq, weights=np.abs(d0), minlength=s)
    log_ratio = np.bincount(seq, weights=d0, minlength=s)
    ad = np.where(finite, np.abs(d0), -1.0)
    mx = np.full(s, -1.0)
    np.maximum.at(mx, seq, ad)
    pos = p.position_in_sequence()
    at = np.full(s, -1, np.int64)
    hit = ad == mx[seq]
    at[seq[hit][::-1]] = pos[hit][::-1]          # first position holding the maximum
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_abs = np.where(n > 0, tot / n, np.nan)
        log_ppl_diff = np.where(n > 0, -log_ratio / n, np.nan)
    return {"tokens": n.astype(np.int64), "mean_abs_diff": mean_abs, "max_abs_diff": np.where(mx >= 0, mx, np.nan),
            "max_at_position": at, "log_ratio": log_ratio[n > 0], "log_ratio_all": log_ratio,
            "log_ppl_diff": log_ppl_diff[n > 0]}


def per_position(p: Paired, delta: np.ndarray, finite: np.ndarray) -> dict:
    """Mean |delta| and token count at each response position (over all sequences)."""
    pos = p.position_in_sequence()[finite]
    if not pos.size:
        return {"mean_abs_diff": np.zeros(0), "tokens": np.zeros(0, np.int64)}
    n = np.bincount(pos)
    tot = np.bincount(pos, weights=np.abs(delta[finite]))
    with np.errstate(invalid="ignore"):
        return {"mean_abs_diff": (tot / np.maximum(n, 1))[:_MAX_PER_POSITION], "tokens": n[:_MAX_PER_POSITION]}


def _rank_in_top(top_ids: np.ndarray, tok: np.ndarray) -> np.ndarray:
    """1-based rank of each sampled token within a side's top-k; 0 where it is not in the top-k."""
    hit = top_ids == tok[:, None]
    return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, 0)


def topk(p: Paired) -> dict:
    """Top-1 disagreement and the sampled token's rank on each side, where both sides gave top-k."""
    if p.rollout_top is None or p.train_top is None:
        return {"topk_available": False}
    r_ids, t_ids = p.rollout_top[0], p.train_top[0]
    both = (r_ids[:, 0] >= 0) & (t_ids[:, 0] >= 0)
    out = {"topk_available": True, "topk_positions": int(both.sum())}
    if not both.any():
        return out
    out["top1_disagreement"] = float((r_ids[both, 0] != t_ids[both, 0]).mean())
    for name, ids in (("rollout", r_ids), ("train", t_ids)):
        rank = _rank_in_top(ids[both], p.token_ids[both])
        inside = rank > 0
        out[f"sampled_rank_mean_{name}"] = float(rank[inside].mean()) if inside.any() else None
        out[f"sampled_outside_topk_{name}"] = float((~inside).mean())
    return out


def _lagged(p: Paired, lag: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens i that have a partner i + lag in the same sequence, those partners' indices)."""
    seq = p.sequence_of_token()
    j = np.arange(p.tokens) + lag
    ok = (j >= 0) & (j < p.tokens)
    ok[ok] = seq[j[ok]] == seq[ok]
    return ok, j[ok]


def lag_fit(p: Paired, lags=(-1, 0, 1)) -> dict:
    """Mean |logp_train[i] - logp_rollout[i + lag]| inside each sequence, per lag: the trainer's
    log-probs fit the rollout's better one position off when logits rows and tokens are shifted."""
    out = {}
    for lag in lags:
        ok, j = _lagged(p, lag)
        a, b = p.train[ok], p.rollout[j]
        fin = np.isfinite(a) & np.isfinite(b)
        out[lag] = float(np.abs(a[fin] - b[fin]).mean()) if fin.any() else None
    return out


def topk_lag_overlap(p: Paired, lags=(-1, 0, 1)) -> dict:
    """Per lag: fraction of positions whose train top-1 at i is the rollout's top-1 at i + lag."""
    if p.rollout_top is None or p.train_top is None:
        return {}
    out = {}
    for lag in lags:
        ok, j = _lagged(p, lag)
        a, b = p.train_top[0][ok, 0], p.rollout_top[0][j, 0]
        out[lag] = float((a == b).mean()) if a.size else None
    return out
