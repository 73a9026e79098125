"""The mapping plan: which modules correspond across sides, and which tensors to compare.

Two plans come out of here, both plain data written to output_2:

* module pairs (one-to-one, composite fused <-> parts, by-design differences, cross-role)
  plus one-sided modules with their aligned neighbours;
* point comparisons: for every logical tensor ("point") both sides carry, the leaf or
  ordered leaves on each side that hold it. A fused output on one side is compared with
  the concatenation of the parts on the other; parts that only a consumer's inputs carry
  (vLLM ``rotary_emb`` takes q and k, ``attn`` takes q, k, v) are compared too, which is
  where a wrong row order inside a fused weight shows in statistics mode.

Everything is dictionary lookups over the entries: linear in their number.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Callable

from .gcpause import collector_paused
from .naming import ModuleRecord, Namer
from .plan import Aligned, Carrier, MappingPlan, OneSided, Pair, PointPlan, PortPoints
from .points import at_call, is_parameter_name
from .records import FORWARD


def _forward_modules(recs: list[ModuleRecord]) -> list[ModuleRecord]:
    return [r for r in recs if r.kind == "module" and r.direction == FORWARD]


@collector_paused()
def build_plan(train: list[ModuleRecord], rollout: list[ModuleRecord], namer: Namer,
               align: Callable[..., list[Aligned]] | None = None) -> MappingPlan:
    """Pair modules and plan point comparisons for two sides' records. ``align`` (value_align.align
    with the dumps' values bound) then pairs modules no rule explains, by the values they carry."""
    sides = {"train": train, "rollout": rollout}
    fam = {s: (recs[0].family if recs else "hf") for s, recs in sides.items()}
    fwd = {s: _forward_modules(recs) for s, recs in sides.items()}
    by_key = {s: {} for s in sides}
    for s in sides:
        for r in fwd[s]:
            if r.is_wrapper:
                continue
            by_key[s].setdefault((r.canonical, r.call), r)
    paired: dict[str, set[int]] = {"train": set(), "rollout": set()}
    layouts = namer.p.get("layouts", {}) or {}
    holders = {s: _side_carriers(recs, layouts) for s, recs in sides.items()}
    raw_pairs: list[tuple[str, list[ModuleRecord], list[ModuleRecord], str | None]] = []
    reasons: dict[tuple, str | None] = {}     # _by_design_reason per (role, family, class, other family)

    for key, tr in by_key["train"].items():
        ro = by_key["rollout"].get(key)
        if ro is not None:
            kind, note = _pair_kind(tr, ro, namer, reasons)
            raw_pairs.append((kind, [tr], [ro], note))
            paired["train"].add(tr.index)
            paired["rollout"].add(ro.index)
    for fused_side, parts_side in (("rollout", "train"), ("train", "rollout")):
        for (canon, call), r in by_key[fused_side].items():
            if not r.parts or r.index in paired[fused_side]:
                continue
            parts = [by_key[parts_side].get((f"{r.scope}.{p}", call)) for p in r.parts]
            if any(p is None or p.index in paired[parts_side] for p in parts):
                continue
            note = _by_design_reason(r, namer, fam[parts_side], reasons)
            trs, ros = (parts, [r]) if fused_side == "rollout" else ([r], parts)
            raw_pairs.append(("composite", trs, ros, note))
            paired[fused_side].add(r.index)
            paired[parts_side].update(p.index for p in parts)
    for rule in namer.p.get("cross_role_pairs", []) or []:
        a, b = rule["roles"]
        for ra, rb in ((a, b), (b, a)):
            tr = next((r for r in fwd["train"] if r.role == ra and r.index not in paired["train"]), None)
            ro = next((r for r in fwd["rollout"] if r.role == rb and r.index not in paired["rollout"]), None)
            if tr is not None and ro is not None and tr.scope == ro.scope and tr.call == ro.call:
                raw_pairs.append(("cross_role", [tr], [ro], rule.get("reason")))
                paired["train"].add(tr.index)
                paired["rollout"].add(ro.index)

    aligned: dict[tuple[int, int], Aligned] = {}   # (train, rollout) index -> pair
    if align is not None:
        rules = namer.p.get("expected_one_sided", []) or []

        def unexplained(s: str, r: ModuleRecord) -> bool:
            other = "rollout" if s == "train" else "train"
            return (r.index not in paired[s] and not r.is_wrapper and r.call == 0
                    and not any(_matches(x, r, fam[other]) for x in rules))
        anchors = [(min(r.index for r in p[1]), min(r.index for r in p[2])) for p in raw_pairs]
        for a in align(fwd, anchors, unexplained):
            raw_pairs.append(("one_to_one", [a.train], [a.rollout], a.note))
            aligned[(a.train.index, a.rollout.index)] = a
            paired["train"].add(a.train.index)
            paired["rollout"].add(a.rollout.index)

    raw_pairs.sort(key=lambda p: (min(r.index for r in p[1]), min(r.index for r in p[2])))
    pairs, aligned_points = [], []
    for i, (kind, trs, ros, note) in enumerate(raw_pairs):
        anchor = trs[0]
        role = anchor.role if kind != "composite" else next((r.role for r in trs + ros if r.parts), anchor.role)
        pair = Pair(f"P{i:04d}", kind, [r.index for r in trs], [r.index for r in ros],
                    anchor.layer, anchor.block, role, note)
        found = aligned.get((anchor.index, ros[0].index))
        if found is not None:
            pair.aligned_by = found.by
            aligned_points += _aligned_points(pair, found)
        else:
            # A one_to_one pair here is one whose two records carry the same (io, point) set
            # (_pair_kind): the rollout record adds no point, and a wide module has 300k of them.
            pair.points = _points_of(trs, holders["train"][2]) if kind == "one_to_one" else _points_of(trs + ros)
        pairs.append(pair)

    one_sided = _one_sided(sides, fwd, paired, pairs, fam, namer)
    comparisons, unmatched, held = _plan_points(sides, holders)
    comparisons += _pair_own_points(pairs, sides, comparisons, held) + aligned_points
    for i, c in enumerate(comparisons):
        c.cid = f"C{i:04d}"
    return MappingPlan(pairs, one_sided, comparisons, unmatched)


