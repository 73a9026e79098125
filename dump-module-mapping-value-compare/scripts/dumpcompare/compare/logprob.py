"""Per-token log-probabilities of the dumped tokens, from both sides' logits (tensor mode).

Row ``i`` of the logits predicts token ``i + 1`` of the ids, so position ``p`` (``p >= 1``) gets
``logits[p-1, ids[p]] - logsumexp(logits[p-1])`` on each side. The clean level of a position is the
largest log-prob change that logits all within their element tolerance (``atol + rtol * |z|``)
could cause: ``tol(z_y) + sum_i softmax(z)_i * tol(z_i)``, since d logp_y = dz_y - sum_i p_i dz_i.
A position past that level cannot be explained by the dtype alone (references/tolerances.md).

Each side's log-prob is the raw log-softmax of its dumped logits: an RL trainer divides the logits by
the job's temperature before its log-softmax and vLLM returns the log-probs of its logits processor
output (``logprobs_mode``), but both dumps hold the logits before any temperature, so the raw
log-softmax is what compares on both sides. With ``--logprob-temperature T`` each token also gets
its log-prob at T (log-softmax of logits / T), so that the root-cause skill can test whether the
log-prob files a job wrote are these logits at the job's temperature.

The clean level is an analytic bound published as a note; whether the differences are precision
noise is the root-cause skill's verdict, against the noise band it measured on real engines.
"""
from __future__ import annotations

import numpy as np

from .tensors import compact

LOGITS_POINT = "M.logits"
TOKENS_POINT = "M.tokens"


def _logsumexp(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=1)
    return top + np.log(np.exp(z - top[:, None]).sum(axis=1))


class LogProbs:
    """Accumulates log-prob differences block by block over [tokens, vocab] logits rows."""

    def __init__(self, ids: np.ndarray, rtol: float, atol: float, prompt_tokens: int | None,
                 temperature: float | None = None):
        self.ids, self.rtol, self.atol = ids, rtol, atol
        self.prompt_tokens = prompt_tokens
        self.temperature = temperature
        self.pos: list[np.ndarray] = []
        self.lp: list[tuple[np.ndarray, np.ndarray]] = []
        self.lp_at: list[tuple[np.ndarray, np.ndarray]] = []     # at self.temperature
        self.bound: list[np.ndarray] = []
        self.usable = True

    def add(self, t: np.ndarray, r: np.ndarray, row0: int) -> None:
        """Fold in logits rows ``row0 ..`` of both sides (float64, same shape, all finite)."""
        if t.ndim != 2 or t.shape != r.shape or not np.isfinite(t).all() or not np.isfinite(r).all():
            self.usable = False
            return
        pos = np.arange(row0 + 1, row0 + 1 + t.shape[0])
        keep = pos < self.ids.size
        if not keep.any():
            return
        pos, t, r = pos[keep], t[keep], r[keep]
        labels = self.ids[pos]
        if labels.min() < 0 or labels.max() >= t.shape[1]:
            self.usable = False
            return
        rows = np.arange(t.shape[0])
        lse_t, lse_r = _logsumexp(t), _logsumexp(r)
        tol = self.atol + self.rtol * np.abs(t)
        p = np.exp(t - lse_t[:, None])
        self.pos.append(pos)
        self.lp.append((t[rows, labels] - lse_t, r[rows, labels] - lse_r))
        if self.temperature is not None:
            k = 1.0 / self.temperature
            self.lp_at.append((k * t[rows, labels] - _logsumexp(k * t), k * r[rows, labels] - _logsumexp(k * r)))
        self.bound.append(tol[rows, labels] + np.einsum("ij,ij->i", p, tol))

    def result(self) -> dict | None:
        """The per-position view written to output_3, or None when it could not be computed."""
        if not self.usable or not self.pos:
            return None
        pos = np.concatenate(self.pos)
        lp_t = np.concatenate([a for a, _ in self.lp])
        lp_r = np.concatenate([b for _, b in self.lp])
        diff = lp_r - lp_t
        ad, bound = np.abs(diff), np.concatenate(self.bound)
        bad = np.flatnonzero(ad > bound)
        half = ad.size // 2
        out = {
            "positions": int(pos.size), "first_position": int(pos[0]),
            "mean_abs_diff": float(ad.mean()), "max_abs_diff": float(ad.max()),
            "max_at_position": int(pos[int(np.argmax(ad))]),
            "sequence_logprob_diff": float(diff.sum()),
            "clean_level_median": float(np.median(bound)), "clean_level_max": float(bound.max()),
            "positions_past_clean_level": int(bad.size),
            "first_position_past_clean_level": int(pos[bad[0]]) if bad.size else None,
            "first_half_mean_abs_diff": float(ad[:half].mean()) if half else None,
            "second_half_mean_abs_diff": float(ad[half:].mean()) if half else None,
            "prompt_tokens": self.prompt_tokens,
            "abs_diff": compact(ad), "clean_level": compact(bound),
            "tokens": self._tokens(pos, lp_t, lp_r),
            "temperature": self.temperature,
        }
        if self.prompt_tokens:
            prompt = pos < self.prompt_tokens
            for name, sel in (("prompt", prompt), ("response", ~prompt)):
                out[f"{name}_mean_abs_diff"] = float(ad[sel].mean()) if sel.any() else None
        return out


    def _tokens(self, pos: np.ndarray, lp_t: np.ndarray, lp_r: np.ndarray) -> list[dict]:
        """Per response token: the position of the logits row that scored it (the token itself sits
        at ``position + 1``), its id and both log-probs, ``delta = train - rollout`` (the log of the
        importance ratio), and with a temperature both log-probs at it. Every scored position when
        the prompt length is unknown."""
        keep = pos >= self.prompt_tokens if self.prompt_tokens else np.ones(pos.size, bool)
        out = [{"position": int(p - 1), "token_id": int(self.ids[p]), "train": float(t), "rollout": float(r),
                "delta": float(t - r)} for p, t, r in zip(pos[keep], lp_t[keep], lp_r[keep])]
        if self.lp_at:
            at_t = np.concatenate([a for a, _ in self.lp_at])[keep]
            at_r = np.concatenate([b for _, b in self.lp_at])[keep]
            for rec, a, b in zip(out, at_t, at_r):
                rec["train_at_temperature"], rec["rollout_at_temperature"] = float(a), float(b)
        return out


def token_ids(*sides: np.ndarray | None) -> np.ndarray | None:
    """The whole token sequence as int64: the longest of ``sides`` when every other one is a prefix
    of it (a trainer that scored the last sampled token holds one id more than the engine fed; the
    user's ``--token-ids`` hold them all), else None (the sides saw different tokens)."""
    seqs = [np.asarray(s).reshape(-1) for s in sides if s is not None]
    if not seqs or not all(np.all(np.isfinite(s)) for s in seqs):
        return None
    full = max(seqs, key=lambda s: s.size)
    if not all(np.array_equal(s, full[:s.size]) for s in seqs):
        return None
    return full.astype(np.int64)
