"""The log-prob triage judgement: read both sides, pair them, measure, hold against the noise band,
list the patterns, decide the verdict and say what to dump next.

Verdicts: ``precision_noise`` (the pair stays inside the band and no pattern fired), ``likely_bug``
(a pattern of the closed list fired), ``undetermined`` (nothing comparable, too few tokens, or past
the band with no pattern that explains it). Never an all-clear on nothing compared.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import logprob_inputs, logprob_metrics, logprob_noise, logprob_pairing, logprob_patterns
from .logprob_noise import ALLOWED_PAST, NoiseBand
from .logprob_pairing import Paired

SCHEMA_VERSION = "1.1"   # 1.1: uniform_offset evidence gains tokens_past_band, tokens, chance_under_noise_at_most
MIN_TOKENS = 20
_WORST = 5
CONFIG_CMD = 'python3 "<skill_root>/scripts/make_dump_config.py" --out config.json --dump-path <dump dir>'
TOKENS_FILE = "next_dump_tokens.json"
# The dump scripts of the real-engine work: one generation on the worst sequence's prompt, and the
# trainer's forward on the same prompt + response.
DUMP_CMDS = ('python3 "<skill_root>/scripts/dump_vllm.py" --model <checkpoint folder> --prompt-ids <out-dir>/{f} '
             '--max-tokens {n} --task {task}{layers} --per-call --out <dump dir>',
             'python3 "<skill_root>/scripts/dump_trainer.py" --model <checkpoint folder> --tokens <dump dir>/tokens.json '
             '--task {task}{layers} --out <dump dir>')
ROOTCAUSE_CMD = ('python3 "<skill_root>/scripts/run_root_cause_analysis.py" --train <train dump> '
                 '--rollout <rollout dump> --out-dir <out> --rollout-logprobs {r} --train-logprobs {t}')


@dataclass
class Triage:
    """One pair's triage, ready for the JSON document."""

    verdict: str
    reason: str
    patterns: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    noise: dict = field(default_factory=dict)
    next_dump: list = field(default_factory=list)
    inputs: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    charts: dict = field(default_factory=dict)
    tokens: dict | None = None          # prompt and response ids of the sequence next_dump names


def _signature(v: logprob_patterns.View) -> dict:
    """What precision noise looks like, measured: symmetric, position-independent, growing with surprisal."""
    f = v.finite
    d = v.delta[f]
    if d.size < 3:
        return {}
    t = float(d.mean() / (d.std() / np.sqrt(d.size))) if d.std() > 0 else 0.0
    return {"mean_over_standard_error": round(t, 2),
            "spearman_position_vs_abs_diff": logprob_patterns.spearman(v.pos[f].astype(float), np.abs(d)),
            "spearman_surprisal_vs_abs_diff": logprob_patterns.spearman(-v.paired.rollout[f], np.abs(d)),
            "fraction_past_band": round(v.past_rate, 4), "allowed_fraction_past": ALLOWED_PAST}


def _worst(p: Paired, v: logprob_patterns.View, seq: dict) -> list[dict]:
    order = np.argsort(-np.nan_to_num(seq["mean_abs_diff"], nan=np.inf))[:_WORST]
    out = []
    for s in order:
        sl = slice(p.offsets[s], p.offsets[s + 1])
        out.append({"id": p.ids[s], "tokens": int(p.offsets[s + 1] - p.offsets[s]),
                    "mean_abs_diff": float(seq["mean_abs_diff"][s]), "max_abs_diff": float(seq["max_abs_diff"][s]),
                    "max_at_position": int(seq["max_at_position"][s]), "log_ratio": float(seq["log_ratio_all"][s]),
                    "positions_past_band": np.flatnonzero(v.past[sl])[:20].tolist()})
    return out


def _charts(p: Paired, v: logprob_patterns.View, worst: list[dict]) -> dict:
    """Numbers for report.html: |delta| per position of the worst sequences, the ratio histogram, the band."""
    where = {sid: i for i, sid in enumerate(p.ids)}
    series = []
    for w in worst[:3]:
        s = where[w["id"]]
        sl = slice(p.offsets[s], p.offsets[s + 1])
        series.append({"id": w["id"], "abs_diff": np.abs(np.nan_to_num(v.delta[sl], nan=0.0)).round(6).tolist(),
                       "band_limit": v.limit[sl].round(6).tolist()})
    d = v.delta[v.finite]
    edges = np.linspace(-2.0, 2.0, 41)                       # log ratio, clipped into the outer bins
    # bins and range, not the edges: numpy's equal-width path bins by arithmetic instead of sorting
    counts = np.histogram(np.clip(d, -2.0, 2.0), bins=40, range=(-2.0, 2.0))[0] if d.size else np.zeros(40, int)
    return {"worst_sequences": series, "log_ratio_histogram": {"edges": edges.round(3).tolist(),
                                                               "counts": counts.tolist()}}