def _points_of(recs: list[ModuleRecord], shared: set[int] | None = None) -> PortPoints:
    """The points records carry, per io (PortPoints). One record sharing no point (``shared``,
    _side_carriers) carries each of its points once: its ports are the answer."""
    return PortPoints(recs, shared is not None and len(recs) == 1 and recs[0].index not in shared)


def _aligned_points(pair: Pair, a: Aligned) -> list[PointPlan]:
    """The leaves both modules of a value- or order-aligned pair carry, compared leaf by leaf
    (filling ``pair.points``): no rule names the tensors, so the pair's own leaves are the points."""
    plans = []
    for leaf, io in a.leaves:
        point = a.point(leaf)
        pair.points[io].append(point)
        plans.append(PointPlan("", point, "direct", "rows" if io == "param" else "features",
                               [Carrier(a.train.index, leaf, io)], [Carrier(a.rollout.index, leaf, io)],
                               pair=pair.pid))
    return plans


def _pair_own_points(pairs: list[Pair], sides, planned: list[PointPlan], held: "_Held") -> list[PointPlan]:
    """Compare a pair's own leaves where they differ from the point's canonical holders.

    The same point can be held by a producer's output and a consumer's input; when an op
    sits between them on one side (an extra scale, a missing activation) the two differ,
    and only the consumer pair's own leaves show it.
    """
    stitched = {c.point for c in planned if c.stitched} if held.skip else set()
    extra = []
    for pair in pairs:
        if len(pair.train) != 1 or len(pair.rollout) != 1:
            continue
        tr, ro = sides["train"][pair.train[0]], sides["rollout"][pair.rollout[0]]
        if held.sole_holders(tr, ro):
            continue
        # Each point's last port, in the order of its first: built in C, as a wide module's
        # 300k ports make these the largest tables of the step.
        tports = dict(zip(map(_point_of, tr.ports), tr.ports))
        rports = dict(zip(map(_point_of, ro.ports), ro.ports))
        for point, t in tports.items():      # in port order: outputs must not depend on hashing
            r = rports.get(point)
            if r is None or (stitched and point in stitched):
                continue
            if held.direct(point, tr.index, t.leaf, ro.index, r.leaf):
                continue
            axis = "rows" if t.io == "param" else "features"
            extra.append(PointPlan("", point, "direct", axis, [Carrier(tr.index, t.leaf, t.io)],
                                   [Carrier(ro.index, r.leaf, r.io)], pair=pair.pid))
    return extra


