"""Findings from the reference forward: where a side first leaves the checkpoint's own forward.

The compare step runs a numpy forward of the checkpoint over each side's tokens and judges every
planned activation of that side against it, each engine call on its own rows (output_4
``reference_forward``; the per-point records in output_3). Where one side departs and the other
matches, the departure is a finding even when the two dumps cannot be compared with each other
(a trainer's one forward over prompt + response against an engine's prefill and decode calls,
in statistics mode). The module is the one that produces the departing point on each side (the
part the statistics leave as the only suspect, for a fused output); the category is decided by the
table ``rules.DEPARTURE_RULES`` and the side by sides.py. Why: references/analysis_rules.md
("Findings from the reference forward").
"""
from __future__ import annotations

from functools import cached_property

from . import credence, hypotheses, moe, rules, sides
from .evidence import Evidence

SIDES = ("train", "rollout")


class Departure:
    """The facts of one side's departure that the rows of ``rules.DEPARTURE_RULES`` read."""

    def __init__(self, ev: Evidence, side: str, dep: dict, hyp: dict | None, m: dict, point: str,
                 engine_module: dict | None = None):
        self.ev, self.side, self.dep, self.hyp, self.m, self.point = ev, side, dep, hyp or {}, m, point
        # The one-sided module the departure is at (an engine's rotary or attention kernel), when no
        # pair holds the point; ``m`` is then the pair enclosing it.
        self.engine_module = engine_module

    @cached_property
    def own_parameters(self) -> list[dict]:
        """The side's reference judgement of each parameter of the pair (of the suspect part only,
        when a part of a fused output is the suspect)."""
        if self.engine_module is not None:
            return []
        part = self.point if self.point != self.dep["point"] else None
        out = []
        for p in self.m["points"]["param"]:
            # A fused weight holding the part counts: it is the part's weight as that side holds it.
            if part and not any(x.startswith(part + ".") for x in self.ev.vocab.parts(p["point"])):
                continue
            r = self.ev.results.get(p.get("cid")) or {}
            rec = (r.get("reference") or {}).get(self.side)
            if rec is not None:
                out.append({"point": p["point"], **rec})
        # A parameter only this side dumps (transformers' stacked experts beside vLLM 0.32's MoERunner).
        return out + [{k: v for k, v in u.items() if k not in ("module", "leaf")}
                      for u in sides.unpaired_parameters(self.ev, self.m, self.side)
                      if not part or any(x.startswith(part + ".") for x in self.ev.vocab.parts(u["point"]))]

    @property
    def weight_differs(self) -> bool:
        return any(p.get("matches_reference") is False for p in self.own_parameters)

    @property
    def has_parameters(self) -> bool:
        if self.engine_module is not None:
            return bool(self.engine_module["points"]["param"])
        return bool(self.m["points"]["param"])

    @property
    def weight_unseen(self) -> bool:
        """The module holds weights and none of the side's copies was seen to equal the checkpoint."""
        return self.has_parameters and not any(p.get("matches_reference") is True for p in self.own_parameters)

    @cached_property
    def carried_from(self) -> dict | None:
        """For a departing module whose own weights are all seen equal to the checkpoint and that no
        candidate reproduces: the one pair upstream whose weight this side's dump does not show, when
        every other upstream weight is seen equal too and that pair's output already sits further
        from the reference than the other side's (see ``_carrier``); None otherwise. A module with no
        weight of its own is left out: its math alone could make the departure."""
        own = self.own_parameters
        if self.engine_module is not None or not self.has_parameters or not own or self.reproducing \
                or not all(p.get("matches_reference") is True for p in own):
            return None
        return _carrier(self.ev, self.side, self.m)

    def reproduced_by(self, *kinds: str) -> bool:
        return any(c.get("reproduces") and c.get("kind") in kinds for c in self.hyp.get("candidates") or [])

    @property
    def reproducing(self) -> list[str]:
        return list(self.hyp.get("reproduced_by") or [])


def _ref_judgement(ev: Evidence, cid: str | None, side: str) -> dict:
    """The reference forward's judgement of ``side`` at comparison ``cid`` (output_3
    ``reference_forward.points``); empty when it judged none."""
    return (((ev.compare.get("reference_forward") or {}).get("points") or {}).get(cid) or {}).get(side) or {}


def _point_error(ev: Evidence, cid: str | None, side: str) -> float | None:
    rec = _ref_judgement(ev, cid, side)
    err = rec.get("error")
    return float(err) if isinstance(err, (int, float)) and rec.get("matches_reference") in (True, False) else None