def _next_dump(patterns: list, worst: list[dict], verdict: str, files: dict) -> list[dict]:
    """Per fired pattern: what to look at or dump, on which sequence and positions, with the commands."""
    rc = ROOTCAUSE_CMD.format(r=files["rollout"], t=files["train"])
    lengths = {w["id"]: w["tokens"] for w in worst}
    steps = []

    def where(pat: dict | None) -> dict:
        at = (pat or {}).get("where") or {}
        if at.get("sequence") is not None:     # the pattern names its own place (a change point, a mismatch)
            pos = at.get("position", at.get("from_position"))
            return {"sequence": at["sequence"], "positions": [] if pos is None else [pos]}
        return {"sequence": worst[0]["id"] if worst else None,
                "positions": worst[0]["positions_past_band"][:10] if worst else []}

    def look(pat, why):
        steps.append({"why": why, "msprobe_task": None, "layer_scope": None, **where(pat), "commands": []})

    def dump(pat, why, task, scope, cmds, layers=""):
        at = where(pat)
        extra = f" --layers {layers}" if layers else ""
        n = lengths.get(at["sequence"], "<response tokens>")
        cmds = [*cmds, *(c.format(f=TOKENS_FILE, n=n, task=task, layers=extra) for c in DUMP_CMDS)]
        steps.append({"why": why, "msprobe_task": task, "layer_scope": scope, **at, "commands": cmds})

    for pat in patterns:
        name = pat["name"]
        if name == "token_mismatch":
            look(pat, "token_mismatch: re-score the rollout's own response ids on the trainer first; no dump needed")
        elif name in ("position_shift", "sequence_end_gaps", "sparse_gaps"):
            look(pat, f"{name}: check the trainer's log-prob slicing and masks; no dump needed")
        elif name in ("temperature", "logit_scale", "top1_disagreement"):
            dump(pat, f"{name}: hold the dumped logits against both files (the root-cause run does this)", "tensor",
                 "layer 0 plus the model ends (final norm, lm_head, logits)",
                 [CONFIG_CMD + " --task tensor --layers 0", rc], layers="0")
        elif name in ("from_position", "prefill_decode_jump"):
            dump(pat, f"{name}: one msprobe step per forward call on this sequence, to find the first call that "
                      "departs", "statistics", "all layers", [CONFIG_CMD, rc])
        elif name == "grows_with_position":
            dump(pat, "grows_with_position: rotary embedding and attention of the first layers, long prompt",
                 "statistics", "layers 0-1 plus the model ends", [CONFIG_CMD + " --layers 0-1", rc], layers="0-1")
        elif name == "uniform_offset":
            dump(pat, "uniform_offset: module-level dump of both sides on this sequence; --model names the side",
                 "statistics", "all layers", [CONFIG_CMD, rc + " --model <checkpoint folder>"])
    if not steps and verdict == "undetermined" and worst:
        dump(None, "past the band with no listed pattern: measure your own band with --baseline (an early step, or "
                   "the same engine twice), then dump one sequence at module level", "statistics", "all layers",
             [CONFIG_CMD, rc])
    return steps


