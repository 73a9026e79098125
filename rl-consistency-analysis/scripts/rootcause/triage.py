"""Deterministic triage: candidates -> structural screen -> boundary inspection -> category.

The rules are a table in rules.py (condition, category, base score, adjustments) with their
reasons in references/analysis_rules.md; this module computes the facts their conditions read
(``Suspect``) and, for the row that fired, the evidence and what the dumps alone say about the
side (``sides.Structural``; sides.py decides the side).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property

from . import credence, departures, hypotheses, moe, rules, sibling, sides
from .evidence import Evidence

FUSED_KINDS = ("composite", "by_design_difference", "cross_role")
FULL_DTYPES = {"float32", "float64"}
PRECISION_SPREAD = 0.5       # share of compared tensors with differing dtypes that means "a whole side"
REALIGN_WINDOW = 3           # aligned modules after a suspect that are checked for realignment
# The note of a run whose activations were all only bounded (the compare skill's bounds.py).
ONLY_BOUNDED = ("consistent, not verified: one side holds one token more (the last sampled token, never fed to "
                "the engine), so the statistics only bound each other and every bound holds; this is not an "
                "all-clear. To decide it, rerun with --model <checkpoint> --token-ids <ids> (a reference forward "
                "over the same tokens) or dump both sides in tensor mode")


@dataclass
class Triage:
    """What the triage concluded (turned into output_5 by report.py)."""
    verdict: str
    root_causes: list[dict] = field(default_factory=list)
    other_candidates: list[dict] = field(default_factory=list)
    suppressed: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    precision: dict = field(default_factory=dict)


def candidates(ev: Evidence) -> list[dict]:
    """Rule 1: module_priority_rank 1 and 2, in execution order (all of them, not the first)."""
    return [m for m in ev.modules if m["module_priority_rank"] in (1, 2)]


def _path_names(paths: list[str]):
    if not paths:
        return None
    return paths[0] if len(paths) == 1 else list(paths)


def _named(m: dict) -> dict:
    """The names a finding or record gives the modules of output_4 pair ``m``."""
    return {"train_module": _path_names(m["train_modules"]), "rollout_module": _path_names(m["rollout_modules"])}


def _results(ev: Evidence, m: dict, io: str) -> list[dict]:
    return [ev.results[p["cid"]] for p in m["points"][io] if p.get("cid") in ev.results]


def _diverged_calls(ev: Evidence, m: dict) -> dict | None:
    """For modules called repeatedly (folded calls): per diverged point, which calls diverged."""
    out = {}
    for io in ("in", "param", "out"):
        for p in m["points"][io]:
            calls = (ev.results.get(p.get("cid")) or {}).get("calls")
            if calls and p["status"] in ev.vocab.diverged:
                counts = calls.get("counts", {})
                out[p["point"]] = {"compared": calls.get("compared"), "first_diverged": calls.get("first_diverged"),
                                   "diverged": sum(counts.get(st, 0) for st in ev.vocab.diverged)}
    return out or None


def realigns(ev: Evidence, m: dict) -> bool:
    """Rule 5: the next aligned modules after a suspect agree again."""
    i = ev.pos[m["pid"]]
    later = [x for x in ev.modules[i + 1:] if not x["is_container"] and x["output_status"] in ev.vocab.graded]
    window = later[:REALIGN_WINDOW]
    return bool(window) and all(x["output_status"] in ev.vocab.clean for x in window)


def reaches_output(ev: Evidence) -> bool | None:
    """Whether the model's final output (logits or final norm) differs."""
    heads = [x for x in ev.modules if x["role"] in ("lm_head", "logits", "final_norm")
             and x["output_status"] in ev.vocab.graded]
    return None if not heads else heads[-1]["output_status"] in ev.vocab.diverged


def _lower_precision_side(ev: Evidence, m: dict) -> str | None:
    """The side whose output dtype is the less precise one, by the compare skill's published order
    (output_4 ``vocabulary.dtype_precision``); None when the outputs' dtypes rank alike."""
    key = sibling.load_dtypes(sibling.SKILL_ROOT).dtype_key
    for r in _results(ev, m, "out"):
        if r.get("dtype_differs"):
            t, ro = (ev.vocab.precision(key((r[side]["dtypes"] or [None])[0])) for side in ("train", "rollout"))
            if t != ro:
                return "train" if t < ro else "rollout"
    return None


def _fused_side(m: dict) -> str | None:
    if len(m["rollout_modules"]) == 1 and len(m["train_modules"]) > 1:
        return "rollout"
    if len(m["train_modules"]) == 1 and len(m["rollout_modules"]) > 1:
        return "train"
    return None


def _permuted_parts(ev: Evidence, m: dict) -> bool:
    """Reverse trap: the fused output's statistics agree, a part seen by a consumer does not."""
    if m["kind"] != "composite":
        return False
    outs = m["points"]["out"]
    fused = {p["point"]: len(ev.vocab.parts(p["point"])) > 1 for p in outs}
    whole = [p for p in outs if fused[p["point"]] and p["status"] in ev.vocab.clean]
    parts = [p for p in outs if not fused[p["point"]] and p["status"] in ev.vocab.diverged]
    return bool(whole) and bool(parts)


def _multiset_equal(ev: Evidence, m: dict) -> bool:
    return any((r.get("tensor_metrics") or {}).get("multiset_equal") for r in _results(ev, m, "param"))