def _carrier(ev: Evidence, side: str, m: dict) -> dict | None:
    """The pair a departure at ``m`` was carried from: among the non-container pairs before ``m``
    that hold weights, exactly one whose weight ``side`` does not show (none of its copies seen to
    equal the checkpoint), every other one's copies all seen equal, and that pair's outputs further
    from the reference on ``side`` than on the other side at every point both judged. Why:
    references/analysis_rules.md ("Findings from the reference forward")."""
    other = "rollout" if side == "train" else "train"
    unseen = []
    for up in ev.modules[:ev.pos[m["pid"]]]:
        if up["is_container"] or not up["points"]["param"]:
            continue
        d = Departure(ev, side, {"point": None}, None, up, "")
        if d.weight_unseen:
            unseen.append(up)
        elif not all(p.get("matches_reference") is True for p in d.own_parameters):
            return None
    if len(unseen) != 1:
        return None
    errs = [(_point_error(ev, p.get("cid"), side), _point_error(ev, p.get("cid"), other))
            for p in unseen[0]["points"]["out"]]
    errs = [(a, b) for a, b in errs if a is not None and b is not None]
    return unseen[0] if errs and all(a > b for a, b in errs) else None


def _deepest(paths: list[str]) -> list[str]:
    """The innermost of the modules producing one point (o_proj rather than the attention block
    that returns its output)."""
    if not paths:
        return []
    depth = max(p.count(".") for p in paths)
    return [p for p in paths if p.count(".") == depth]


def _producers(ev: Evidence, side: str, point: str) -> list[str]:
    """Modules of ``side`` whose output is ``point``, or a fused output holding it as a part."""
    exact, fused = [], []
    for row in ev.key_rows.get(side) or []:
        for port in row.get("ports") or []:
            if port.get("io") != "out":
                continue
            if port.get("point") == point:
                exact.append(row["path"])
            elif point in ev.vocab.parts(port.get("point") or ""):
                fused.append(row["path"])
    return sorted(set(_deepest(exact or fused)))


def _pair_of(ev: Evidence, cid: str, point: str) -> dict | None:
    """The module pair whose outputs hold the departing comparison (or the point)."""
    by_cid = next((m for m in ev.modules if not m["is_container"]
                   and any(p.get("cid") == cid for p in m["points"]["out"])), None)
    return by_cid or next((m for m in ev.modules if not m["is_container"]
                           and any(point in ev.vocab.parts(p["point"]) for p in m["points"]["out"])), None)


def _one_sided_at(ev: Evidence, side: str, point: str) -> tuple[dict, dict] | tuple[None, None]:
    """(the one-sided module of ``side`` outputting ``point``, the innermost pair enclosing it)."""
    rec = next((o for o in ev.analysis.get("one_sided") or [] if o["side"] == side
                and any(p["point"] == point for p in o["points"]["out"])), None)
    if rec is None:
        return None, None
    path = rec["module"]
    holders = [(max(len(x) for x in m[f"{side}_modules"] if path.startswith(x + ".")), m) for m in ev.modules
               if any(path.startswith(x + ".") for x in m[f"{side}_modules"])]
    return (rec, max(holders, key=lambda h: h[0])[1]) if holders else (None, None)


def _inline_producer(ev: Evidence, cid: str) -> dict | None:
    """The pair enclosing a point that a side only holds as a module's input (HF computes the
    attention kernel inline: its output is o_proj's input): whatever makes it runs inside the block
    that holds the consumer."""
    consumer = next((m for m in ev.modules if not m["is_container"]
                     and any(p.get("cid") == cid for p in m["points"]["in"])), None)
    if consumer is None:
        return None
    return ev.pair(consumer["containers"][0]) if consumer["containers"] else consumer


def _names(paths: list[str]):
    return None if not paths else paths[0] if len(paths) == 1 else paths


def _input_judged(ev: Evidence, m: dict, side: str) -> bool | None:
    """Whether the pair's inputs, as the side holds them, match the reference (None: not judged)."""
    seen = [_ref_judgement(ev, p.get("cid"), side).get("matches_reference") for p in m["points"]["in"]]
    seen = [v for v in seen if v in (True, False)]
    return None if not seen else all(seen)


