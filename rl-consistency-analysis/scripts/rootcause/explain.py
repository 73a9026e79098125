"""What output_5 carries besides the triage: the sides, each cause's numbers, the hypotheses the
numbers already refute, and a glossary of the point names and fields the report uses (its words
for point names are the ones output_4 publishes).

Everything here is read from output_1..4, so an agent can write the report from output_5 alone
(references/report_template.md); the reasons are in references/analysis_rules.md.
"""
from __future__ import annotations

import math
import re
from collections import Counter

from . import sibling
from .evidence import Evidence, Vocabulary

_STEP = re.compile(r"^step[_-]?(\d+)$")
_RANK = re.compile(r"^(rank|proc)[_-]?\d+$")


def sides(ev: Evidence) -> dict:
    """Per side: engine family, resolved dump files, steps, ranks, dump level/task and main dtype."""
    is_int = sibling.load_dtypes(sibling.SKILL_ROOT).is_int_dtype
    out = {}
    for side in ("train", "rollout"):
        src = (ev.sources or {}).get(side) or {}
        files = src.get("files") or ([src["path"]] if src.get("path") else [])
        # output_1 2.0 names the steps and ranks read (the input plan); older outputs only the path.
        steps = src.get("steps") or sorted({p for f in files for p in f.replace("\\", "/").split("/")
                                            if _STEP.match(p)})
        dtypes = Counter(d.replace("torch.", "") for r in ev.results.values()
                         for d in (r[side].get("dtypes") or []) if d and not is_int(d))
        out[side] = {
            "family": src.get("family"), "files": files, "steps": steps,
            "ranks": src.get("ranks") or sorted({p for f in files for p in f.split("/") if _RANK.match(p)}),
            "rank_layout": (src.get("rank_layout") or {}).get("kind"),
            "level": src.get("level"), "task": src.get("task"), "framework": src.get("framework"),
            "dtype": dtypes.most_common(1)[0][0] if dtypes else None,
            "dtypes": dict(dtypes), "partial": bool(src.get("partial")),
        }
    return out


def _worst(ev: Evidence, m: dict, io: str) -> dict | None:
    """The point of one side of a module (in/param/out) with the largest error, with its tolerance."""
    best = None
    for p in m["points"][io]:
        r = ev.results.get(p.get("cid"))
        if r is None or not isinstance(r.get("error"), (int, float)):
            continue
        if best is None or _key(r["error"]) > _key(best["error"]):
            best = {"point": p["point"], "status": r["status"], "error": r["error"],
                    "tolerance": r.get("tolerance"), "margin": p.get("margin"),
                    "dtypes": [r["train"]["dtypes"][0], r["rollout"]["dtypes"][0]]}
    return best


def _key(x: float) -> float:
    return math.inf if math.isnan(x) else x


def numbers(ev: Evidence, pid: str) -> dict:
    """Input, parameter and output error of one module pair, each with its tolerance (or null)."""
    m = ev.modules[ev.pos[pid]] if pid in ev.pos else None
    if m is None:
        return {"input": None, "parameter": None, "output": None, "amplification": None}
    return {"input": _worst(ev, m, "in"), "parameter": _worst(ev, m, "param"), "output": _worst(ev, m, "out"),
            "amplification": m.get("amplification")}


def _within(x: dict | None, vocab: Vocabulary) -> bool:
    return x is not None and x["status"] in vocab.clean and isinstance(x.get("tolerance"), (int, float))


def refuted(f: dict, nums: dict, reaches_output: bool | None, vocab: Vocabulary) -> list[dict]:
    """Hypotheses the numbers alone already rule out for one finding, each with the reason
    (``vocab``: output_4's, for which statuses agree and which differ)."""
    out = []
    inp, par, res = nums["input"], nums["parameter"], nums["output"]
    if _within(inp, vocab):
        out.append({"hypothesis": "the divergence is carried in from an earlier module",
                    "because": f"its input {inp['point']} agrees (error {inp['error']:.3g} <= tolerance "
                               f"{inp['tolerance']:.3g})"})
    # Statistics (and a multiset) of a fused weight cannot show the order of its rows: agreeing
    # parameters refute nothing when the finding is a row order under a split.
    order_blind = bool((f.get("evidence") or {}).get("split_boundary")
                       or (f.get("evidence") or {}).get("permuted_fused_rows"))
    if _within(par, vocab) and not order_blind:
        out.append({"hypothesis": "a weight or checkpoint difference in this module",
                    "because": f"its parameters agree (worst {par['point']}: error {par['error']:.3g} <= "
                               f"tolerance {par['tolerance']:.3g})"})
    worst = max((x for x in (par, res) if x and x["status"] in vocab.diverged), key=lambda x: _key(x["error"]),
                default=None)
    if worst is not None and worst["dtypes"][0] == worst["dtypes"][1] and worst.get("tolerance"):
        out.append({"hypothesis": "rounding noise of the dtype",
                    "because": f"both sides hold {worst['point']} in {worst['dtypes'][0]} and its error "
                               f"{worst['error']:.3g} is {_key(worst['error']) / worst['tolerance']:.3g} times "
                               f"that dtype's tolerance"})
    if reaches_output and f.get("category") != "upstream_propagation":
        out.append({"hypothesis": "a layout (structural) difference with no effect on the result",
                    "because": "the model's final output (logits or final norm) differs as well"})
    return out