_point_of = attrgetter("point")


@dataclass
class _Held:
    """Which leaves the point plans compare: each side's holder of a point (_side_carriers) and the
    points not compared directly by their holders (stitched over calls). Asked point by point
    instead of indexing the plans by point: one table fewer over a wide module's points."""
    train: dict[str, Carrier]
    rollout: dict[str, Carrier]
    skip: set[str]
    train_shared: set[int]         # records sharing a point with another port (_side_carriers)
    rollout_shared: set[int]

    def sole_holders(self, tr: ModuleRecord, ro: ModuleRecord) -> bool:
        """Whether every point of the two records is compared between exactly their own leaves: no
        point stitched, neither record shares a point, and both carry the same points in the same
        order (each port then holds its point, and the ports of a point face each other)."""
        return (not self.skip and tr.index not in self.train_shared and ro.index not in self.rollout_shared
                and _same_ports(tr, ro))

    def direct(self, point: str, trec: int, tleaf: str, rrec: int, rleaf: str) -> bool:
        """Whether the plan of ``point`` compares exactly these two leaves (one on each side): a
        point both sides hold and not stitched is compared between its two holders."""
        if point in self.skip:
            return False
        t, r = self.train.get(point), self.rollout.get(point)
        return (t is not None and r is not None and t.rec == trec and t.leaf == tleaf
                and r.rec == rrec and r.leaf == rleaf)


def _matches(rule: dict, rec: ModuleRecord, other_family: str) -> bool:
    if rule.get("role") not in (None, rec.role):
        return False
    if "families" in rule and rec.family not in rule["families"]:
        return False
    if "other" in rule and other_family not in rule["other"]:
        return False
    if "classes" in rule and not any(re.search(c, rec.cls) for c in rule["classes"]):
        return False
    return True


def _same_ports(tr: ModuleRecord, ro: ModuleRecord) -> bool:
    """Whether two records carry the same points with the same io, port by port."""
    return len(tr.ports) == len(ro.ports) and all(
        a.point == b.point and a.io == b.io for a, b in zip(tr.ports, ro.ports))


def _by_design_reason(rec: ModuleRecord, namer: Namer, other_family: str, memo: dict) -> str | None:
    """The profiles' reason why ``rec`` differs by design from its counterpart of ``other_family``,
    or None; kept in ``memo``, since every layer's and call's copy of a module asks again."""
    key = (rec.role, rec.family, rec.cls, other_family)
    if key not in memo:
        memo[key] = _design_rule_reason(rec, namer, other_family)
    return memo[key]


def _design_rule_reason(rec: ModuleRecord, namer: Namer, other_family: str) -> str | None:
    for rule in namer.p.get("by_design_differences", []) or []:
        fams = rule.get("families")
        if fams and len(fams) == 2:
            ok = rule.get("role") == rec.role and rec.family in fams and other_family in fams
        else:
            ok = _matches(rule, rec, other_family)
        if ok:
            return rule["reason"]
    return None


