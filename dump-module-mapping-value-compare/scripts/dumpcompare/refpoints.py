"""Reference points: the numpy forward's module outputs named as the mapping plan's points, and
one side judged against them at each planned activation point (``matches_reference``), with the
first point where the side departs. refforward.py runs the forward and simulate.py the fault
hypotheses on top of these. Why the judgement holds: references/reference_forward_evidence.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import points
from .arrays import leaf_array, rel_error, to_dtype
from .callruns import call_leaves, calls_held, side_leaves
from .compare.stats import Stats, combine, stat_error_calls, stat_errors
from .compare.tensors import as_tokens
from .dtypes import dtype_key
from .naming import ModuleRecord, Namer
from .plan import Carrier, PointPlan
from .records import Entry, Leaf
from .tolerances import pair_tolerances


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


def leaf_calls(leaf: Leaf) -> list[Stats]:
    rows = leaf.per_call if leaf.per_call is not None and len(leaf.per_call) > 1 else None
    if rows is None:
        return [Stats(leaf.max, leaf.min, leaf.mean, leaf.norm, leaf.numel, leaf.dtype)]
    return [Stats(*[None if math.isnan(v) else float(v) for v in row], leaf.numel, leaf.dtype) for row in rows]


def ref_stats(a: np.ndarray, dtype: str) -> Stats:
    """Max/Min/Mean/Norm of a reference tensor rounded to the side's dtype."""
    w = to_dtype(a, dtype).astype(np.float64)
    return Stats(float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt(np.sum(w * w))), int(w.size), dtype)


def _side_tensor(view, leaves: list[Leaf], n_parts: int) -> np.ndarray | None:
    """The side's tensor as [tokens, features]: parts side by side, steps one after another."""
    if any(lf.per_call is not None or not lf.data_name for lf in leaves):
        return None
    arrays = [leaf_array(view, lf) for lf in leaves]
    if any(a is None for a in arrays):
        return None
    rows = [as_tokens(a, view.family) for a in arrays]
    if n_parts > 1 and len(rows) == n_parts:
        return np.concatenate(rows, axis=1) if len({r.shape[0] for r in rows}) == 1 else None
    return np.concatenate(rows, axis=0) if len({r.shape[1] for r in rows}) == 1 else None


