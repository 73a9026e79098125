"""Whether the checkpoint given with --model is the one these dumps ran (output_4 ``reference_fit``).

Everything held against the checkpoint (each side's parameters, the reference forward) says which
side is wrong only if the checkpoint is the model both engines loaded. Another model of the same
shapes, a checkpoint saved at another step, another size or another family differs from both
sides everywhere, and a side named from it is noise. So, before its evidence is used, the fit is
judged from the compare step's own data (output_3 ``reference`` of every parameter):

- per side, each parameter the checkpoint judged (``matches_reference`` true or false) counts as
  matching or differing; one whose side tensor holds no element (vLLM's CPU build prepacks linear
  weights into empty ``[0]`` tensors) is ``not_visible`` and judged by nothing but its name;
  a visible parameter the checkpoint has no tensor for (``names``) or whose shape fits no layout
  of the checkpoint's tensor (``shapes``: another hidden, intermediate or vocabulary size) is a
  misfit; and a dumped layer beyond the config's ``num_hidden_layers`` is one too;
- a side fits when at least one of its visible parameters matches, the differing ones and misfits
  together are no more than ``max(FEW, SHARE x judged)`` and fewer than the matching ones: a stale
  tensor or two (the faults this skill looks for) leave a side fitting, a checkpoint of another
  model or step (every tensor differs) does not;
- ``fits`` is true when at least one side fits, false when a side was judged and none fits,
  ``unknown`` when no parameter was judged (dumps without parameters): then nothing changes.

Why: rl-consistency-analysis/references/deciding_the_side.md ("A checkpoint that fits neither side").
"""
from __future__ import annotations

import math

SIDES = ("train", "rollout")
# A side fits with at most max(FEW, SHARE x judged) of its parameters differing or misfitting.
FEW = 2
SHARE = 0.1
NEITHER = "this checkpoint matches neither side: another model, or saved at another step"


def _visible(leaves) -> bool:
    """The side's parameter holds elements (vLLM CPU's prepacked linear weights are ``[0]``)."""
    return not all(lf.shape is not None and math.prod(lf.shape) == 0 for lf in leaves)


def _side_counts() -> dict:
    return {"judged": 0, "matching": 0, "differing": 0, "not_visible": 0, "unknown": 0,
            "misfits": {"names": [], "shapes": [], "layers": []}}


def _limit(judged: int) -> int:
    return max(FEW, int(SHARE * judged))


def _side_fits(c: dict) -> bool | None:
    bad = c["differing"] + sum(len(v) for v in c["misfits"].values())
    if not c["judged"] and not bad:
        return None
    return c["matching"] >= 1 and bad <= _limit(c["judged"] + bad) and bad < c["matching"]


def _extra(held: set[str], points: dict) -> list[str]:
    """Checkpoint parameters of a module the side holds other parameters of, absent from the side
    (a bias of another family's attention, say)."""
    modules = {p.rpartition(".")[0] for p in held}
    return sorted(a for p in points for a in p.split("+")
                  if a.rpartition(".")[0] in modules and a not in held)


def judge(results, plans, views: dict, recs: dict, refs: dict) -> dict | None:
    """The ``reference_fit`` section; None without --model."""
    if not any(refs.get(s) for s in SIDES):
        return None
    by_cid = {p.cid: p for p in plans}
    sides = {}
    for s in SIDES:
        if refs.get(s) is None:
            continue
        c = sides[s] = _side_counts()
        for res in results:
            rec = (res.reference or {}).get(s)
            plan = by_cid.get(res.cid)
            if rec is None or plan is None:
                continue
            view = views[s]
            leaves = [view.leaves[k.rec].get(k.leaf) for k in getattr(plan, s)]
            value = rec.get("matches_reference")
            if value is True:
                c["judged"] += 1
                c["matching"] += 1
            elif value is False:
                c["judged"] += 1
                c["differing"] += 1
            elif None in leaves or not _visible(leaves):
                c["not_visible"] += 1
            elif not rec.get("checkpoint_tensors"):
                c["misfits"]["names"].append(res.point)
            elif rec.get("how") is None:
                c["misfits"]["shapes"].append(res.point)
            else:
                c["unknown"] += 1
        held = {a for res in results if (res.reference or {}).get(s) is not None for a in res.point.split("+")}
        c["misfits"]["names"] += _extra(held, refs[s].points)
        layers = refs[s].config.get("num_hidden_layers")
        if isinstance(layers, int):
            beyond = sorted({r.layer for r in recs.get(s) or () if r.layer is not None and r.layer >= layers})
            c["misfits"]["layers"] = [f"layer {n}" for n in beyond]
        c["fits"] = _side_fits(c)
    return _decide(sides)


def _decide(sides: dict) -> dict:
    fits = [s for s, c in sides.items() if c["fits"] is True]
    judged = [s for s, c in sides.items() if c["fits"] is not None]
    if fits:
        verdict, reason = True, (f"{' and '.join(fits)} match{'es' if len(fits) == 1 else ''} the checkpoint "
                                 + "; ".join(_counts(s, sides[s]) for s in fits))
    elif judged:
        verdict, reason = False, NEITHER + " (" + "; ".join(_counts(s, sides[s]) for s in judged) + ")"
    else:
        verdict, reason = "unknown", "no parameter of either side was held against the checkpoint"
    return {"fits": verdict, "reason": reason, "sides": sides,
            "rule": {"few": FEW, "share": SHARE,
                     "meaning": "a side fits when at least one visible parameter matches and the differing ones "
                                "and misfits together are at most max(few, share x judged) and fewer than the "
                                "matching ones; the checkpoint fits when one side does"}}


def _counts(side: str, c: dict) -> str:
    mis = {k: v for k, v in c["misfits"].items() if v}
    text = f"{side}: {c['matching']} of {c['judged']} visible parameters match"
    if c["not_visible"]:
        text += f", {c['not_visible']} not visible"
    for k, v in mis.items():
        text += f", {len(v)} misfit by {k} (first {v[0]})"
    return text


def withhold_verdict(forward: dict | None, fit: dict | None) -> dict | None:
    """The reference forward, naming no side from a checkpoint that fits neither (its verdict says why)."""
    if forward is not None and fit is not None and fit["fits"] is False:
        return {**forward, "verdict": {"side": "undetermined", "reason": NEITHER, "checkpoint_fits": False}}
    return forward