def _pair_kind(tr: ModuleRecord, ro: ModuleRecord, namer: Namer, reasons: dict) -> tuple[str, str | None]:
    """one_to_one unless the two modules carry different tensors by design (``reasons``: the memo
    of _by_design_reason)."""
    def pts(r):
        return {(p.io, p.point) for p in r.ports}
    # Alike modules list their ports in the same order: checked pairwise first, without building
    # a set of a wide module's hundreds of thousands of ports per side.
    if _same_ports(tr, ro) or pts(tr) == pts(ro):
        return "one_to_one", None
    reason = _by_design_reason(tr, namer, ro.family, reasons) or _by_design_reason(ro, namer, tr.family, reasons)
    if reason is None:
        only_t = sorted(p for _, p in pts(tr) - pts(ro))
        only_r = sorted(p for _, p in pts(ro) - pts(tr))
        reason = (f"the modules carry different tensors (train only: {', '.join(only_t) or '-'}; "
                  f"rollout only: {', '.join(only_r) or '-'}); only common tensors are compared")
    return "by_design_difference", reason


def _one_sided(sides, fwd, paired, pairs, fam, namer: Namer) -> list[OneSided]:
    """One-sided modules with their aligned neighbours and whether the profiles expect them."""
    out = []
    pair_of = {s: {} for s in sides}
    for p in pairs:
        for i in p.train:
            pair_of["train"][i] = p.pid
        for i in p.rollout:
            pair_of["rollout"][i] = p.pid
    rules = namer.p.get("expected_one_sided", []) or []
    first_calls = {s: {(r.canonical, 0) for r in recs if r.index in paired[s] and r.call == 0}
                   for s, recs in fwd.items()}
    for s, recs in fwd.items():
        other = "rollout" if s == "train" else "train"
        # The nearest paired record before and after each position, in two linear passes (a
        # generation's decode calls leave thousands of one-sided records: a scan per record was quadratic).
        mine = pair_of[s]
        before_at, after_at, last = [], [None] * len(recs), None
        for r in recs:
            before_at.append(last)
            if r.index in mine:
                last = mine[r.index]
        last = None
        for pos in range(len(recs) - 1, -1, -1):
            after_at[pos] = last
            if recs[pos].index in mine:
                last = mine[recs[pos].index]
        for pos, r in enumerate(recs):
            if r.index in paired[s]:
                continue
            rule = next((x for x in rules if _matches(x, r, fam[other])), None)
            if rule is None and r.call > 0 and (r.canonical, 0) in first_calls[s]:
                rule = {"reason": f"call {r.call} of a module the {other} side runs once (a decode step or a "
                                  "recompute): its activations are stitched onto call 0 along the tokens"}
            before, after = before_at[pos], after_at[pos]
            if rule:
                reason = rule["reason"]
            elif r.role is None:
                reason = "no naming rule explains this module and no module with the same path exists on the other side"
            else:
                reason = f"no {r.role} module at this position on the {other} side"
            out.append(OneSided(s, r.index, rule is not None, reason, namer.is_activation_like(r),
                                before, after))
    return out


# A producer's output (or a parameter) is the canonical holder of a point; consumers' inputs hold
# the same tensor and serve when no producer is dumped.
_PRODUCED = ("out", "param")


def _side_carriers(recs: list[ModuleRecord], layouts: dict) -> tuple[dict[str, Carrier], dict[str, str], set[int]]:
    """One side's holder of each point (in the order points are first carried), the layout of
    each fused point whose module's family declares one, and the records that share a point: one
    carrying a point already held (by itself or an earlier record) or losing one to a producer.
    Every port of any other record holds its point, and no two of its ports carry the same one."""
    best: dict[str, Carrier] = {}
    lay: dict[str, str] = {}
    shared: set[int] = set()
    hold = best.setdefault
    for r in recs:
        fam_layout = (layouts.get(r.family) or {}).get(r.role)
        for port in r.ports:
            # One table operation per port: a wide module's table outgrows the caches.
            c = Carrier(r.index, port.leaf, port.io)
            cur = hold(port.point, c)
            if cur is not c:
                shared.add(r.index)
                if port.io in _PRODUCED and cur.io not in _PRODUCED:
                    best[port.point] = c
                    shared.add(cur.rec)
            if fam_layout and "+" in port.point:
                lay[port.point] = fam_layout
    return best, lay, shared


