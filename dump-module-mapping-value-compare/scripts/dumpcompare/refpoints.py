"""Reference points: the numpy forward's module outputs named as the mapping plan's points, and
one side judged against them at each planned activation point (``matches_reference``), with the
first point where the side departs. refforward.py runs the forward and simulate.py the fault
hypotheses on top of these. Why the judgement holds: references/reference_forward_evidence.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import points
from .callruns import call_leaves, calls_held
from .naming import ModuleRecord, Namer
from .plan import Carrier, PointPlan
from .records import Entry, Leaf
from .refcalls import judge_calls
from .refjudge import judge_whole


@dataclass
class RefRun:
    """One reference forward: point -> [tokens, features] float32, in the order points appeared."""
    arrays: dict[str, np.ndarray]
    order: dict[str, int]


# Points the derived ones are computed from (_derive): kept whatever the plan compares.
_DERIVE_FROM = ("resid_in", "resid_out", "attn_out", "attn_out_normed", "act_gate", "up")
# The residual stream between layers: what a forward resumed at a layer starts from.
_STREAM = ("resid_in", "resid_out")


def point_arrays(outputs, namer: Namer, base: dict | None = None, keep: set | None = None,
                 on_layer=None) -> RefRun:
    """Name the reference's HF module outputs as the mapping plan's points (``base``: points
    already known, such as the stream a resumed forward starts from; ``keep``: the points to hold,
    all when None). Outputs are named one layer at a time (a layer's later modules decide the
    names of its earlier ones, Gemma's post-attention norm), so memory holds one layer's outputs
    plus the kept points. ``on_layer(arrays)`` is called once each layer's points are named; the
    layer's points but the residual stream are dropped after it, so a caller judging them there
    holds one layer's activations, not the model's."""
    arrays, order = dict(base or {}), {k: i for i, k in enumerate(base or {})}
    wanted = None if keep is None else {p for k in keep for p in k.split("+")} | set(keep)

    def flush(group: list) -> None:
        layer_roles = {(lay, rule["role"]): path for path, _a, lay, _l, rule in group if rule is not None}
        for path, arr, layer, local, rule in group:
            if rule is None:
                continue
            rec = ModuleRecord("reference", 0, path, "module", "forward", path, path, rule["role"], 0, layer, local,
                               rule["role"], rule.get("block", ""), "hf", list(rule.get("parts") or []))
            outs = {f"output.{i}": a for i, a in enumerate(arr)}
            entry = Entry(path, 0, "module", path, rule["role"], "forward", 0, [Leaf(n) for n in outs], 1)
            for port in namer.ports_for(rec, entry, None, layer_roles):
                if port.leaf in outs and (wanted is None or port.point in wanted
                                          or port.point.split(".")[-1] in _DERIVE_FROM):
                    put_point(arrays, order, port.point, outs[port.leaf])
        layer = next((lay for _p, _a, lay, _l, _r in group), None)
        if layer is None:
            return
        _derive(arrays, order, layer)
        if on_layer is not None:
            on_layer(arrays)
            for k in [k for k in arrays if points.layer(k) == layer and k.split(".")[-1] not in _STREAM]:
                del arrays[k]

    group, current = [], object()
    for o in outputs:
        path = namer.strip_wrappers(o.module)
        layer, local, rule = namer.classify(path)
        if layer != current:
            flush(group)
            group, current = [], layer
        arrs = o.array if isinstance(o.array, tuple) else (o.array,)
        group.append((path, tuple(np.asarray(a, dtype=np.float32) for a in arrs), layer, local, rule))
    flush(group)
    return RefRun(arrays, order)


def put_point(arrays: dict, order: dict, point: str, arr: np.ndarray) -> None:
    """Hold ``arr`` as ``point`` as [tokens, features] (the first array named so is kept)."""
    if point not in arrays:
        arrays[point] = arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(-1, 1)
        order[point] = len(order)


def _derive(arrays: dict, order: dict, n: int) -> None:
    """Layer ``n``'s points that are plain sums or products of others (HF computes them inline,
    no module)."""
    L = f"L{n}"
    stream = arrays.get("L0.resid_in" if n == 0 else f"L{n - 1}.resid_out")
    attn = arrays.get(f"{L}.attn_out_normed", arrays.get(f"{L}.attn_out"))
    if stream is not None and attn is not None and stream.shape == attn.shape:
        _put_derived(arrays, order, f"{L}.resid_mid", stream + attn, (f"{L}.attn_out_normed", f"{L}.attn_out"))
    gate, up = arrays.get(f"{L}.act_gate"), arrays.get(f"{L}.up")
    if gate is not None and up is not None and gate.shape == up.shape:
        _put_derived(arrays, order, f"{L}.act_out", gate * up, (f"{L}.act_gate", f"{L}.up"))


def _put_derived(arrays: dict, order: dict, point: str, arr: np.ndarray, sources: tuple) -> None:
    """A derived point, placed in the forward's order right after the last point it is made of
    (it is named after the whole layer, but a module that consumes it runs before the layer ends)."""
    fresh = point not in arrays
    put_point(arrays, order, point, arr)
    if fresh:
        order[point] = max(order[s] for s in sources if s in order) + 0.5


def judge_point(ref: np.ndarray, view, runs: list[Leaf], n_parts: int, tolerances: dict,
                use_tensors: bool, call_ends: list[int] | None = None, stitched: bool = False) -> dict:
    """``matches_reference`` of one side at one point, with the error and how it was measured.

    ``runs``: the side's leaves as loaded (a run of calls folded into one leaf stays one);
    ``stitched``: the side's calls follow one another along the tokens, each run standing for
    the calls it holds. ``call_ends``: the token count after each of the side's forward calls
    (an engine's prefill, then its decode calls). Where the side's leaves hold those calls one by
    one, each call is judged on its own rows and the point departs when any call does: the
    statistics of a fault that starts at a decode call, averaged with the calls before it, can
    fall below tolerance."""
    expand = stitched or (len(runs) == 1 and call_ends is not None and calls_held(runs[0]) == len(call_ends))
    judged = (judge_calls(ref, view, runs, expand, call_ends, n_parts, tolerances, use_tensors)
              if call_ends and len(call_ends) > 1 else None)
    if judged is None:
        leaves = [x for lf in runs for x in call_leaves(lf)] if stitched else runs
        return judge_whole(ref, view, leaves, n_parts, tolerances, use_tensors)
    # Columns indexed by call: a generation judges thousands of calls at every point.
    matches, errors = judged.matches, judged.errors
    bad = [c for c, m in enumerate(matches) if m is False]
    unknown = [c for c, m in enumerate(matches) if m not in (True, False)]
    errs = [e for e in errors if e is not None]
    value = False if bad else "unknown" if unknown else True
    out = {"matches_reference": value, "error": max(errs) if errs else None, "tolerance": judged.tolerance,
           "how": f"{judged.how}, per call", "calls": {"matches_reference": matches, "error": errors},
           "first_call": bad[0] if bad else None}
    if unknown and not bad:
        out["detail"] = f"{len(unknown)} of {len(matches)} calls could not be judged"
    return out


def call_groups(leaves: list[Leaf], ref: np.ndarray, call_ends: list[int]):
    """[(leaves of call c, reference rows of call c)] when the side's leaves hold its calls one by
    one (stitched calls, or one leaf with a row of statistics per call); None otherwise. A call
    holding one row of a point the reference holds for every token (the logits an engine keeps for
    the sampled position) is held to the last row of its span."""
    if call_ends[-1] != len(ref):
        return None
    starts = [0] + call_ends[:-1]
    if len(leaves) == 1 and calls_held(leaves[0]) == len(call_ends):
        leaves = call_leaves(leaves[0])         # one leaf with a row of statistics per call
    if len(leaves) != len(call_ends):
        return None
    groups = [[lf] for lf in leaves]
    width = ref.shape[1]
    out = []
    for group, s, e in zip(groups, starts, call_ends):
        n = sum(lf.numel or 0 for lf in group)
        if n == (e - s) * width:
            out.append((group, ref[s:e]))
        elif n == width:
            out.append((group, ref[e - 1:e]))
        else:
            return None
    return out


def point_reference(run: RefRun, point: str) -> np.ndarray | None:
    """The reference tensor of a (possibly fused) point: its parts side by side."""
    if point in run.arrays:            # a fused output the reference yields whole (Phi-3's qkv_proj)
        return run.arrays[point]
    parts = [run.arrays.get(p) for p in point.split("+")]
    if any(p is None for p in parts) or len({p.shape[0] for p in parts}) != 1:
        return None
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def compare_side(run: RefRun, plans, side: str, view, tolerances: dict, use_tensors: bool,
                 call_ends: list[int] | None = None) -> dict:
    """cid -> judgement of every activation point of ``side`` the reference computes.

    ``call_ends``: the token count after each of the side's calls. A point holding one row per call
    (the logits an engine keeps for the last token of each forward) is compared with those rows."""
    out = {}
    for p in plans:
        if p.axis != "features":
            continue
        ref = point_reference(run, p.point)
        if ref is None:
            continue
        runs = [view.leaves[c.rec].get(c.leaf) for c in getattr(p, side)]
        if not runs or None in runs or all(lf.numel is None for lf in runs):
            continue
        # Calls are told apart only where the plan holds them one by one (stitched) or folded.
        stitched = p.stitched == side
        by_call = stitched or (len(runs) == 1 and runs[0].per_call is not None)
        ends = call_ends if by_call or (call_ends and len(call_ends) == 1) else None
        held = sum((lf.numel or 0) * calls_held(lf) for lf in runs)
        if ends and len(ends) == 1 and held != ref.size and held == ref.shape[1] and ends[0] == len(ref):
            ref, ends = ref[-1:], None      # one call, of which the side keeps the sampled row only
        out[p.cid] = judge_point(ref, view, runs, len(p.point.split("+")), tolerances, use_tensors, ends, stitched)
    return out


def _place(run: RefRun, point: str) -> float:
    """Where a point stands in the forward's order: a fused point where its last part does, or where
    the reference yields it whole (Phi-3's checkpoint fuses qkv_proj and gate_up_proj)."""
    if point in run.order:
        return run.order[point]
    return max(run.order.get(x, 1 << 30) for x in point.split("+"))


def one_sided_plans(plans, recs: dict) -> list[PointPlan]:
    """Activation points only one side's modules output (an engine's rotary module and attention
    kernel: HF computes both inline), as plans whose other side is empty, so that each side is held
    to the reference there too: a rope or attention-scale fault then departs at the rotated q/k or
    at the kernel's output, before the projection that follows. Only a point one module outputs is
    taken, its calls in order (cids ``R<side initial><n>``)."""
    planned = {p.point for p in plans}
    out = []
    for side in ("train", "rollout"):
        found: dict[str, dict[str, list[Carrier]]] = {}
        for r in recs[side]:
            if r.kind != "module" or r.direction != "forward":
                continue
            for port in r.ports:
                pt = points.without_call(port.point)     # the module's calls, one after another
                if port.io == "out" and pt not in planned and "+" not in pt and pt[:2] not in ("pa", "al"):
                    found.setdefault(pt, {}).setdefault(r.path, []).append(Carrier(r.index, port.leaf, port.io))
        one = sorted((pt, next(iter(by.values()))) for pt, by in found.items() if len(by) == 1)
        for i, (pt, carriers) in enumerate(one):
            train, rollout = (carriers, []) if side == "train" else ([], carriers)
            out.append(PointPlan(f"R{side[0]}{i:04d}", pt, "direct", "features", train, rollout,
                                 stitched=side if len(carriers) > 1 else None))
    return out


def departure(plans, judged: dict, run: RefRun) -> dict | None:
    """The first point (in the forward's order) where a side's values leave the reference."""
    bad = [p for p in plans if judged.get(p.cid, {}).get("matches_reference") is False]
    if not bad:
        return None
    # At one place in the forward a part (v, as the attention receives it) names the fault more
    # closely than the fused output that ends with it.
    first = min(bad, key=lambda p: (_place(run, p.point), p.point.count("+"), p.cid))
    j = judged[first.cid]
    return {"cid": first.cid, "point": first.point, "layer": points.layer(first.point), "error": j["error"],
            "tolerance": j["tolerance"], "how": j["how"], "call": j.get("first_call"),
            "calls": len(j["calls"]["matches_reference"]) if j.get("calls") else None}
