"""Module analysis (output_4): judge each mapped pair from the comparisons of its tensors.

A pair's inputs, parameters and outputs are the points its modules carry (both sides);
each point was compared once in output_3. From those verdicts each pair gets a status and a
``module_priority_rank`` (rules in references/priority_rank.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .compare import SEVERITY, Result
from .mapping import MappingPlan, Pair
from .naming import ModuleRecord

DIVERGED = ("mismatch", "nonfinite")


@dataclass
class PointVerdict:
    """The comparison behind one point of a pair."""
    point: str
    cid: str | None
    status: str                 # a Result status, or "not_compared"
    error: float | None


@dataclass
class ModuleVerdict:
    """One output_4 record."""
    pid: str
    kind: str
    train_modules: list[str]
    rollout_modules: list[str]
    layer: int | None
    block: str
    role: str | None
    train_order: int
    input_status: str
    input_status_source: str
    parameter_status: str
    output_status: str
    input_error: float | None
    parameter_error: float | None
    output_error: float | None
    amplification: float | None
    dtype_boundary: bool
    status: str
    module_priority_rank: int
    rank_reason: str
    is_container: bool = False
    explained_by: str | None = None
    unexplained_input_points: list[str] = field(default_factory=list)
    points: dict[str, list[PointVerdict]] = field(default_factory=dict)
    note: str | None = None


_AMP_FLOOR = 1e-7


def _worst(verdicts: list[PointVerdict]) -> tuple[str, float | None]:
    graded = [v for v in verdicts if v.status in SEVERITY]
    if not graded:
        if any(v.status == "structural" for v in verdicts):
            return "structural", None
        return ("unknown" if verdicts else "none"), None
    worst = max(graded, key=lambda v: (SEVERITY[v.status], v.error if v.error is not None else 0))
    errs = [v.error for v in graded if v.error is not None]
    return worst.status, (max(errs) if errs else None)


def _dtypes(res: Result, side: str) -> set[str]:
    return {d for d in getattr(res, side)["dtypes"] if d}


def analyse(plan: MappingPlan, results: list[Result], train: list[ModuleRecord],
            rollout: list[ModuleRecord]) -> tuple[list[ModuleVerdict], dict]:
    """Judge every pair; returns (verdicts in train execution order, first divergence info)."""
    by_point = {r.point: r for r in results}
    produced = {pt for p in plan.pairs for pt in p.points["out"]}
    verdicts: list[ModuleVerdict] = []
    prev_out: str | None = None
    for pair in plan.pairs:
        v = _judge(pair, by_point, produced, train, rollout, prev_out)
        verdicts.append(v)
        if v.output_status in SEVERITY:
            prev_out = v.output_status
    _containers(verdicts, plan.pairs, train)
    _demote_after_earlier_origin(verdicts)
    return verdicts, _first_divergence(verdicts, results, train)


def _judge(pair: Pair, by_point, produced, train, rollout, prev_out) -> ModuleVerdict:
    pts = {}
    for io in ("in", "param", "out"):
        pts[io] = [PointVerdict(p, by_point[p].cid, by_point[p].status, by_point[p].error)
                   if p in by_point else PointVerdict(p, None, "not_compared", None)
                   for p in pair.points[io]]
    in_s, in_e = _worst(pts["in"])
    par_s, par_e = _worst(pts["param"])
    out_s, out_e = _worst(pts["out"])
    source = "compared"
    if in_s in ("unknown", "none", "structural") and prev_out is not None:
        in_s, source = prev_out, "previous_aligned_module"
    elif in_s in ("unknown", "none"):
        source = "none"
    amp = None
    if out_e is not None and in_e is not None and math.isfinite(out_e):
        amp = out_e / max(in_e, _AMP_FLOOR)
    boundary = _dtype_boundary(pts, by_point)
    unexplained = [v.point for v in pts["in"] if v.status in DIVERGED and v.point not in produced]
    status, rank, why = _status_rank(pair, in_s, source, par_s, out_s, boundary, unexplained)
    return ModuleVerdict(
        pair.pid, pair.kind, [train[i].path for i in pair.train], [rollout[i].path for i in pair.rollout],
        pair.layer, pair.block, pair.role, min(pair.train), in_s, source, par_s, out_s, in_e, par_e, out_e,
        amp, boundary, status, rank, why, unexplained_input_points=unexplained, points=pts, note=pair.note)


def _dtype_boundary(pts, by_point) -> bool:
    """Output dtypes differ across sides while input dtypes agree: a precision change here."""
    def differs(io):
        return any(by_point[v.point].dtype_differs for v in pts[io] if v.point in by_point)
    outs = [v for v in pts["out"] if v.point in by_point]
    ins = [v for v in pts["in"] if v.point in by_point]
    return bool(outs) and bool(ins) and differs("out") and not differs("in")


def _status_rank(pair: Pair, in_s, source, par_s, out_s, boundary, unexplained) -> tuple[str, int, str]:
    if par_s in DIVERGED:
        return "parameter_mismatch", 1, "parameters differ between the sides"
    if out_s in DIVERGED:
        if in_s in DIVERGED:
            if unexplained:
                return ("propagated", 2, "inputs diverged but no aligned module produces them "
                        f"({', '.join(unexplained)}): something between the aligned modules differs")
            return "propagated", 3, "inputs already diverged"
        if source == "compared":
            return "origin", 1, "inputs and parameters agree, outputs differ"
        return "origin", 2, "outputs differ; inputs not comparable here, the previous aligned module's output agrees"
    if out_s == "drift" and boundary and in_s in ("match", "none", "unknown"):
        return "origin", 2, "output precision changes here (dtypes differ) while inputs agree"
    if out_s in ("unknown", "none", "structural"):
        if pair.kind in ("by_design_difference", "cross_role") or out_s == "structural":
            return "structural", 4, pair.note or "outputs are not comparable by design"
        return "incomparable", 4, "no output of this pair could be compared"
    return "clean", 5, "outputs agree within tolerance"


def _containers(verdicts: list[ModuleVerdict], pairs: list[Pair], train: list[ModuleRecord]) -> None:
    """A container whose divergence a child already explains is propagation, not an origin."""
    by_path: dict[str, ModuleVerdict] = {}
    for v in verdicts:
        for p in v.train_modules:
            by_path.setdefault(p, v)
    paths = sorted(by_path)
    for v in verdicts:
        if len(v.train_modules) != 1:
            continue
        prefix = v.train_modules[0] + "." if v.train_modules[0] else ""
        kids = [by_path[p] for p in paths if p.startswith(prefix) and p != v.train_modules[0]]
        kids = [k for k in kids if k is not v]
        if not kids:
            continue
        v.is_container = True
        culprit = next((k for k in sorted(kids, key=lambda k: k.train_order)
                        if k.module_priority_rank <= 2 and not k.is_container), None)
        if culprit is None:
            culprit = next((k for k in kids if k.module_priority_rank <= 2), None)
        if v.status in ("origin", "parameter_mismatch", "propagated") and culprit is not None \
                and v.output_status in DIVERGED + ("drift",):
            v.status, v.module_priority_rank = "propagated", 3
            v.explained_by = culprit.pid
            v.rank_reason = f"a module inside it ({', '.join(culprit.train_modules)}) already explains the divergence"
        elif v.status == "origin":
            v.rank_reason += "; no module inside it explains the divergence, so it arises between its children"


def _demote_after_earlier_origin(verdicts: list[ModuleVerdict]) -> None:
    """Unproduced diverged inputs are a clue only when nothing earlier in the layer diverged."""
    seen_origin: set = set()
    for v in sorted(verdicts, key=lambda v: v.train_order):
        if v.is_container:
            continue
        if v.status == "propagated" and v.module_priority_rank == 2 and v.layer in seen_origin:
            v.module_priority_rank = 3
            v.rank_reason = "inputs already diverged (an earlier module in this layer diverged first)"
        if v.status in ("origin", "parameter_mismatch") and v.output_status in DIVERGED + ("drift",):
            seen_origin.add(v.layer)


def _first_divergence(verdicts, results: list[Result], train) -> dict:
    first = next((v for v in sorted(verdicts, key=lambda v: v.train_order)
                  if v.output_status in DIVERGED and v.status != "structural"), None)
    key_index = {rec.key: i for i, rec in enumerate(train)}

    def res_order(r):
        idx = [key_index[k] for k in r.train["keys"] if k in key_index]
        return min(idx) if idx else 10**12
    diverged = [r for r in results if r.status in DIVERGED]
    first_point = min(diverged, key=res_order) if diverged else None
    return {
        "pair": first.pid if first else None,
        "train_modules": first.train_modules if first else None,
        "rollout_modules": first.rollout_modules if first else None,
        "status": first.status if first else None,
        "layer": first.layer if first else None,
        "point": first_point.point if first_point else None,
        "cid": first_point.cid if first_point else None,
    }