def _plan_points(sides, holders: dict[str, tuple]) -> tuple[list[PointPlan], dict[str, list[str]], _Held]:
    """Every point comparison by name (direct, composite, stitched over calls), the points left
    unmatched per side, and which leaves the comparisons read (_Held). ``holders``: per side,
    what _side_carriers found."""
    carriers = {s: h[0] for s, h in holders.items()}
    layout_of = {s: h[1] for s, h in holders.items()}
    shared = {s: h[2] for s, h in holders.items()}
    tlay, rlay = layout_of["train"], layout_of["rollout"]
    plans: list[PointPlan] = []
    # Points compared other than directly (stitched, composite); a point both sides hold and
    # compare directly is known as such without a set of hundreds of thousands of names.
    used = {"train": set(), "rollout": set()}

    def add(point, kind, tr, ro, stitched=None):
        axis = "rows" if is_parameter_name(point) or _is_param(point, tr, ro) else "features"
        lt = tlay.get(point) if tlay else None
        lr = rlay.get(point) if rlay else None
        heads = _head_carriers(point, {"train": lt, "rollout": lr}, carriers) if lt or lr else ()
        plans.append(PointPlan("", point, kind, axis, tr, ro, lt, lr, stitched=stitched, heads=heads))

    stitch = _stitch_groups(carriers, sides)
    stitched_calls = {c for _, calls in stitch.values() for c in calls[1:]}
    skip = stitch.keys() | stitched_calls
    ordered, only = _points_in_order(carriers)
    for point, t, r in ordered:
        if skip and point in skip:
            if point in stitched_calls:
                continue
            side, calls = stitch[point]
            other = "rollout" if side == "train" else "train"
            many = [carriers[side][c] for c in calls]
            if point in carriers[other]:
                one = [carriers[other][point]]
                kind = "direct"
            elif "+" in point and all(p in carriers[other] for p in point.split("+")):
                one = [carriers[other][p] for p in point.split("+")]
                kind = "composite"
                used[other].update(point.split("+"))
            else:
                continue
            tr, ro = (many, one) if side == "train" else (one, many)
            add(point, kind, tr, ro, stitched=side)
            used[side].update(calls)
            used[other].add(point)
            continue
        if t is not None and r is not None:
            add(point, "direct", [t], [r])
            continue
        if "+" not in point:
            continue
        parts = point.split("+")
        have, other = ("train", "rollout") if t is not None else ("rollout", "train")
        if all(p in carriers[other] for p in parts):
            fused = [carriers[have][point]]
            split = [carriers[other][p] for p in parts]
            tr, ro = (fused, split) if have == "train" else (split, fused)
            add(point, "composite", tr, ro)
            used[have].add(point)
            used[other].update(parts)
    # Unmatched: a point one side alone carries, or one both carry that was not compared directly
    # (a stitched one), unless it took part in a stitched or composite comparison.
    unmatched = {}
    for s, other in (("train", "rollout"), ("rollout", "train")):
        mine = carriers[s]
        candidates = only[s] + [p for p in skip if p in mine and p in carriers[other]]
        unmatched[s] = sorted(p for p in candidates if p not in used[s])
    return plans, unmatched, _Held(carriers["train"], carriers["rollout"], skip, shared["train"], shared["rollout"])