def _scaled_copy(r: dict) -> bool:
    """One side's output is the other's times a constant: cosine near 1 (tensor mode), or the same
    ratio, within the comparison's tolerance (the dtype's rounding), for every non-zero statistic."""
    cos = (r.get("tensor_metrics") or {}).get("cosine")
    if isinstance(cos, (int, float)):
        return cos >= rules.SCALE_COSINE
    t, ro = (r.get("train") or {}).get("stats") or {}, (r.get("rollout") or {}).get("stats") or {}
    ratios = [t[k] / ro[k] for k in ("max", "min", "mean", "norm")
              if isinstance(t.get(k), (int, float)) and isinstance(ro.get(k), (int, float)) and ro[k] and t[k]]
    spread = r.get("tolerance") if isinstance(r.get("tolerance"), (int, float)) else 0.0
    return len(ratios) >= 3 and max(ratios) - min(ratios) <= spread * abs(max(ratios))


def _mini(m: dict | None) -> dict | None:
    if m is None:
        return None
    return {"pair": m["pid"], **_named(m), "role": m["role"],
            "output_status": m["output_status"]}


def _one_sided_view(o: dict) -> dict:
    return {"side": o["side"], "module": o["module"], "class": o["class"], "expected": o["expected"],
            "activation_like": o["activation_like"], "reason": o["reason"],
            "pass_through": _pass_through_words(o["pass_through"]), "point_status": o["points"]}


class Suspect:
    """The facts of one candidate pair that the rules in rules.py read (computed once, lazily)."""

    def __init__(self, ev: Evidence, m: dict):
        self.ev, self.m = ev, m
        self.rule: str | None = None       # id of the category rule that classified it

    @property
    def prev(self) -> dict | None:
        """The aligned boundary before the suspect (output_4 ``previous_aligned``)."""
        return self.ev.pair(self.m["previous_aligned"])

    @cached_property
    def permuted(self) -> bool:
        return _permuted_parts(self.ev, self.m)

    @cached_property
    def routing(self) -> dict | None:
        """The routing comparison of this mixture-of-experts pair (moe.py), None for other pairs."""
        return moe.routing_record(self.ev, self.m["train_modules"], self.m["rollout_modules"])

    @property
    def parameters_differ(self) -> bool:
        return self.m["status"] == "parameter_mismatch" or self.permuted

    @property
    def precision_origin(self) -> bool:
        return bool(self.m["dtype_boundary"]) and self.m["status"] == "origin"

    @cached_property
    def op_before_observer(self) -> dict | None:
        return _op_before_observer(self.ev, self.m)

    @property
    def origin(self) -> bool:
        return self.m["status"] == "origin" and not self.m["is_container"]

    @property
    def first_compared(self) -> bool:
        """No pair before it in execution order has an output that was compared and agrees."""
        i = self.ev.pos[self.m["pid"]]
        return not any(x["output_status"] in self.ev.vocab.clean for x in self.ev.modules[:i])

    @property
    def parameters_unobserved(self) -> bool:
        return self.m["parameter_status"] in ("unknown", "structural")

    @cached_property
    def output_error(self) -> float | None:
        """The largest relative error among the diverged outputs (rel. L2 in tensor mode)."""
        errs = [p["error"] for p in self.m["points"]["out"]
                if p["status"] in self.ev.vocab.diverged and isinstance(p.get("error"), (int, float))]
        return max(errs, default=None)

    @property
    def uncorrelated(self) -> bool:
        """The output error is past rounding (rules.UNCORRELATED_ERROR) and the outputs are not
        one another times a constant."""
        if (self.output_error or 0.0) < rules.UNCORRELATED_ERROR:
            return False
        diverged = [r for r in _results(self.ev, self.m, "out") if r["status"] in self.ev.vocab.diverged]
        return not any(_scaled_copy(r) for r in diverged)

    @property
    def holds_weights(self) -> bool:
        """The mapping knows the pair's modules hold weights (a Linear, experts), seen or not."""
        return bool(self.m["points"]["param"])

    @cached_property
    def full_precision_far(self) -> bool:
        """Compared inputs agree, every compared input and output is fp32/fp64 on both sides, and the
        output error is at least rules.FULL_PRECISION_FAR, not one output times a constant."""
        if self.inputs_inferred or self.m["input_status"] not in self.ev.vocab.clean:
            return False
        if (self.output_error or 0.0) < rules.FULL_PRECISION_FAR:
            return False
        key = sibling.load_dtypes(sibling.SKILL_ROOT).dtype_key
        seen = [_results(self.ev, self.m, io) for io in ("in", "out")]
        dtypes = {key(d) for rs in seen for r in rs for side in ("train", "rollout")
                  for d in (r.get(side) or {}).get("dtypes") or []}
        if not seen[0] or not dtypes or not dtypes <= FULL_DTYPES:
            return False
        diverged = [r for r in seen[1] if r["status"] in self.ev.vocab.diverged]
        return not any(_scaled_copy(r) for r in diverged)

    @cached_property
    def between(self) -> list[dict]:
        """The one-sided modules between the boundary and the suspect (output_4 ``one_sided_between``)."""
        return self.ev.one_sided_of(self.m["one_sided_between"])

    @cached_property
    def op_between(self) -> dict | None:
        return _pick_op(self.between)

    @cached_property
    def split_boundary(self) -> dict | None:
        """The previous aligned pair's fused output (``a+b+c``) when it agrees while one of its
        parts, as the modules after it receive it, differs: the split, not the product, differs."""
        if self.prev is None or not self.inputs_diverged:
            return None
        diverged = {r["point"] for r in self.ev.compare.get("results", [])
                    if r["status"] in self.ev.vocab.diverged and r.get("pair") is None}
        for p in self.prev["points"]["out"]:
            parts = self.ev.vocab.parts(p["point"])
            if len(parts) > 1 and p["status"] in self.ev.vocab.clean and diverged & set(parts):
                return {"point": p["point"], "cid": p.get("cid"), "diverged_parts": sorted(diverged & set(parts))}
        return None

    @property
    def nothing_between(self) -> bool:
        """No module at all (pass-through ones aside) runs between the boundary and the suspect."""
        return not [o for o in self.between if not o.get("pass_through")]

    @property
    def boundary_breaks(self) -> bool:
        """A non-container suspect whose compared inputs differ right after an agreeing output."""
        m, prev = self.m, self.prev
        return (not m["is_container"] and prev is not None and prev["output_status"] in self.ev.vocab.clean
                and self.inputs_diverged and m["input_status_source"] == "compared")

    @property
    def container(self) -> dict | None:
        """The suspect itself when it is a container, else the innermost pair holding it."""
        held_by = self.m["containers"]
        return self.m if self.m["is_container"] else self.ev.pair(held_by[0]) if held_by else None

    @property
    def fused_realigns(self) -> bool:
        m = self.m
        return (m["kind"] in FUSED_KINDS and m["status"] != "parameter_mismatch" and not self.permuted
                and self.realigns and not m["dtype_boundary"])

    @property
    def outputs_structural(self) -> bool:
        outs = _results(self.ev, self.m, "out")
        return bool(outs) and all(r["status"] == "structural" for r in outs)

    @property
    def inputs_diverged(self) -> bool:
        return self.m["input_status"] in self.ev.vocab.diverged

    @property
    def inputs_clean_or_none(self) -> bool:
        return self.m["input_status"] in self.ev.vocab.clean + ("none",)

    @property
    def inputs_inferred(self) -> bool:
        return self.m["input_status_source"] != "compared"

    @cached_property
    def realigns(self) -> bool:
        return realigns(self.ev, self.m)

    @property
    def fused(self) -> bool:
        return self.m["kind"] in FUSED_KINDS or self.permuted or _multiset_equal(self.ev, self.m)

    @property
    def activation_like_op(self) -> bool:
        op = self.op_before_observer or self.op_between
        return bool(op and op["activation_like"])

    @cached_property
    def margin(self) -> float | None:
        return max((p["margin"] for p in self.m["points"]["out"]
                    if p.get("margin") is not None and p["status"] in self.ev.vocab.diverged + ("drift",)),
                   default=None)

    @property
    def small_margin(self) -> bool:
        return self.margin is not None and self.margin < 2 and self.rule != "precision_boundary"

    @property
    def internal_only(self) -> bool:
        return reaches_output(self.ev) is False and self.m["role"] not in ("lm_head", "logits", "final_norm")


