"""Both sides held against a numpy forward of the checkpoint (output_3/4 ``reference_forward``).

The reference engine (refmodel/) runs the checkpoint on the tokens a side ran and yields every
Hugging Face module's output. Each output is named with the hf naming profile, as if it were an
HF dump, which gives the logical points the mapping plan compares; a point the HF modules do not
output directly is derived where its definition is plain arithmetic of others (the residual
stream after attention, the gated MLP product). For every planned activation point, the side's
statistics (all its carriers and calls combined) are compared with the same four statistics of the
reference tensor rounded to the side's dtype. Max/Min/Mean/Norm do not depend on the order of the
elements, so a fused or Megatron-interleaved layout needs no rearranging in statistics mode; in
tensor mode the tensors are compared token by token (rows sorted when the side's fused layout
orders features differently). The first point where a side departs is where its fault starts; the
side that departs nowhere matches the checkpoint. Why: references/reference_forward_evidence.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .arrays import leaf_array, rel_error, to_dtype
from .compare.stats import Stats, combine, stat_errors
from .compare.tensors import as_tokens
from .naming import ModuleRecord, Namer
from .records import Entry, Leaf
from .token_ids import TokenIds, recover, side_carriers
from .tolerances import dtype_key, pair_tolerances

SIDES = ("train", "rollout")
SCHEMA = "1.0"
# The reference forward's precision per side dtype (refmodel.forward ``dtype``).
FORWARD_DTYPE = {"bfloat16": "bf16"}


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
            entry = Entry(path, 0, "module", path, rule["role"], "forward", 0, [Leaf("output.0")], 1)
            for port in namer.ports_for(rec, entry, None, layer_roles):
                if port.leaf == "output.0" and (wanted is None or port.point in wanted
                                                or port.point.split(".")[-1] in _DERIVE_FROM):
                    _put(arrays, order, port.point, arr)
        layer = next((lay for _p, _a, lay, _l, _r in group), None)
        if layer is None:
            return
        _derive(arrays, order, layer)
        if on_layer is not None:
            on_layer(arrays)
            for k in [k for k in arrays if point_layer(k) == layer and k.split(".")[-1] not in _STREAM]:
                del arrays[k]

    group, current = [], object()
    for o in outputs:
        path = namer.strip_wrappers(o.module)
        layer, local, rule = namer.classify(path)
        if layer != current:
            flush(group)
            group, current = [], layer
        group.append((path, np.asarray(o.array, dtype=np.float32), layer, local, rule))
    flush(group)
    return RefRun(arrays, order)


def _put(arrays: dict, order: dict, point: str, arr: np.ndarray) -> None:
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
        _put(arrays, order, f"{L}.resid_mid", stream + attn)
    gate, up = arrays.get(f"{L}.act_gate"), arrays.get(f"{L}.up")
    if gate is not None and up is not None and gate.shape == up.shape:
        _put(arrays, order, f"{L}.act_out", gate * up)


def _leaf_calls(leaf: Leaf) -> list[Stats]:
    rows = leaf.per_call if leaf.per_call is not None and len(leaf.per_call) > 1 else None
    if rows is None:
        return [Stats(leaf.max, leaf.min, leaf.mean, leaf.norm, leaf.numel, leaf.dtype)]
    return [Stats(*[None if math.isnan(v) else float(v) for v in row], leaf.numel, leaf.dtype) for row in rows]


def _ref_stats(a: np.ndarray, dtype: str) -> Stats:
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
                use_tensors: bool) -> dict:
    """``matches_reference`` of one side at one point, with the error and how it was measured."""
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
    stats = combine([s for lf in leaves for s in _leaf_calls(lf)])
    if stats.numel is not None and stats.numel != ref.size:
        return {"matches_reference": "unknown", "error": None, "tolerance": None, "how": "statistics",
                "detail": f"the side holds {stats.numel} values, the reference {ref.size} (tokens or slice differ)"}
    tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
    err = stat_errors(stats, _ref_stats(ref, dtype)).get("scaled_error")
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
        leaves = [view.leaves[c.rec].get(c.leaf) for c in getattr(p, side)]
        if ref is None or not leaves or None in leaves or all(lf.numel is None for lf in leaves):
            continue
        held = sum((lf.numel or 0) * (len(lf.per_call) if lf.per_call is not None else 1) for lf in leaves)
        if call_ends and held != ref.size and held == len(call_ends) * ref.shape[1] and call_ends[-1] == len(ref):
            ref = ref[[e - 1 for e in call_ends]]
        out[p.cid] = judge_point(ref, view, leaves, len(p.point.split("+")), tolerances, use_tensors)
    return out


def departure(plans, judged: dict, run: RefRun) -> dict | None:
    """The first point (in the forward's order) where a side's values leave the reference."""
    bad = [p for p in plans if judged.get(p.cid, {}).get("matches_reference") is False]
    if not bad:
        return None
    first = min(bad, key=lambda p: (max(run.order.get(x, 1 << 30) for x in p.point.split("+")), p.cid))
    j = judged[first.cid]
    return {"cid": first.cid, "point": first.point, "layer": point_layer(first.point), "error": j["error"],
            "tolerance": j["tolerance"], "how": j["how"]}


def point_layer(point: str) -> int | None:
    """The layer a point belongs to (``L3.up`` -> 3); None for a model-level point (``M.logits``)."""
    head = point.split(".")[0]
    return int(head[1:]) if head.startswith("L") and head[1:].isdigit() else None


def run(plans, views: dict, recs: dict, refs: dict, namer: Namer, tolerances: dict, use_tensors: bool,
        given: list[int] | None, results=()) -> dict:
    """The ``reference_forward`` section: tokens per side, per-point agreement, departures and the
    fault hypotheses tested at each departure."""
    from . import refmodel  # the numpy engine; imported here so that a run without --model never loads it
    from .simulate import hypotheses, own_weights
    doc = {"schema_version": SCHEMA, "ran": False, "reason": None, "family": None, "tokens": {}, "sides": {},
           "points": {}, "hypotheses": []}
    ref = next(refs[s] for s in SIDES if refs.get(s))
    doc["family"] = refmodel.family(ref.config)
    if doc["family"] is None:
        doc["reason"] = f"model_type {ref.config.get('model_type')!r} is not a family the reference forward supports"
        doc["verdict"] = verdict(doc)
        return doc
    judged, found = {}, {}
    needed = {p.point for p in plans if p.axis == "features"}
    for s in SIDES:
        r = refs.get(s)
        if r is None:
            continue
        carriers = side_carriers(plans, s, recs[s], views[s].leaves)
        emb_name = r.points.get("M.embed.weight")
        embedding = r.checkpoint.read(emb_name) if emb_name else None
        dtype = dtype_key(carriers["embed"][0].dtype) if carriers["embed"] else "float32"
        found[s] = (carriers, embedding, dtype, recover(carriers, views[s], embedding, given, use_tensors,
                                                        tolerances["statistics"].get(dtype, tolerances["statistics"]["default"])))
    _share(found)
    todo: dict[tuple, list[str]] = {}     # one forward per (checkpoint, tokens, precision), shared by the sides
    ends: dict[str, list[int] | None] = {}
    for s, (carriers, embedding, dtype, toks) in found.items():
        r = refs[s]
        doc["tokens"][s] = toks.to_json()
        if not toks.unique:
            doc["sides"][s] = {"ran": False, "reason": f"token ids not recovered: {toks.detail}"}
            continue
        fdt = FORWARD_DTYPE.get(dtype, "fp32")
        rows = embedding.shape[0] if embedding is not None else None
        if rows is not None and max(toks.ids) >= rows:
            doc["sides"][s] = {"ran": False, "reason": f"token id {max(toks.ids)} is beyond the checkpoint's "
                                                       f"{rows} embedding rows (another checkpoint or tokenizer)"}
            continue
        ends[s] = [int(e) for e in np.cumsum([c["tokens"] for c in toks.calls])] \
            if all(c.get("tokens") for c in toks.calls) else None
        todo.setdefault((id(r), tuple(toks.ids), fdt), []).append(s)
    for (_r, ids, fdt), sides in todo.items():
        r, ids = refs[sides[0]], np.asarray(ids, dtype=np.int64)
        for s in sides:
            judged[s] = {}

        def judge(arrays: dict, sides=sides) -> None:
            # Each layer's points are judged as soon as they are named, then dropped (point_arrays).
            now = RefRun(arrays, {})
            for s in sides:
                left = [p for p in plans if p.cid not in judged[s]]
                judged[s].update(compare_side(now, left, s, views[s], tolerances, use_tensors, ends[s]))
        try:
            run_ = point_arrays(refmodel.forward(r.checkpoint, r.config, ids, dtype=fdt), namer, keep=needed,
                                on_layer=judge)
        except (refmodel.UnsupportedModel, ValueError) as exc:
            for s in sides:
                del judged[s]
                doc["sides"][s] = {"ran": False, "reason": f"the reference forward cannot run this model: {exc}"}
            continue
        head = run_.arrays.get("M.logits")
        if head is not None:
            # What an engine's logits processor returns: the head's output after Gemma 2's final
            # softcapping (the vllm profile's M.logits_out).
            _put(run_.arrays, run_.order, "M.logits_out", refmodel.final_logits(r.config, head, fdt))
        judge(run_.arrays)               # the points outside the layers (embedding, final norm, logits)
        for s in sides:
            dep = departure(plans, judged[s], run_)
            agree = sum(j["matches_reference"] is True for j in judged[s].values())
            doc["sides"][s] = {"ran": True, "forward_dtype": fdt, "points": len(judged[s]), "matching": agree,
                               "departure": dep, "matches_everywhere": dep is None and bool(judged[s])}
            if dep is not None:
                own = own_weights(results, plans, s, views[s], dep["layer"], r.checkpoint) if use_tensors else []
                doc["hypotheses"].append(hypotheses(refmodel, r, run_, ids, fdt, dep, plans, s, views[s],
                                                    judged[s], tolerances, use_tensors, namer, ends[s], own))
    doc["ran"] = bool(judged)
    if not judged:
        doc["reason"] = "; ".join(f"{s}: {v['reason']}" for s, v in doc["sides"].items()) or "no side to run"
    doc["points"] = {cid: {s: judged[s][cid] for s in judged if cid in judged[s]}
                     for cid in sorted({c for j in judged.values() for c in j})}
    doc["verdict"] = verdict(doc)
    return doc


def _share(found: dict) -> None:
    """A side whose ids stay unknown takes the other side's when both ran the same number of tokens
    and its own ids statistics (each call's Min and Max) hold them: the train forward of a rollout's
    prompt and sampled tokens, whose decode steps named the sampled ones."""
    for s, (carriers, emb, dtype, toks) in list(found.items()):
        other = next((found[o][3] for o in found if o != s and found[o][3].unique), None)
        if toks.unique or other is None or not toks.calls:
            continue
        counts = [c.get("tokens") for c in toks.calls]
        if None in counts or sum(counts) != len(other.ids):
            continue
        pos, calls = 0, []
        for c, n in zip(toks.calls, counts):
            part = other.ids[pos:pos + n]
            pos += n
            known = c.get("known") or ([min(c["ids"]), max(c["ids"])] if c.get("ids") else [])
            if known and (min(part), max(part)) != (known[0], known[-1]):
                break
            calls.append({**c, "ids": part, "unique": True, "how": c["how"] if c["unique"] else "other side"})
        else:
            found[s] = (carriers, emb, dtype, TokenIds(list(other.ids), "other side", True,
                                                       f"{len(other.ids)} token(s) of the other side, which ran as many "
                                                       f"and whose ids fit this side's ids statistics", calls))


def summary(doc: dict | None) -> dict | None:
    """output_4 ``reference_forward``: the section without its per-point records."""
    if doc is None:
        return None
    return {k: v for k, v in doc.items() if k != "points"}


def verdict(doc: dict) -> dict:
    """Which side the reference says is at fault, and why (read by the root-cause step)."""
    sides = doc.get("sides", {})
    ran = [s for s in SIDES if sides.get(s, {}).get("ran")]
    departs = [s for s in ran if sides[s]["departure"]]
    if len(ran) < 2:
        return {"side": "undetermined", "reason": "the reference ran for fewer than two sides"}
    if not departs:
        return {"side": "neither", "reason": "both sides match the reference at every compared point"}
    if len(departs) == 2:
        a, b = (sides[s]["departure"] for s in SIDES)
        if a["point"] == b["point"]:
            return {"side": "undetermined",
                    "reason": f"both sides leave the reference at {a['point']}: the checkpoint, config or tokens "
                              "are probably not what the engines ran"}
        first = min(SIDES, key=lambda s: (sides[s]["departure"]["layer"] if sides[s]["departure"]["layer"]
                                          is not None else 1 << 30))
        return {"side": "both", "reason": f"train leaves the reference at {a['point']}, rollout at {b['point']}",
                "first": first}
    s = departs[0]
    other = "rollout" if s == "train" else "train"
    return {"side": s, "reason": f"{s} leaves the reference at {sides[s]['departure']['point']}; {other} matches "
                                 f"it at all {sides[other]['points']} compared points"}