def _points_in_order(carriers) -> tuple[list[tuple[str, Carrier | None, Carrier | None]], dict[str, list[str]]]:
    """Every point either side carries with its two holders, ordered by the first record carrying
    it on either side, then by name; and the points only one side carries.

    Bucketed by record, each bucket sorted alone, one table lookup per point: a wide module's 300k
    points share one record, and sorting (record, name) keys over tables that outgrow the caches
    was most of the planning."""
    tcar, rcar = carriers["train"], carriers["rollout"]
    buckets: dict[int, list] = {}
    only: dict[str, list[str]] = {"train": [], "rollout": []}
    for point, t in tcar.items():
        r = rcar.get(point)
        if r is None:
            only["train"].append(point)
        rec = t.rec if r is None or t.rec <= r.rec else r.rec
        bucket = buckets.get(rec)
        if bucket is None:
            buckets[rec] = bucket = []
        bucket.append((point, t, r))
    for point, r in rcar.items():
        if point in tcar:
            continue
        only["rollout"].append(point)
        bucket = buckets.get(r.rec)
        if bucket is None:
            buckets[r.rec] = bucket = []
        bucket.append((point, None, r))
    ordered: list[tuple[str, Carrier | None, Carrier | None]] = []
    for rec in sorted(buckets):
        ordered += sorted(buckets[rec], key=itemgetter(0))
    return ordered, only


# Points whose leaves show the head size: the attention kernel's q and k inputs ([..., heads,
# head_dim] in Megatron) and the per-head q/k norm weights ([head_dim], Qwen3-style models).
_HEAD_POINTS = {"q": "q_rot", "k": "k_rot"}
_HEAD_WEIGHTS = ("q_norm.weight", "k_norm.weight")


def _head_carriers(point: str, layout: dict[str, str | None], carriers) -> list[tuple[str, str, Carrier]]:
    """(what, side, leaf) giving the head geometry of a fused qkv point one side lays out per
    group: ``what`` is "q" or "k" (kernel inputs of the grouped side) or "norm" (a norm weight)."""
    grouped = [s for s, lay in layout.items() if lay == "megatron_grouped_qkv"]
    if len(grouped) != 1:
        return []
    first = point.split("+")[0]
    scope, call = first.split(".")[0], first.partition("@")[2]
    suffix = f"@{call}" if call else ""
    found = [(what, grouped[0], carriers[grouped[0]].get(f"{scope}.{name}{suffix}"))
             for what, name in _HEAD_POINTS.items()]
    found += [("norm", s, carriers[s].get(f"{scope}.{name}")) for name in _HEAD_WEIGHTS for s in carriers]
    return [(what, s, c) for what, s, c in found if c is not None]


def _stitch_groups(carriers, sides) -> dict[str, tuple[str, list[str]]]:
    """Activation points one side splits over calls 0..n (prefill then decode steps) while the other
    side computes them in one call: point -> (split side, [point, point@k, ...]), one point per
    record (the loader folds a run of calls alike into one record, so @k follows the calls it holds)."""
    def calls(side: str, point: str) -> int:
        return sides[side][carriers[side][point].rec].calls

    groups = {}
    for side, other in (("rollout", "train"), ("train", "rollout")):
        # A side with no point of a later call has nothing to stitch: one scan of the names
        # instead of two call names built and looked up per point.
        if not any("@" in point for point in carriers[side]):
            continue
        for point, c in carriers[side].items():
            if "@" in point or c.io == "param" or at_call(point, 1) not in carriers[side]:
                continue
            if at_call(point, 1) in carriers[other] or any(at_call(p, 1) in carriers[other]
                                                            for p in point.split("+")):
                continue
            seq, n = [point], 1
            while at_call(point, n) in carriers[side]:
                seq.append(at_call(point, n))
                n += calls(side, at_call(point, n))
            groups.setdefault(point, (side, seq))
    # On a side split over calls, a point whose calls were all alike (an engine's logits, one
    # sampled row per call) is one folded record holding every call: split it the same way.
    for side, other in (("rollout", "train"), ("train", "rollout")):
        spans = {sum(calls(side, p) for p in seq) for s, seq in groups.values() if s == side}
        if len(spans) != 1:
            continue
        total = spans.pop()
        for point, c in carriers[side].items():
            if point in groups or "@" in point or c.io == "param" or calls(side, point) != total:
                continue
            theirs = [p for p in ([point] if point in carriers[other] else point.split("+")) if p in carriers[other]]
            if theirs and all(calls(other, p) == 1 for p in theirs):
                groups[point] = (side, [point])
    return groups


def _is_param(point, tr, ro) -> bool:
    return any(c.io == "param" for c in tr + ro)
