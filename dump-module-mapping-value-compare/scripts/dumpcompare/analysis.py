"""Module analysis (output_4): judge each mapped pair from the comparisons of its tensors.

A pair's inputs, parameters and outputs are the points its modules carry (both sides);
each point was compared once in output_3. From those verdicts each pair gets a status and a
``module_priority_rank`` (rules in references/priority_rank.md).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from . import structure
from .compare import Result
from .naming import ModuleRecord
from .plan import MappingPlan, Pair
from .tolerances import BOUNDED, CLEAN, DIVERGED, SEVERITY


# Slotted: a dump of many modules holds tens of thousands of each, and an instance dictionary per
# record cost 13 MB over 8k pairs.
@dataclass(slots=True)
class PointVerdict:
    """The comparison behind one point of a pair."""
    point: str
    cid: str | None
    status: str                 # a Result status, or "not_compared"
    error: float | None
    margin: float | None = None # error / tolerance of that comparison


@dataclass(slots=True)
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
    # diverged output points that one side shows only at a later module's input, with an
    # unexpected one-sided module in between on that side: {point: {side, module}}
    observed_downstream: dict[str, dict] = field(default_factory=dict)
    points: dict[str, list[PointVerdict]] = field(default_factory=dict)
    note: str | None = None
    aligned_by: str = "names"  # how the pair was found: names | values | order (value_align.py)
    # Where the pair sits (structure.py): the pid of the aligned pair whose output feeds it, the
    # pids of the pairs holding it (innermost first) and the one-sided modules between the two.
    previous_aligned: str | None = None
    containers: list[str] = field(default_factory=list)
    one_sided_between: list[dict] = field(default_factory=list)


# What each module_priority_rank means, as _status_rank assigns them (references/priority_rank.md);
# published in output_4 ``rank_meanings``, which the root-cause skill's glossary reads.
RANK_MEANINGS = {
    1: "parameter_mismatch (the parameters differ) or origin (the output differs while the compared inputs and "
       "the parameters agree): the strongest root-cause candidates",
    2: "origin with inputs that could not be compared or at a precision change, or propagated where the previous "
       "aligned module's output agrees (the fault sits between the two): the next candidates",
    3: "propagated: the inputs already differ (or sit near their tolerance) and carry the difference from upstream",
    4: "structural, incomparable or bounded: the outputs could not be judged (bounded: one side holds a token "
       "more and the statistics' bounds hold, consistent but not verified)",
    5: "clean: the outputs agree within tolerance",
}

_AMP_FLOOR = 1e-7
# Inputs count as clean for an origin only when well inside tolerance, or when the output
# error stands out from the input error by this factor (see references/priority_rank.md).
_CLEAN_MARGIN = 0.25
_AMP_STANDOUT = 10.0


def _point_verdict(point: str, by_point: dict, pid: str | None = None) -> PointVerdict:
    r = by_point.get((point, pid)) or by_point.get((point, None))
    if r is None:
        return PointVerdict(point, None, "not_compared", None)
    margin = None
    if r.error is not None and r.tolerance:
        margin = r.error / r.tolerance
    return PointVerdict(point, r.cid, r.status, r.error, margin)


def _margin(verdicts: list[PointVerdict]) -> float | None:
    ms = [v.margin for v in verdicts if v.margin is not None and v.status in SEVERITY]
    return max(ms) if ms else None


def _worst(verdicts: list[PointVerdict]) -> tuple[str, float | None]:
    graded = [v for v in verdicts if v.status in SEVERITY]
    if not graded:
        if any(v.status == "structural" for v in verdicts):
            return "structural", None
        if any(v.status in BOUNDED for v in verdicts):
            return "bounded", None
        return ("unknown" if verdicts else "none"), None
    worst = max(graded, key=lambda v: (SEVERITY[v.status], v.error if v.error is not None else 0))
    errs = [v.error for v in graded if v.error is not None]
    return worst.status, (max(errs) if errs else None)


def analyse(plan: MappingPlan, results: list[Result], train: list[ModuleRecord],
            rollout: list[ModuleRecord]) -> tuple[list[ModuleVerdict], dict]:
    """Judge every pair; returns (verdicts in train execution order, first divergence info)."""
    by_point = {(r.point, r.pair): r for r in results}
    by_cid = {r.cid: r for r in results}
    produced = {pt for p in plan.pairs for pt in p.points["out"]}
    held_by = structure.containers(plan.pairs, train)
    containers = {c for cs in held_by.values() for c in cs}
    first_child = structure.first_children(plan.pairs, held_by)
    windows = structure.OneSidedWindows(plan.one_sided, {"train": train, "rollout": rollout}, plan.pairs)
    pair_at = {s: {} for s in ("train", "rollout")}
    for p in plan.pairs:
        for s, idx, recs in (("train", p.train, train), ("rollout", p.rollout, rollout)):
            for i in idx:
                pair_at[s].setdefault(recs[i].path, p)
    verdicts: list[ModuleVerdict] = []
    out_status: dict[str, str] = {}
    before_of: dict[str, str | None] = {}
    prev: dict = {}          # layer -> pid of the last non-container pair there with a graded output
    last: str | None = None
    diverged_earlier: set[str] = set()   # points an earlier pair already output diverged
    masked: set[str] = set()             # statistics that agree only after the inputs diverged
    unexpected = {s: (sorted(o.rec for o in plan.one_sided if o.side == s and not o.expected
                                  and not o.pass_through),
                      {r.key: i for i, r in enumerate(recs)})
                  for s, recs in (("train", train), ("rollout", rollout))}
    for pair in plan.pairs:
        is_container = pair.pid in containers
        before = prev.get(pair.layer, last) if pair.layer is not None else last
        if is_container and first_child.get(pair.pid) in before_of:
            # A container's input is what reaches its first child, not its last child's output.
            before = before_of[first_child[pair.pid]]
        before_of[pair.pid] = before
        v = _judge(pair, by_point, by_cid, produced, train, rollout, out_status.get(before), diverged_earlier,
                   masked, unexpected)
        v.is_container = is_container
        v.previous_aligned, v.containers = before, held_by[pair.pid]
        v.one_sided_between = windows.between(before, pair, is_container)
        for obs in v.observed_downstream.values():
            end = pair_at[obs["side"]].get(obs["module"])
            obs["pair"] = end.pid if end else None
            obs["one_sided_between"] = windows.between(before, end, end.pid in containers) if end else []
        out_status[pair.pid] = v.output_status
        verdicts.append(v)
        diverged_earlier.update(p.point for p in v.points["out"] if p.status in DIVERGED)
        if v.input_status in DIVERGED and v.output_status in CLEAN:
            # Summary statistics can agree while elements do not (a norm rescales a diverged
            # stream to the same RMS); only tensors show a real realignment.
            masked.update(p.point for p in v.points["out"]
                          if p.cid in by_cid and by_cid[p.cid].mode == "statistics")
        if not v.is_container and v.output_status in SEVERITY:
            prev[pair.layer] = last = pair.pid
    _containers(verdicts)
    return verdicts, _first_divergence(verdicts, results, train)


def _judge(pair: Pair, by_point, by_cid, produced, train, rollout, prev_out, diverged_earlier,
           masked, unexpected) -> ModuleVerdict:
    pts = {}
    for io in ("in", "param", "out"):
        pts[io] = [_point_verdict(p, by_point, pair.pid) for p in pair.points[io]]
    in_s, in_e = _worst(pts["in"])
    par_s, par_e = _worst(pts["param"])
    out_s, out_e = _worst(pts["out"])
    source = "compared"
    # Bounded inputs are not shown to agree: like inputs not compared, the previous output stands in.
    if in_s in ("unknown", "none", "structural", "bounded") and prev_out is not None:
        in_s, source = prev_out, "previous_aligned_module"
    elif in_s in ("unknown", "none", "bounded"):
        source = "none"
    amp = None
    if out_e is not None and in_e is not None and math.isfinite(out_e):
        amp = out_e / max(in_e, _AMP_FLOOR)
    boundary = _dtype_boundary(pair, by_point, by_cid)
    unexplained = [v.point for v in pts["in"] if v.status in DIVERGED and v.point not in produced]
    margins = (_margin(pts["in"]), _margin(pts["out"]))
    # A clean previous module marks a broken boundary only if no earlier pair already put out
    # the diverged input (the residual stream can skip past a module whose output agrees).
    downstream = _observed_downstream(pair, pts["out"], by_cid, train, rollout, unexpected)
    carried = any(v.point in diverged_earlier for v in pts["in"] if v.status in DIVERGED)
    boundary_clean = prev_out in CLEAN and not carried
    masked_inputs = [v.point for v in pts["in"] if v.point in masked]
    status, rank, why = _status_rank(pair, in_s, source, par_s, out_s, boundary, margins, boundary_clean,
                                     masked_inputs)
    if status == "origin" and rank == 1 and downstream:
        rank = 2
        why = ("outputs differ, but one side shows them only at a later module's input, after a module the "
               f"other side does not have ({', '.join(sorted(downstream))}): that module could be responsible")
    return ModuleVerdict(
        pair.pid, pair.kind, [train[i].path for i in pair.train], [rollout[i].path for i in pair.rollout],
        pair.layer, pair.block, pair.role, min(pair.train), in_s, source, par_s, out_s, in_e, par_e, out_e,
        amp, boundary, status, rank, why, unexplained_input_points=unexplained, observed_downstream=downstream,
        points=pts, note=pair.note, aligned_by=pair.aligned_by)


def _observed_downstream(pair: Pair, outs: list[PointVerdict], by_cid, train, rollout,
                         unexpected: dict[str, tuple[list[int], dict[str, int]]]) -> dict[str, dict]:
    """Diverged output points that a side holds only as the input of a later module outside the
    pair, with an unexpected one-sided module in between on that side (which could be the cause)."""
    recs = {"train": (train, pair.train), "rollout": (rollout, pair.rollout)}
    found = {}
    for v in outs:
        r = by_cid.get(v.cid)
        if r is None or v.status not in DIVERGED:
            continue
        for side, (side_recs, own) in recs.items():
            one_sided, index = unexpected[side]
            start = max(own)
            held = getattr(r, side)
            for key, leaf in zip(held["keys"], held["leaves"]):
                end = index.get(key, -1)
                if end > start and leaf.startswith("input"):
                    lo = bisect.bisect_right(one_sided, start)
                    if lo < len(one_sided) and one_sided[lo] < end:
                        found[v.point] = {"side": side, "module": side_recs[end].path}
    return found


def _dtype_boundary(pair: Pair, by_point, by_cid) -> bool:
    """Output dtypes differ across sides while the data reaching the module from upstream
    (the canonical comparisons of its input points) had the same dtype: precision changes here,
    in the module or in a cast at its input."""
    outs = [by_cid[v] for v in (_cid(p, pair.pid, by_point) for p in pair.points["out"]) if v in by_cid]
    ins = [by_point[(p, None)] for p in pair.points["in"] if (p, None) in by_point]
    upstream_ok = bool(ins) and all(r.status == "match" and not r.dtype_differs for r in ins)
    return bool(outs) and upstream_ok and any(r.dtype_differs for r in outs)


def _cid(point: str, pid: str, by_point) -> str | None:
    r = by_point.get((point, pid)) or by_point.get((point, None))
    return r.cid if r else None


def _status_rank(pair: Pair, in_s, source, par_s, out_s, boundary, margins, boundary_clean,
                 masked_inputs) -> tuple[str, int, str]:
    in_m, out_m = margins
    if par_s in DIVERGED:
        return "parameter_mismatch", 1, "parameters differ between the sides"
    if out_s in DIVERGED:
        if in_s in DIVERGED:
            if boundary_clean:
                return ("propagated", 2, "inputs diverged although the previous aligned module's output agrees: "
                        "something between the two aligned modules differs")
            return "propagated", 3, "inputs already diverged"
        if in_m is not None and in_m > _CLEAN_MARGIN and out_m is not None and out_m < _AMP_STANDOUT * in_m:
            return ("propagated", 3, f"inputs already near tolerance ({in_m:.2f} of it); the output "
                    "crosses it without a marked amplification")
        if masked_inputs:
            return ("propagated", 3, f"inputs agree only in statistics ({', '.join(masked_inputs)}) after an "
                    "earlier divergence: treated as carrying it")
        if source == "compared":
            return "origin", 1, "inputs and parameters agree, outputs differ"
        if in_s in BOUNDED:
            return ("origin", 2, "outputs differ (a bound of the statistics broken); inputs only bounded "
                    "(consistent, not verified) and no earlier aligned output differs")
        return "origin", 2, "outputs differ; inputs not comparable here, the previous aligned module's output agrees"
    if out_s == "drift" and boundary:
        return "origin", 2, "output precision changes here (dtypes differ) while inputs agree"
    if out_s in BOUNDED and not boundary:
        return ("bounded", 4, "outputs only bounded: one side holds a token more, and its statistics bound the "
                "other's (consistent, not verified)")
    if out_s in ("unknown", "none", "structural", "bounded"):
        if boundary:
            # dtypes are exact metadata: a precision change shows even where values cannot be
            # compared (vLLM's logits cover only the sampled positions)
            return ("origin", 2, "output precision changes here (dtypes differ) while inputs agree; "
                    "the output values themselves could not be compared")
        if pair.kind in ("by_design_difference", "cross_role") or out_s == "structural":
            return "structural", 4, pair.note or "outputs are not comparable by design"
        return "incomparable", 4, "no output of this pair could be compared"
    return "clean", 5, "outputs agree within tolerance"


def _containers(verdicts: list[ModuleVerdict]) -> None:
    """A container whose divergence a child already explains is propagation, not an origin."""
    # Only rank-1/2 modules can explain a container; there are few, so scan them per container.
    strong = sorted((k for k in verdicts if k.module_priority_rank <= 2), key=lambda k: (k.is_container, k.train_order))
    for v in verdicts:
        if not v.is_container or v.status not in ("origin", "parameter_mismatch", "propagated"):
            continue
        culprit = next((k for k in strong if k is not v and k.module_priority_rank <= 2 and v.pid in k.containers),
                       None)
        if culprit is not None and v.output_status in DIVERGED + ("drift",):
            v.status, v.module_priority_rank = "propagated", 3
            v.explained_by = culprit.pid
            v.rank_reason = f"a module inside it ({', '.join(culprit.train_modules)}) already explains the divergence"
        elif v.status == "origin":
            v.rank_reason += "; no module inside it explains the divergence, so it arises between its children"


def _first_divergence(verdicts, results: list[Result], train) -> dict:
    """The first pair (train order) whose output diverges, and its earliest diverged tensor.

    The point is one of that pair's own parameters or outputs (a diverged parameter first): an
    input of the pair can diverge too and sit in the same or an earlier entry, but it came from
    upstream and is not what makes this pair the first divergence.
    """
    first = next((v for v in sorted(verdicts, key=lambda v: v.train_order)
                  if v.output_status in DIVERGED and v.status != "structural"), None)
    key_index = {rec.key: i for i, rec in enumerate(train)}
    by_cid = {r.cid: r for r in results}

    def res_order(r):
        idx = [key_index[k] for k in r.train["keys"] if k in key_index]
        return min(idx) if idx else 10**12
    own = first.points["param"] + first.points["out"] if first else []
    outs = [by_cid[p.cid] for p in own if p.status in DIVERGED and p.cid in by_cid]
    first_point = min(outs, key=res_order) if outs else None
    return {
        "pair": first.pid if first else None,
        "train_modules": first.train_modules if first else None,
        "rollout_modules": first.rollout_modules if first else None,
        "status": first.status if first else None,
        "layer": first.layer if first else None,
        "point": first_point.point if first_point else None,
        "cid": first_point.cid if first_point else None,
        # Where the divergence entered from upstream: the pair's own inputs that already differ.
        "diverged_inputs": [p.point for p in first.points["in"] if p.status in DIVERGED] if first else [],
    }