def _pass_through_words(how: str | None) -> str | None:
    if how is None:
        return None
    return ("pass-through: output equals the input (checksums)" if how == "checksum" else
            "pass-through (statistics only): output has the input's shape, dtype and statistics")


def classify(s: Suspect) -> dict:
    """Inspect the boundary of one suspect; the first matching row of rules.RULES decides its
    category, and the decision for that row fills in the evidence and the side the dumps show."""
    ev, m = s.ev, s.m
    rule = rules.first_rule(s)
    s.rule = rule.id
    ev_info = {
        "pair": m["pid"], "status": m["status"], "rank_reason": m["rank_reason"],
        "module_priority_rank": m["module_priority_rank"],
        "input_status": m["input_status"], "input_status_source": m["input_status_source"],
        "parameter_status": m["parameter_status"], "output_status": m["output_status"],
        "amplification": m["amplification"], "previous_aligned": _mini(s.prev),
        "aligned_by": m.get("aligned_by", "names"),
        "differing_points": [p["point"] for io in ("in", "param", "out") for p in m["points"][io]
                             if p["status"] in ev.vocab.diverged],
        "differing_parameters": [p["point"] for p in m["points"]["param"] if p["status"] in ev.vocab.diverged],
        "output_error_margin": s.margin,
        "diverged_calls": _diverged_calls(ev, m),
    }
    f = {"category": rule.category, **_named(m), "layer": m["layer"], "role": m["role"],
         "evidence": ev_info, "rules_fired": [rule.id]}
    f.update(sides.from_structure(_DECIDE[rule.id](s, f, ev_info)))
    # The numbers and the chart mark of a finding come from the pair of the modules it names (a
    # fused qkv, an enclosing module), not from the later pair where the triage saw the break.
    ev_info["finding_pair"] = _named_pair(ev, f) or m["pid"]
    return f


def _named_pair(ev: Evidence, f: dict) -> str | None:
    want = _module_key(f)
    return next((x["pid"] for x in ev.modules if _module_key(_named(x)) == want), None)


def own_pair(f: dict) -> str:
    """The pair of the modules finding ``f`` names (its evidence pair when it names no pair)."""
    e = f["evidence"]
    return e.get("finding_pair") or e["pair"]


def _layout_side(ev: Evidence, cid: str | None) -> tuple[str, str] | None:
    """(side, layout) when the comparison ``cid`` read exactly one side in its own row layout
    (output_2 ``train_layout``/``rollout_layout``, e.g. Megatron's per-group qkv)."""
    plan = next((c for c in ev.mapping.get("comparisons", []) if c["cid"] == cid), {})
    found = [(side, plan[f"{side}_layout"]) for side in ("train", "rollout") if plan.get(f"{side}_layout")]
    return found[0] if len(found) == 1 else None