def judge_point(ref: np.ndarray, view, leaves: list[Leaf], n_parts: int, tolerances: dict,
                use_tensors: bool, call_ends: list[int] | None = None) -> dict:
    """``matches_reference`` of one side at one point, with the error and how it was measured.

    ``call_ends``: the token count after each of the side's forward calls (an engine's prefill,
    then its decode calls). Where the side's leaves hold those calls one by one, each call is
    judged on its own rows and the point departs when any call does: the statistics of a fault
    that starts at a decode call, averaged with the calls before it, can fall below tolerance."""
    per_call = call_groups(leaves, ref, call_ends) if call_ends and len(call_ends) > 1 else None
    if per_call is None:
        return _judge_whole(ref, view, leaves, n_parts, tolerances, use_tensors)
    judged = _judge_calls(per_call, view, n_parts, tolerances, use_tensors)
    # Columns indexed by call: a generation judges thousands of calls at every point.
    matches = [j["matches_reference"] for j in judged]
    errors = [j["error"] for j in judged]
    bad = [c for c, m in enumerate(matches) if m is False]
    unknown = [c for c, m in enumerate(matches) if m not in (True, False)]
    errs = [e for e in errors if e is not None]
    value = False if bad else "unknown" if unknown else True
    out = {"matches_reference": value, "error": max(errs) if errs else None, "tolerance": judged[-1]["tolerance"],
           "how": f"{judged[-1]['how']}, per call", "calls": {"matches_reference": matches, "error": errors},
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


def _judge_calls(per_call: list, view, n_parts: int, tolerances: dict, use_tensors: bool) -> list[dict]:
    """:func:`_judge_whole` of every call of ``per_call``, with the calls that hold one leaf of all
    four statistics (a generation's decode calls) judged in batches of the same dtype and size:
    one numpy pass per batch instead of one per call. The judgements are the same."""
    out: list = [None] * len(per_call)
    batches: dict[tuple, list[int]] = {}
    for c, (group, rows) in enumerate(per_call):
        lf = group[0]
        one = len(group) == 1 and (lf.per_call is None or len(lf.per_call) <= 1)
        if one and (not use_tensors or not lf.data_name) and lf.numel == rows.size \
                and None not in (lf.max, lf.min, lf.mean, lf.norm):
            batches.setdefault((dtype_key(lf.dtype), lf.numel, rows.shape), []).append(c)
        else:
            out[c] = _judge_whole(rows, view, group, n_parts, tolerances, use_tensors)
    for (dtype, numel, shape), idx in batches.items():
        if len(idx) == 1:
            c = idx[0]
            out[c] = _judge_whole(per_call[c][1], view, per_call[c][0], n_parts, tolerances, use_tensors)
            continue
        leaves = [per_call[c][0][0] for c in idx]
        side = Stats(*[np.array([getattr(lf, a) for lf in leaves], dtype=np.float64)
                       for a in ("max", "min", "mean", "norm")], numel, leaves[0].dtype)
        w = to_dtype(np.stack([per_call[c][1] for c in idx]).reshape(len(idx), -1), dtype).astype(np.float64)
        ref = Stats(w.max(axis=1), w.min(axis=1), w.mean(axis=1), np.sqrt(np.sum(w * w, axis=1)), numel, dtype)
        tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
        errs = stat_error_calls(side, ref)["scaled_error"]
        for c, e in zip(idx, errs):
            err = None if math.isnan(e) else float(e)
            out[c] = ({"matches_reference": "unknown", "error": None, "tolerance": tol, "how": "statistics",
                       "detail": "no statistics to compare"} if err is None else
                      {"matches_reference": bool(err <= tol), "error": err, "tolerance": tol, "how": "statistics"})
    return out


def _judge_whole(ref: np.ndarray, view, leaves: list[Leaf], n_parts: int, tolerances: dict,
                 use_tensors: bool) -> dict:
    """One judgement over all the leaves together (every call's rows as one tensor)."""
    dtype = dtype_key(leaves[0].dtype)
    side = _side_tensor(view, leaves, n_parts) if use_tensors else None
    if side is not None and side.size == ref.size:
        side = side.reshape(ref.shape) if side.shape != ref.shape else side
        tol = tolerances["tensor"]["rel_l2"].get(dtype, tolerances["tensor"]["rel_l2"]["default"])
        rounded = to_dtype(ref, dtype).astype(np.float64)
        err, how = rel_error(side.astype(np.float64), rounded), "tensor"
        if err > tol and n_parts > 1:
            # A fused layout orders each token's features its own way: compare the sorted rows.
            err, how = min(err, rel_error(np.sort(side, axis=1), np.sort(rounded, axis=1))), "tensor, rows sorted"
        return {"matches_reference": bool(err <= tol), "error": err, "tolerance": tol, "how": how}
    stats = combine([s for lf in leaves for s in leaf_calls(lf)])
    if stats.numel is not None and stats.numel != ref.size:
        return {"matches_reference": "unknown", "error": None, "tolerance": None, "how": "statistics",
                "detail": f"the side holds {stats.numel} values, the reference {ref.size} (tokens or slice differ)"}
    tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
    err = stat_errors(stats, ref_stats(ref, dtype)).get("scaled_error")
    if err is None:
        return {"matches_reference": "unknown", "error": None, "tolerance": tol, "how": "statistics",
                "detail": "no statistics to compare"}
    return {"matches_reference": bool(err <= tol), "error": err, "tolerance": tol, "how": "statistics"}


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
        leaves = side_leaves(view.leaves, getattr(p, side), p.stitched == side)
        if not leaves or None in leaves or all(lf.numel is None for lf in leaves):
            continue
        # Calls are told apart only where the plan holds them one by one (stitched) or folded.
        by_call = p.stitched == side or (len(leaves) == 1 and leaves[0].per_call is not None)
        ends = call_ends if by_call or (call_ends and len(call_ends) == 1) else None
        held = sum((lf.numel or 0) * (len(lf.per_call) if lf.per_call is not None else 1) for lf in leaves)
        if ends and len(ends) == 1 and held != ref.size and held == ref.shape[1] and ends[0] == len(ref):
            ref, ends = ref[-1:], None      # one call, of which the side keeps the sampled row only
        out[p.cid] = judge_point(ref, view, leaves, len(p.point.split("+")), tolerances, use_tensors, ends)
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