def judge(rollout: logprob_inputs.LogprobSide, train: logprob_inputs.LogprobSide, bounds: tuple[float, float],
          band: NoiseBand, notes: list[str]) -> Triage:
    """The triage of one pair against ``band``."""
    p = logprob_pairing.pair(rollout, train)
    inputs = {"rollout": {"path": rollout.path, "format": rollout.format, "sequences": rollout.sequences,
                          "tokens": rollout.tokens, **rollout.meta},
              "train": {"path": train.path, "format": train.format, "sequences": train.sequences,
                        "tokens": train.tokens, **train.meta},
              "paired_by": p.paired_by, "paired_sequences": len(p.ids), "paired_tokens": p.tokens,
              "rollout_only": list(p.rollout_only[:20]), "train_only": list(p.train_only[:20])}
    notes = [*notes, *rollout.notes, *train.notes]
    if p.rollout_only or p.train_only:
        notes.append(f"{len(p.rollout_only)} rollout and {len(p.train_only)} train sequences have no partner")
    v = logprob_patterns.View.of(p, band, {"rollout": rollout.meta, "train": train.meta})
    patterns = [x.as_dict() for x in logprob_patterns.detect(v)]
    seq = logprob_metrics.sequences(p, v.delta, v.finite)
    metrics = logprob_metrics.batch(p, bounds, seq) if p.tokens else {"tokens": 0}
    worst = _worst(p, v, seq) if p.tokens else []
    metrics["noise_signature"] = _signature(v) if p.tokens else {}
    metrics["worst_sequences"] = worst
    if p.tokens:
        per = logprob_metrics.per_position(p, v.delta, v.finite)
        metrics["per_position_mean_abs_diff"] = np.round(per["mean_abs_diff"], 8).tolist()
    if patterns:
        verdict, reason = "likely_bug", f"pattern {patterns[0]['name']}: " + patterns[0]["check"].split(":")[0]
    elif p.tokens == 0:
        verdict, reason = "undetermined", "no token could be compared (no sequence paired with the same token ids)"
    elif p.tokens < MIN_TOKENS:
        verdict, reason = "undetermined", f"only {p.tokens} paired tokens: too few to tell noise from a bug"
    elif v.past_rate <= ALLOWED_PAST:
        verdict, reason = "precision_noise", (f"{v.past_rate:.2%} of {p.tokens} tokens past the {band.precision} noise "
                                              f"band (allowed {ALLOWED_PAST:.0%}), no pattern of the list")
    else:
        verdict, reason = "undetermined", (f"{v.past_rate:.2%} of tokens past the {band.precision} band but no pattern "
                                           "of the list explains it; a band measured on CPU engines can be narrower "
                                           "than a GPU's: pass --baseline with a clean pair of your own")
    steps = _next_dump(patterns, worst, verdict, {"rollout": rollout.path, "train": train.path})
    return Triage(verdict=verdict, reason=reason, patterns=patterns, metrics=metrics, noise=band.as_dict(),
                  next_dump=steps, inputs=inputs, notes=notes, charts=_charts(p, v, worst) if p.tokens else {},
                  tokens=_tokens(rollout, steps[0]["sequence"]) if steps and steps[0]["sequence"] else None)


def _tokens(side: logprob_inputs.LogprobSide, sid: str) -> dict | None:
    """``{"prompt_ids", "response_ids"}`` of one sequence, where the side gave its prompt."""
    i = side.ids.index(sid) if sid in side.ids else None
    if i is None or side.prompt_ids is None or side.prompt_ids[i] is None:
        return None
    resp = side.token_ids[side.offsets[i]:side.offsets[i + 1]]
    return {"id": sid, "prompt_ids": list(side.prompt_ids[i]), "response_ids": resp.tolist()}


def band_for(rollout, train, dtype: str | None, baseline, notes: list[str]) -> NoiseBand:
    """The band this pair is judged against: the user's baseline pair, else the committed one."""
    precision, note = logprob_noise.precision_of(rollout.meta, train.meta, dtype)
    if baseline is not None:
        br, bt = baseline
        bp = logprob_pairing.pair(br, bt)
        if bp.tokens < MIN_TOKENS:
            raise logprob_inputs.LogprobInputError(f"{br.path}: the baseline pair has only {bp.tokens} paired tokens")
        return logprob_noise.from_baseline(bp, precision, f"baseline {br.path} + {bt.path}")
    if note:
        notes.append(note)
    return logprob_noise.committed(precision)


def step_table(triages: list[Triage]) -> list[dict]:
    """One row per step (pair of files): where a mismatch starts across steps."""
    rows = []
    for i, t in enumerate(triages):
        m = t.metrics
        rows.append({"step": i, "rollout": t.inputs["rollout"]["path"], "train": t.inputs["train"]["path"],
                     "verdict": t.verdict, "patterns": [p["name"] for p in t.patterns], "tokens": m.get("tokens"),
                     "log_prob_abs_diff_mean": m.get("log_prob_abs_diff_mean"),
                     "log_prob_abs_diff_p99": m.get("log_prob_abs_diff_p99"), "kl": m.get("kl"),
                     "k3_kl": m.get("k3_kl"), "rollout_is_ratio_fraction_high": m.get("rollout_is_ratio_fraction_high"),
                     "fraction_past_band": (m.get("noise_signature") or {}).get("fraction_past_band")})
    return rows