def _layout_reason(side: str, layout: str, what: str) -> str:
    return (f"the {side} side holds {what} in its own row layout ({layout}), the other side in the plain "
            f"order a Hugging Face checkpoint holds; the {side} rows hold the same values in another order, "
            f"which is what a conversion into the {side} layout that kept the plain order leaves")


def _decide_parameters(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    permuted = s.permuted or _multiset_equal(s.ev, s.m)
    ev_info["permuted_fused_rows"] = permuted
    side = _fused_side(s.m) if permuted else None
    layout = None if side or not permuted else next(
        filter(None, (_layout_side(s.ev, p.get("cid")) for p in s.m["points"]["param"]
                      if p["status"] in s.ev.vocab.diverged)), None)
    if side:
        return sides.Structural(side, f"the fused module on the {side} side holds the same values in another row "
                                      f"order; the unfused parts on the other side are consistent with each other")
    if layout:
        return sides.Structural(layout[0], _layout_reason(*layout, "this weight"))
    return sides.Structural(None, "both sides hold this weight and the dumps only show that they differ; compare "
                                  "each with the checkpoint to decide")


def _decide_precision(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    side = _lower_precision_side(s.ev, s.m)
    ev_info["precision_boundary"] = f"{side} side in lower precision" if side else "dtypes differ"
    return sides.Structural(side, "this side's output dtype is lower precision while the data entering the "
                                  "module agreed" if side else "dtypes differ but neither is clearly lower")


def _decide_unobserved_weight(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    ev_info["parameters_unobserved"] = True
    return sides.Structural(None, f"one side does not show this module's weights (e.g. vLLM applies lm_head's weight "
                                  f"inside logits_processor) and the outputs differ by {s.output_error:.3g} "
                                  f"relative, far past any rounding ({rules.UNCORRELATED_ERROR}): a different weight "
                                  f"(untied vs tied head, wrong shard, wrong checkpoint) leads; compare each side's "
                                  f"weight with the checkpoint")


def _decide_unobserved_full_precision(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    ev_info["parameters_unobserved"] = True
    ev_info["weight_visible"] = False
    return sides.Structural(None, f"one side does not show this module's weights, its inputs agree in full "
                                  f"precision and its outputs differ by {s.output_error:.3g} relative, past what "
                                  f"fp32, bf16 or fp8 rounding inside the module gives "
                                  f"({rules.FULL_PRECISION_FAR}): a weight difference (a stale or wrongly "
                                  f"converted copy) leads over a kernel difference; a configuration that changes "
                                  f"the module's math (a routing normalisation, an activation) is the other "
                                  f"explanation. Which side the dumps cannot say: rerun with --model <checkpoint> "
                                  f"or compare each side's weights with the checkpoint")


def _decide_origin(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    if s.parameters_unobserved:
        ev_info["parameters_uncompared"] = True
        why = ("inputs agree but the parameters could not be compared (one side does not dump them), so a weight "
               "difference is as possible as an implementation difference")
    else:
        why = ("both sides implement this module; inputs and parameters agree, so the difference is in how it "
               "computes: compare its configuration on both sides to decide")
    if s.inputs_inferred:
        ev_info["inputs_inferred"] = True
    return sides.Structural(None, why)


def _decide_routing(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    rec = s.routing
    ev_info["routing"] = moe.routing_summary(rec)
    keys = ", ".join(f"{d['key']} (train behaves as {d['train']!r}, rollout as {d['rollout']!r})"
                     for d in rec["differing_keys"]) or "no single key fits"
    werr = rec["weights_rel_error"]
    return sides.Structural(None, f"routing replayed from each side's router logits chooses other experts on "
                                  f"{rec['systematic_sets']} of {rec['tokens']} tokens away from any tie"
                                  + (f" and weighs the same experts differently (relative error {werr:.2g})"
                                     if werr is not None and werr > rec["weights_tolerance"] else "")
                                  + f": the sides route with different values: {keys}")


def _decide_op_before_observer(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    return _missing_or_extra(f, ev_info, s.op_before_observer, s.m)


def _window(s: Suspect, ev_info: dict) -> None:
    ev_info["boundary"] = _mini(s.prev)
    ev_info["one_sided_between"] = [_one_sided_view(o) for o in s.between]


def _decide_op_between(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    _window(s, ev_info)
    return _missing_or_extra(f, ev_info, s.op_between, s.m)


def _decide_between(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    """Inputs break behind a clean boundary with nothing unexpected between: the enclosing module."""
    _window(s, ev_info)
    container, m = s.container, s.m
    if container is not None and container is not m:
        f["train_module"] = _path_names(container["train_modules"])
        f["rollout_module"] = _path_names(container["rollout_modules"])
        f["role"] = container["role"]
        ev_info["suspect_pair"] = _mini(m)
        ev_info["container_pair"] = container["pid"]
    expected = [o["module"] for o in s.between if o["expected"]]
    return sides.Structural(None, "the difference arises between aligned modules, inside computation both "
                                  "sides do " + (f"(one-sided by design: {', '.join(expected)})" if expected
                                                 else "inline")
                                  + "; compare its configuration on both sides to decide")


def _decide_split(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    """A fused product agrees, its parts after the split do not: the row order of the fused weight
    does not fit the split that side's code applies (references: "Fused split")."""
    _window(s, ev_info)
    prev, split = s.prev, s.split_boundary
    f.update(_named(prev), layer=prev["layer"], role=prev["role"])
    ev_info["suspect_pair"] = _mini(s.m)
    ev_info["split_boundary"] = split
    layout = _layout_side(s.ev, split["cid"])
    if layout:
        side, name = layout
        return sides.Structural(side, f"the {side} side splits {split['point']} in its own row layout ({name}), "
                                      f"the other side in the plain order a Hugging Face checkpoint holds; a {side} "
                                      f"weight converted without reordering its rows into that layout gives the "
                                      f"wrong parts under the split while the fused product still agrees")
    return sides.Structural(None, "the fused product agrees and its parts do not: one side's weight rows are in an "
                                  "order its split does not expect; compare each with the checkpoint to decide")


def _common_parent(a: list[str], b: list[str]) -> str | None:
    """The module enclosing both paths' forward calls (a ModuleList and its index are skipped:
    a list has no forward of its own)."""
    if not a or not b:
        return None
    x, y = a[0].split("."), b[0].split(".")
    n = 0
    while n < min(len(x), len(y)) - 1 and x[n] == y[n]:
        n += 1
    common = x[:n]
    if n < len(x) and n < len(y) and x[n].isdigit() and y[n].isdigit() and common:
        common = common[:-1]        # two entries of one ModuleList: the op is in its owner
    return ".".join(common) or None


def _decide_inline_op(s: Suspect, f: dict, ev_info: dict) -> sides.Structural:
    """Rule 6: an op with no module of its own changes the stream between two aligned modules."""
    _window(s, ev_info)
    prev, m = s.prev, s.m
    parents = {side: _common_parent(prev[f"{side}_modules"], m[f"{side}_modules"]) for side in ("train", "rollout")}
    where = " / ".join(f"{p} ({side})" for side, p in parents.items() if p) or "the model's forward"
    ev_info["suspect_pair"] = _mini(m)
    ev_info["inline_in"] = parents
    f["op_module"] = None
    return sides.Structural(None, f"no dumped module: the op is inline in {where}. The output of "
                                  f"{_path_names(prev['train_modules'])} / {_path_names(prev['rollout_modules'])} "
                                  f"agrees, the input of {_path_names(m['train_modules'])} / "
                                  f"{_path_names(m['rollout_modules'])} does not, and nothing is dumped between: one "
                                  f"side computes something more or less in that forward (a scale, a residual add, "
                                  f"a cast); which side the dumps cannot say")


_DECIDE = {
    "inline_op_between": _decide_inline_op,
    "fused_split_differs": _decide_split,
    "parameters_differ": _decide_parameters,
    "precision_boundary": _decide_precision,
    "extra_op_before_observer": _decide_op_before_observer,
    "unobserved_weight_uncorrelated": _decide_unobserved_weight,
    "unobserved_weight_full_precision": _decide_unobserved_full_precision,
    "origin_in_module": _decide_origin,
    "routing_differs": _decide_routing,
    "extra_op_between": _decide_op_between,
    "impl_in_container": _decide_between,
    "impl_inline": _decide_between,
}


def _pick_op(between: list[dict]) -> dict | None:
    """The unexpected one-sided module to blame, activation-like ones first; a pass-through
    module (its output is its input: output_2 ``pass_through``) is never an op."""
    unexplained = [o for o in between if not o["expected"] and not o.get("pass_through")]
    return sorted(unexplained, key=lambda o: (not o["activation_like"], o["index"]))[0] if unexplained else None


def _op_before_observer(ev: Evidence, m: dict) -> dict | None:
    """An unexpected one-sided module between a suspect's boundary and the later pair where one
    side's copy of the suspect's output was read (output_4 ``observed_downstream``)."""
    for obs in (m.get("observed_downstream") or {}).values():
        op = _pick_op(ev.one_sided_of(obs["one_sided_between"]))
        if op is not None:
            return op
    return None


def _missing_or_extra(f: dict, ev_info: dict, op: dict, m: dict) -> sides.Structural:
    f["category"] = "missing_or_extra_op_between_aligned_boundary"
    f["missing_on"] = "train" if op["side"] == "rollout" else "rollout"
    f["op_module"] = op["module"]
    f["train_module" if op["side"] == "train" else "rollout_module"] = op["module"]
    f["train_module" if op["side"] == "rollout" else "rollout_module"] = None
    ev_info["suspect_pair"] = _mini(m)
    ev_info["activation_like_clue"] = op["activation_like"]
    return sides.Structural(op["side"], f"{op['module']} exists only on the {op['side']} side between two aligned "
                                        f"modules whose boundary breaks; the naming profiles do not expect it there")


def confidence(s: Suspect, f: dict) -> tuple[float, list[str]]:
    """The base score of the rule that classified the suspect plus the adjustments that hold
    (rules.ADJUSTMENTS); adds their ids to ``rules_fired`` and returns (score, notes)."""
    adj = rules.adjustments(s)
    f["rules_fired"] = f["rules_fired"] + [a.id for a in adj]
    c = rules.by_id(s.rule).base + sum(a.delta for a in adj)
    return credence.clamp(c), [a.note for a in adj]


def screen(s: Suspect) -> tuple[str, str] | None:
    """A structural reason to drop a candidate as (screen id, reason), or None to keep it."""
    row = rules.first_screen(s)
    if row is None:
        return None
    m = s.m
    if row.id == "routing_flip":
        return row.id, moe.flip_reason(s.routing)
    if row.id == "fused_mismatch_realigns":
        return row.id, (f"{m['kind']} pair ({m['note'] or 'fused vs unfused'}): its mismatch vanishes in the next "
                        f"aligned modules, the signature of a layout difference rather than a fault")
    return row.id, "; ".join(sorted({r.get("reason") or "structural" for r in _results(s.ev, m, "out")}))


def structural_records(ev: Evidence) -> list[dict]:
    """Comparisons the compare step itself judged structural, and fused/by-design pairs."""
    out = []
    for r in ev.compare.get("results", []):
        if r["status"] == "structural":
            # Stored in different layouts (shards, padding): the values were not compared as they are.
            out.append({"train_module": _path_names(r["train"]["modules"]),
                        "rollout_module": _path_names(r["rollout"]["modules"]),
                        "values": "not_compared", "reason": f"{r['point']}: {r.get('reason')}"})
    for m in ev.modules:
        if m["kind"] in FUSED_KINDS and m["status"] not in ("origin", "parameter_mismatch"):
            reason = m["note"] or "fused module compared through the combined statistics of its parts"
            out.append({**_named(m), "values": _values(ev, m["output_status"]),
                        "status": m["status"], "reason": f"{m['kind']}: {reason}"})
    return out


def _values(ev: Evidence, output_status: str) -> str:
    """clean / different / not_compared: what the outputs of a structural pair showed."""
    if output_status in ev.vocab.clean:
        return "clean"
    return "different" if output_status in ev.vocab.diverged else "not_compared"


def _module_key(f: dict) -> tuple:
    return str(f.get("train_module")), str(f.get("rollout_module"))


def _drop_reported(tri: Triage) -> None:
    """A module reported as a cause or candidate is not also set aside as structural."""
    reported = {_module_key(f) for f in tri.root_causes + tri.other_candidates}
    tri.suppressed = [s for s in tri.suppressed if _module_key(s) not in reported]


def precision_profile(ev: Evidence) -> dict:
    """How widespread dtype differences are, and whether errors grow with depth."""
    graded = [r for r in ev.compare.get("results", []) if r["status"] in ev.vocab.graded and r.get("pair") is None]
    differ = [r for r in graded if r.get("dtype_differs")]
    by_layer: dict[int, list[float]] = {}
    for r in graded:
        # A layer's activations only (output_4 ``vocabulary.points``): weights do not grow with depth.
        form = ev.vocab.form(r["point"]) or {}
        if form.get("layer") is not None and form.get("kind") == "activation" \
                and isinstance(r.get("error"), (int, float)):
            by_layer.setdefault(form["layer"], []).append(float(r["error"]))
    med = {k: sorted(v)[len(v) // 2] for k, v in sorted(by_layer.items())}
    layers = list(med)
    grows = len(layers) >= 2 and med[layers[-1]] >= med[layers[0]]
    return {"compared": len(graded), "dtype_differs": len(differ),
            "dtype_differs_share": round(len(differ) / len(graded), 3) if graded else 0.0,
            "median_error_by_layer": med, "error_grows_with_depth": grows}


def run(ev: Evidence) -> Triage:
    """Apply every rule and decide the verdict."""
    comp = ev.analysis.get("comparability", {"comparable": True, "reasons": []})
    tri = Triage(verdict="no_credible_divergence", suppressed=structural_records(ev))
    tri.precision = precision_profile(ev)
    if ev.analysis.get("partial"):
        tri.notes.append("partial analysis: at least one dump was damaged and only its readable part was used")
    ref_found, ref_notes = departures.findings(ev)
    tri.notes += ref_notes
    if not comp.get("comparable", True):
        return _from_reference_only(ev, tri, comp, ref_found)
    found: list[tuple[dict, dict]] = []
    screened: set[str] = set()
    for m in candidates(ev):
        s = Suspect(ev, m)
        dropped = screen(s)
        if dropped:
            screened.add(m["pid"])
            tri.suppressed.append({**_named(m), "values": "different", "reason": dropped[1], "rules_fired": [dropped[0]]})
            continue
        f = classify(s)
        fixes = sides.decide(ev, f, m)
        if found and rules.PROPAGATION.condition(s) and f["category"] != "parameter_or_checkpoint_issue":
            f["category"] = rules.PROPAGATION.category
            f.update(sides.carried())
            f["rules_fired"] = f["rules_fired"] + [rules.PROPAGATION.id]
        f["confidence"], f["confidence_notes"] = confidence(s, f)
        f["confidence_word"] = credence.calibrated_word(f["confidence"], f["rules_fired"])
        f["hypotheses"], f["next_checks"] = hypotheses.for_finding(f, ev.vocab)
        f["next_checks"] = fixes + f["next_checks"]
        if f["category"] == "upstream_propagation":
            tri.other_candidates.append(f)
        else:
            found.append((f, m))
    found = _with_reference(ev, found, ref_found, _no_activation_compared(comp), screened)
    if not found:
        entry = _before_range(ev, comp)
        if entry is not None:
            found.append(entry)
    found = _one_per_module(ev, found)
    _propagation_examples(ev, tri, found)
    share = tri.precision["dtype_differs_share"]
    precision_found = [f for f, _ in found if f["evidence"].get("precision_boundary")]
    any_diverged = any(r["status"] in ev.vocab.diverged for r in ev.compare.get("results", []))
    moe_note = moe.precision_note(ev) if any_diverged and not found else None
    if found and not (share >= PRECISION_SPREAD and len(precision_found) == len(found)):
        tri.verdict = "root_cause_found"
        tri.root_causes = _ranked([f for f, _ in found])
    elif found or (share >= PRECISION_SPREAD and _any_drift(ev)):
        tri.verdict = "precision_only"
        tri.other_candidates += [f for f, _ in found]
        tri.notes.append(f"{share:.0%} of compared tensors differ in dtype between the sides: differences "
                         "spread from the first modules and stay within the lower dtype's noise")
    elif any_diverged and moe_note:
        tri.verdict = "precision_only"
        tri.notes.append(moe_note)
    elif any_diverged:
        tri.verdict = "inconclusive"
        tri.notes.append("some tensors differ but no credible origin was found among aligned modules; "
                         "see output_4 for the first divergence")
        tri.notes += _carried_in_note(ev)
    if tri.verdict == "no_credible_divergence" and ev.analysis.get("partial"):
        tri.verdict = "inconclusive"
    if tri.verdict == "no_credible_divergence" and _no_activation_compared(comp) \
            and (n := departures.all_match(ev)) is not None:
        tri.notes.append(f"the two dumps' activations were not compared with each other, but both sides match the "
                         f"reference forward of the checkpoint at all {n} compared points, each call on its own rows")
    elif tri.verdict == "no_credible_divergence" and _only_bounded(comp):
        tri.verdict = "inconclusive"
        tri.notes.append(ONLY_BOUNDED)
    elif tri.verdict == "no_credible_divergence" and _no_activation_compared(comp):
        tri.verdict = "inconclusive"
        why = comp["activations"].get("main_reason")
        tri.notes.append("no activation of the two sides was compared, only parameters: this is not an all-clear"
                         + (f" (most activations were left out because {why})" if why else ""))
    _drop_reported(tri)
    return tri


def _carried_in_note(ev: Evidence) -> list[str]:
    """A note when nothing credible was found and the first divergence is carried in (output_4
    status ``propagated``: its inputs already differ or sit near the tolerance) and the reference
    forward did not run on both sides: the cause lies upstream, where the dumps' statistics cannot
    separate it from rounding, and the checkpoint's forward is what can (analysis_rules.md,
    "Findings from the reference forward")."""
    first = ev.analysis.get("first_divergence") or {}
    ran = [v for v in ((ev.analysis.get("reference_forward") or {}).get("sides") or {}).values() if v.get("ran")]
    if first.get("status") != "propagated" or len(ran) == 2:
        return []
    where = f"layer {first['layer']}" if first.get("layer") is not None else "outside the decoder layers"
    return [f"the first divergence ({first.get('point')}, {where}) is carried in: its inputs already differ or sit "
            f"near the tolerance, so its cause lies upstream, where the dumps alone do not tell it from rounding; "
            f"rerun with --model set to the checkpoint folder both engines loaded (and --token-ids with the ids "
            f"they ran, which a statistics dump of a prefill cannot give) to hold each side against the "
            f"checkpoint's forward"]


def _one_per_module(ev: Evidence, found: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """One finding per module, category and side. A module whose calls the dumps hold as entries of
    their own (calls that do not fold: a trainer's micro-batches of different lengths) is a pair per
    call, and one fault in it, such as a stale weight, is found again at each: that is one cause
    seen several times, not several causes. The finding kept is the most confident (the earliest
    call among equals); ``evidence.other_calls`` names the pairs where it was found again and how
    many pairs those modules have, so a reader can tell every call from some."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for fm in found:
        f = fm[0]
        groups.setdefault((f["category"], f.get("side"), _module_key(f)), []).append(fm)
    kept_ids, pairs_of = set(), None
    for members in groups.values():
        kept = max(members, key=lambda fm: fm[0]["confidence"])     # max keeps the first of equals
        again = [m["pid"] for f, m in members if f is not kept[0]]
        kept[0]["evidence"]["other_calls"] = None
        if again:
            f = kept[0]
            if pairs_of is None:        # counted once, and only when some finding repeats
                pairs_of = Counter(_module_key(_named(x)) for x in ev.modules)
            calls = pairs_of[_module_key(f)]
            f["evidence"]["other_calls"] = {"pairs": again, "pairs_of_these_modules": calls}
            f["confidence_notes"] = list(f.get("confidence_notes") or []) + [
                f"found the same at {len(again)} other call(s) of these modules, which the dumps hold apart "
                f"({len(members)} of their {calls} pairs; pairs {', '.join(again[:5])}"
                f"{', ...' if len(again) > 5 else ''})"]
        kept_ids.add(id(kept))
    return [fm for fm in found if id(fm) in kept_ids]


def _with_reference(ev: Evidence, found: list[tuple[dict, dict]], ref_found: list[dict],
                    nothing_between: bool, screened: set[str]) -> list[tuple[dict, dict]]:
    """The triage's findings with the reference forward's. Where the sides' activations were
    compared with each other, a reference finding that only says "the module computes otherwise"
    (rules.WEAK_DEPARTURE) adds nothing the triage's own rules did not weigh (routing, a container, a
    precision boundary), so only the others enter: at the same pair the reference finding stands in
    for the triage's (it held each side against the checkpoint call by call, saw or simulated the
    cause, and names the part of a fused module), keeping what the triage saw between the sides in
    its evidence; at another pair it is a finding of its own. A pair the screens set aside (a
    routing flip between tied experts departs from any forward, the reference's too) stays aside.
    Where nothing was compared between the sides, every reference finding enters."""
    out = list(found)
    for rf in ref_found:
        weak = rf["rules_fired"][0] == rules.WEAK_DEPARTURE or rf["evidence"]["pair"] in screened
        if weak and not nothing_between:
            continue
        pid = rf["evidence"]["pair"]
        same = next((i for i, (f, m) in enumerate(out) if m["pid"] == pid), None)
        if same is not None:
            f = out[same][0]
            rf["evidence"]["between_sides"] = {"category": f["category"], "rules_fired": f["rules_fired"],
                                               "differing_points": f["evidence"].get("differing_points")}
            out[same] = (rf, out[same][1])
        else:
            out.append((rf, ev.pair(pid)))
    return out


def _from_reference_only(ev: Evidence, tri: Triage, comp: dict, ref_found: list[dict]) -> Triage:
    """The verdict when the two dumps cannot be compared with each other: from each side held
    against the reference forward where it ran on both, else inconclusive."""
    between = "; ".join(comp.get("reasons", [])) or "see output_4 comparability"
    if ref_found:
        kept = _one_per_module(ev, [(f, ev.pair(f["evidence"]["pair"])) for f in ref_found])
        tri.verdict, tri.root_causes = "root_cause_found", _ranked([f for f, _ in kept])
        tri.notes.append(f"the two dumps were not compared with each other ({between}); the finding comes from "
                         "each side held against the reference forward of the checkpoint")
    elif (n := departures.all_match(ev)) is not None:
        tri.verdict = "no_credible_divergence"
        tri.notes.append(f"both sides match the reference forward of the checkpoint at all {n} compared points, each "
                         f"call on its own rows; the two dumps were not compared with each other ({between})")
    else:
        tri.verdict = "inconclusive"
        tri.notes += [f"not comparable: {r}" for r in comp.get("reasons", [])]
    _drop_reported(tri)
    return tri


def _only_bounded(comp: dict) -> bool:
    """output_4 ``comparability.activations``: no activation was verified, some were only bounded."""
    act = comp.get("activations")
    return isinstance(act, dict) and act.get("compared") == 0 and bool(act.get("bounded"))


def _no_activation_compared(comp: dict) -> bool:
    """output_4 ``comparability.activations``: the compare step planned activations and none ran."""
    act = comp.get("activations")
    return isinstance(act, dict) and act.get("compared") == 0


def _before_range(ev: Evidence, comp: dict) -> tuple[dict, dict] | None:
    """Rule 3: the first dumped aligned module already receives diverged inputs, so the cause lies
    before the dumped range; the finding sits at that entry point and says what to dump next."""
    entry = next((m for m in ev.modules if not m["is_container"] and m["input_status"] in ev.vocab.graded), None)
    if entry is None:
        return None
    s = Suspect(ev, entry)
    if not rules.BEFORE_RANGE.condition(s):
        return None
    s.rule = rules.BEFORE_RANGE.id
    tokens = comp.get("tokens") or {}
    f = {"category": rules.BEFORE_RANGE.category,
         **_named(entry),
         "layer": entry["layer"], "role": entry["role"], "rules_fired": [rules.BEFORE_RANGE.id],
         **sides.from_structure(sides.Structural(None, "the first aligned modules in the dump already receive inputs "
                                                       "that differ, so the cause lies before the dumped range; the "
                                                       "dumps cannot say which side")),
         "evidence": {"pair": entry["pid"], "status": entry["status"], "input_status": entry["input_status"],
                      "parameter_status": entry["parameter_status"], "output_status": entry["output_status"],
                      "differing_points": [p["point"] for p in entry["points"]["in"]
                                           if p["status"] in ev.vocab.diverged],
                      "before_dumped_range": True, "tokens_verified": bool(tokens.get("verified")),
                      "tokens_how": tokens.get("how")}}
    f["confidence"], f["confidence_notes"] = confidence(s, f)
    f["confidence_word"] = credence.calibrated_word(f["confidence"], f["rules_fired"])
    f["hypotheses"], f["next_checks"] = hypotheses.for_finding(f, ev.vocab)
    return f, entry


def _any_drift(ev: Evidence) -> bool:
    return any(r["status"] in ("drift",) + ev.vocab.diverged for r in ev.compare.get("results", []))


def _ranked(found: list[dict]) -> list[dict]:
    order = sorted(found, key=lambda f: (-f["confidence"],))
    for i, f in enumerate(order, 1):
        f["rank"] = i
    return order


def _propagation_examples(ev: Evidence, tri: Triage, found) -> None:
    """Modules right after each root cause that only carry its divergence (category upstream_propagation)."""
    for f, m in found:
        i = ev.pos[m["pid"]]
        after = [x for x in ev.modules[i + 1:] if x["status"] == "propagated" and x["module_priority_rank"] == 3
                 and x["input_status"] in ev.vocab.diverged and x["parameter_status"] not in ev.vocab.diverged][:2]
        for x in after:
            tri.other_candidates.append({
                "category": "upstream_propagation", **sides.carried(),
                **_named(x),
                "layer": x["layer"], "role": x["role"], "confidence": rules.PROPAGATION_EXAMPLE.base,
                "confidence_word": credence.calibrated_word(rules.PROPAGATION_EXAMPLE.base,
                                                            [rules.PROPAGATION_EXAMPLE.id]),
                "rules_fired": [rules.PROPAGATION_EXAMPLE.id],
                "evidence": {"pair": x["pid"], "input_status": x["input_status"],
                             "parameter_status": x["parameter_status"], "output_status": x["output_status"],
                             "explained_by": f["evidence"]["pair"]}})
