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

import numpy as np

from .dtypes import dtype_key
from .naming import Namer
from .refpoints import RefRun, compare_side, departure, one_sided_plans, point_arrays, put_point
from .simulate import hypotheses, own_weights
from .skips import Skip
from .token_ids import TokenIds, recover, side_carriers

SIDES = ("train", "rollout")
SCHEMA = "1.0"
# The reference forward's precision per side dtype (refmodel.forward ``dtype``).
FORWARD_DTYPE = {"bfloat16": "bf16"}


def _not_run(code: str, reason: str) -> dict:
    """A side the reference forward did not run, with its typed skip record."""
    return {"ran": False, "reason": reason, "skip": Skip(code, reason)}


def run(plans, views: dict, recs: dict, refs: dict, namer: Namer, tolerances: dict, use_tensors: bool,
        given: list[int] | None, results=()) -> dict:
    """The ``reference_forward`` section: tokens per side, per-point agreement, departures and the
    fault hypotheses tested at each departure."""
    from . import refmodel  # the numpy engine; imported here so that a run without --model never loads it
    doc = {"schema_version": SCHEMA, "ran": False, "reason": None, "skip": None, "family": None, "tokens": {},
           "sides": {}, "points": {}, "hypotheses": []}
    ref = next(refs[s] for s in SIDES if refs.get(s))
    doc["family"] = refmodel.family(ref.config)
    if doc["family"] is None:
        doc["reason"] = f"model_type {ref.config.get('model_type')!r} is not a family the reference forward supports"
        doc["skip"] = Skip("family_unsupported", doc["reason"])
        doc["verdict"] = verdict(doc)
        return doc
    judged, found = {}, {}
    plans = list(plans) + one_sided_plans(plans, recs)
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
            doc["sides"][s] = _not_run("token_ids_unknown", f"token ids not recovered: {toks.detail}")
            continue
        fdt = FORWARD_DTYPE.get(dtype, "fp32")
        rows = embedding.shape[0] if embedding is not None else None
        if rows is not None and max(toks.ids) >= rows:
            doc["sides"][s] = _not_run("token_beyond_vocab", f"token id {max(toks.ids)} is beyond the checkpoint's "
                                       f"{rows} embedding rows (another checkpoint or tokenizer)")
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
            outputs = refmodel.forward(r.checkpoint, r.config, ids, dtype=fdt, engine_points=True)
            run_ = point_arrays(outputs, namer, keep=needed, on_layer=judge)
        except (refmodel.UnsupportedModel, ValueError) as exc:
            for s in sides:
                del judged[s]
                doc["sides"][s] = _not_run("forward_unsupported", f"the reference forward cannot run this model: {exc}")
            continue
        head = run_.arrays.get("M.logits")
        if head is not None:
            # What an engine's logits processor returns: the head's output after Gemma 2's final
            # softcapping (the vllm profile's M.logits_out).
            put_point(run_.arrays, run_.order, "M.logits_out", refmodel.final_logits(r.config, head, fdt))
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
        # One code for the section: the first side's (each side keeps its own).
        doc["skip"] = next((v["skip"] for v in doc["sides"].values()), Skip("no_side", doc["reason"]))
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
    """Which side the reference says is at fault, and why (output_3/4 ``reference_forward.verdict``).
    The one reading of the departures: the root-cause step takes a finding's side from it (its
    sides.side_from_forward) instead of reading the departures again."""
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