def _finding(ev: Evidence, side: str, dep: dict, hyp: dict | None) -> dict | None:
    parts = (hyp or {}).get("parts") or {}
    suspects = parts.get("suspects") or []
    point = suspects[0] if len(suspects) == 1 else dep["point"]
    m, engine = _pair_of(ev, dep["cid"], point), None
    if m is None:
        engine, m = _one_sided_at(ev, side, point)
    if m is None:
        m = _inline_producer(ev, dep["cid"])
        engine = {"module": None, "points": {"param": []}} if m is not None else None
    if m is None:
        return None
    d = Departure(ev, side, dep, hyp, m, point, engine)
    rule = next(r for r in rules.DEPARTURE_RULES if r.condition(d))
    carried_through = None
    if rule.id == "reference_carried_from_unseen_weight":
        carried_through, m = m, d.carried_from
    names = {s: (None if engine or carried_through else _producers(ev, s, point)) or list(m[f"{s}_modules"])
             for s in SIDES}
    if engine is None and rule.category != "parameter_or_checkpoint_issue" \
            and _input_judged(ev, m, side) is not True and m["containers"]:
        # No weight of its own explains it and its input was never held to the reference (the
        # attention core HF computes inline): the difference may start anywhere inside the
        # enclosing block, where a config value such as the attention scale acts.
        m = ev.pair(m["containers"][0])
        names = {s: list(m[f"{s}_modules"]) for s in SIDES}
    evidence = {
        "pair": m["pid"], "finding_pair": m["pid"], "departure": dep, "departing_point": point,
        "departing_module": engine["module"] if engine else None,
        "first_call": dep.get("call"), "calls": dep.get("calls"),
        "inputs_match_reference": _input_judged(ev, m, side),
        "own_parameters": d.own_parameters, "reproduced_by": d.reproducing,
        "candidates_tried": len((hyp or {}).get("candidates") or []),
        "fused_parts": parts.get("parts") if parts else None,
    }
    if rule.id in ("reference_unseen_weight", "reference_carried_from_unseen_weight"):
        evidence["weight_visible"] = False
    if carried_through is not None:
        evidence["carried_through"] = {"pair": carried_through["pid"],
                                       "train_module": _names(carried_through["train_modules"]),
                                       "rollout_module": _names(carried_through["rollout_modules"])}
        evidence["output_errors"] = {p["point"]: {s: _point_error(ev, p.get("cid"), s) for s in SIDES}
                                     for p in m["points"]["out"]}
    f = {"category": rule.category, "train_module": _names(names["train"]), "rollout_module": _names(names["rollout"]),
         "layer": m.get("layer"), "role": m.get("role"), "evidence": evidence, "rules_fired": [rule.id]}
    f.update(sides.from_structure(sides.Structural(None, f"the {side} side leaves the reference forward at "
                                                         f"{dep['point']}")))
    fixes = sides.decide(ev, f, m)
    if rule.id == "reference_simulated_config":
        # The key whose injected value reproduces the side is one to read, whatever the role lists.
        tried = [c.get("config") or {} for c in (hyp or {}).get("candidates") or [] if c.get("reproduces")]
        f["config_keys"] = sorted(set(f.get("config_keys") or []) | {k for c in tried for k in c})
    conf, notes = rule.base, []
    if evidence["inputs_match_reference"] is None and rule.id == "reference_unseen_weight":
        conf -= 0.1
        notes.append("the module's input was not compared with the reference: an op before it is as possible")
    if len(suspects) > 1:
        notes.append(f"the statistics leave {len(suspects)} parts of the fused output as suspects")
    if carried_through is not None:
        notes.append(f"found by elimination: the {side} side departs at {dep['point']} in "
                     f"{_names(carried_through[f'{side}_modules'])}, whose weights match the checkpoint; the one "
                     f"weight upstream its dump does not show is this module's")
    f["confidence"], f["confidence_notes"] = credence.clamp(conf), notes
    f["confidence_word"] = credence.calibrated_word(f["confidence"], f["rules_fired"])
    f["hypotheses"], f["next_checks"] = hypotheses.for_finding(f, ev.vocab)
    f["next_checks"] = fixes + f["next_checks"]
    return f


def findings(ev: Evidence) -> tuple[list[dict], list[str]]:
    """(findings, notes) from the reference forward's departures: one per side that departs where the
    other does not depart at the same point; none when it did not run on both sides."""
    if not sides.checkpoint_fits(ev):
        return [], []       # another model's forward: its departures name no side (input_checks notes it)
    rf = ev.analysis.get("reference_forward") or {}
    ran = {s: v for s, v in (rf.get("sides") or {}).items() if s in SIDES and v.get("ran")}
    if len(ran) < 2:
        return [], []
    deps = {s: v["departure"] for s, v in ran.items() if v.get("departure")}
    if len(deps) == 2 and deps["train"]["point"] == deps["rollout"]["point"]:
        return [], [f"both sides leave the reference forward at {deps['train']['point']}: the checkpoint, its "
                    "config or the token ids are probably not what the engines ran"]
    hyps = {h.get("side"): h for h in rf.get("hypotheses") or []}
    notes = []
    for s in [s for s in SIDES if s in deps]:
        local = moe.replayed_experts(ev, s, deps[s])
        if local:
            notes.append(local)
            del deps[s]
    out = [f for s in SIDES if s in deps for f in [_finding(ev, s, deps[s], hyps.get(s))] if f is not None]
    out.sort(key=lambda f: (f["layer"] is None, f["layer"] if f["layer"] is not None else 0))
    return out, notes


def all_match(ev: Evidence) -> int | None:
    """The number of points at which both sides match the reference everywhere, or None when the
    forward did not run on both sides or a side departs or left points unjudged."""
    rf = ev.analysis.get("reference_forward") or {}
    ran = [v for s, v in (rf.get("sides") or {}).items() if s in SIDES and v.get("ran")]
    if len(ran) < 2 or not all(v.get("matches_everywhere") for v in ran):
        return None
    return min(v.get("points") or 0 for v in ran) or None