FIELDS = {
    "error": "statistics mode: the largest relative difference of Max/Min/Mean/Norm (scaled_error), or with one "
             "side a token more the largest scaled excess over a bound; tensor "
             "mode: relative L2 error ||rollout - train|| / ||train||",
    "tolerance": "the error a clean pair of these dtypes may show (the looser dtype of the two sides)",
    "margin": "error / tolerance: above 1 the tensor is beyond tolerance",
    "amplification": "(amp) output error / input error of a module: how much it magnifies what it receives",
    "status": "match (within the strict tolerance), drift (between strict and pair tolerance), mismatch, "
              "nonfinite (NaN/Inf on one side), bounded (one side holds a token more and every bound of the "
              "statistics holds: consistent, not verified), structural (different layout), incomparable",
    "confidence": "how much the dumps support the finding, 0.01-0.99, with its credence word",
    "side": "the side implicated, or undetermined with side_reason",
    "clean_level": "log-prob view: the largest log-prob change logits within their element tolerance can cause",
}


def point_meaning(point: str, vocab: Vocabulary) -> str:
    """Plain words for a point name such as ``L2.gate+L2.up`` or ``L1.down.weight``, from its form
    and the words of its names that output_4 publishes (``vocabulary.points``, ``point_words``)."""
    parts = vocab.form(point)["parts"]
    text = " joined with ".join(_one(p, vocab.point_words) for p in parts)
    if len(parts) > 1:
        text += " (a fused tensor on one side, compared with its parts concatenated in this order)"
    return text


def _one(part: dict, words: dict) -> str:
    """One part of a point in words: its scope, what its name stands for, the parameter and call."""
    if part["scope"] is None:
        return part["point"]
    scope = f"layer {part['layer']}" if part["scope"] == "layer" else "model"
    what = words.get(part["name"], part["name"])
    if part["parameter"]:
        what = f"{part['parameter']} of the {what.replace(' output', '')}"
    return f"{scope}: {what}" + (f" (call {part['call']})" if part["call"] is not None else "")


def rank_meaning(rank_meanings: dict | None) -> str:
    """The glossary line for module_priority_rank, from output_4 ``rank_meanings`` (the compare
    skill owns what the ranks mean)."""
    if not isinstance(rank_meanings, dict) or not rank_meanings:
        return "see output_4 and the compare skill's references/priority_rank.md (this output_4 does not state it)"
    return "; ".join(f"{k} {v}" for k, v in sorted(rank_meanings.items(), key=lambda kv: str(kv[0])))


def _scoped(point: str, vocab: Vocabulary) -> bool:
    """Whether output_4 publishes ``point`` inside a layer or at model level (a name to explain)."""
    form = vocab.form(point)
    return form is not None and form["parts"][0]["scope"] is not None


def glossary(doc: dict, vocab: Vocabulary, rank_meanings: dict | None = None) -> dict:
    """Every point name output_5 mentions, in words, and the fields it uses (``vocab`` and
    ``rank_meanings``: output_4's). A point counts when output_4 publishes its form with a scope."""
    points: set[str] = set()

    def walk(obj, key=None):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, k)
        elif isinstance(obj, list):
            for v in obj:
                walk(v, key)
        elif isinstance(obj, str) and key in ("point", "differing_points", "differing_parameters") \
                and _scoped(obj, vocab):
            points.add(obj)
    walk(doc)
    return {"points": {p: point_meaning(p, vocab) for p in sorted(points)},
            "fields": {**FIELDS, "module_priority_rank": rank_meaning(rank_meanings)}}
