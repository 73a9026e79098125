"""Mixture-of-experts routing evidence: what the compare step's routing replay (output_3
``replays``, op ``routing_compare``) says about a pair.

A top-k set that differs only at near-ties of the logits is a routing flip: rounding, never a
cause of its own. Routing that differs in the weights or in sets far from a tie is systematic (a
renormalisation, a scoring function, a bias). Why: references/analysis_rules.md ("Mixture of
experts").
"""
from __future__ import annotations

from .evidence import Evidence

PRECISION_VERDICTS = ("same", "flips_only")


def _within(paths: list[str], path: str | None) -> bool:
    """``path`` is one of ``paths`` or inside one of them (the MoE block holding the experts)."""
    return path is not None and any(path == p or path.startswith(p + ".") for p in paths)


def routing_record(ev: Evidence, train_modules: list[str], rollout_modules: list[str]) -> dict | None:
    """The routing comparison of the layer whose experts (or MoE block) these modules are."""
    for r in ev.compare.get("replays") or []:
        if r.get("op") == "routing_compare" and (_within(train_modules, r["train_module"])
                                                 or _within(rollout_modules, r["rollout_module"])):
            return r
    return None


def flip_reason(rec: dict) -> str:
    """Why a pair whose routing only flipped at near-ties is set aside."""
    werr = rec.get("weights_rel_error")
    weights = (f"with the same weights (relative error {werr:.2g})" if werr is not None else
               "(the weights are not in the dump: one side shows only its router's logits)")
    return (f"routing flip: {rec['flips']} of {rec['tokens']} tokens chose another top-{rec['top_k']} set where "
            f"the router logits are within precision of a tie; every other token routes the same {weights}, so "
            f"the experts' difference is rounding")


def routing_summary(rec: dict) -> dict:
    """The numbers of a routing comparison a finding carries as evidence."""
    return {k: rec.get(k) for k in ("layer", "tokens", "top_k", "set_differs", "flips", "systematic_sets", "from_logits",
                                    "weights_rel_error", "weights_tolerance", "verdict",
                                    "differing_keys")}


def precision_note(ev: Evidence) -> str | None:
    """A note when the first divergence is a mixture-of-experts output whose routing the replay
    found the same on both sides (or flipped only at near-ties) and no layer routes differently:
    the experts' accumulation order and rounding, not a cause. None otherwise."""
    recs = [r for r in ev.compare.get("replays") or [] if r.get("op") == "routing_compare"]
    first = ev.analysis.get("first_divergence") or {}
    if not recs or any(r["verdict"] not in PRECISION_VERDICTS for r in recs):
        return None
    rec = routing_record(ev, first.get("train_modules") or [], first.get("rollout_modules") or [])
    if rec is None:
        return None
    flips = sum(r["flips"] for r in recs)
    tokens = sum(r["tokens"] for r in recs)
    return (f"the first divergence is the mixture-of-experts output of layer {rec['layer']}, where routing "
            f"replayed from each side's router logits picks the same experts with the same weights"
            + (f" except {flips} of {tokens} token-layers that flip at near-ties" if flips else "")
            + ": the experts differ by how they accumulate and round, within the dtype's precision")


def replayed_experts(ev: Evidence, side: str, dep: dict) -> str | None:
    """A note when ``side`` leaves the reference forward at a layer whose experts' output the
    routing replay rebuilt from that side's own input and router logits with the checkpoint's
    experts (output_3 routing records with ``expert_weights: "checkpoint"``) at the reference's
    routing config: the experts compute the checkpoint's function there, so the departure is what
    the forward carried into them (the reference runs its own stream, and bf16 drift or a near-tie
    of another token can move an experts' output past the tolerance), not a cause. None otherwise."""
    if not str(dep.get("point") or "").endswith("experts_out") or dep.get("layer") is None:
        return None
    recs = [r for r in ev.compare.get("replays") or [] if r.get("op") == "routing" and r.get("side") == side
            and r.get("layer") == dep["layer"] and r.get("expert_weights") == "checkpoint"]
    if not recs or not all(r.get("reproduces_reference") is True for r in recs):
        return None
    worst = max(r["residual_at_reference"] for r in recs)
    return (f"the {side} side leaves the reference forward at {dep['point']} (error {dep['error']:.3g}), but its "
            f"experts' output there is rebuilt from its own input and router logits by the checkpoint's experts "
            f"at the checkpoint's routing config (residual {worst:.2g}): the experts compute what the checkpoint "
            f"says, and the departure is carried in, not made there")
