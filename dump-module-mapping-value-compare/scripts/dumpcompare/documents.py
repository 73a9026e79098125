"""Build the four output documents (plain dicts and table rows) from the pipeline's records."""
from __future__ import annotations

import itertools
from collections import Counter

from . import vocabulary
from .analysis import RANK_MEANINGS, ModuleVerdict
from .compare import Result
from .compare.logprob import LOGITS_POINT
from .compare.sides import as_dict
from .plan import MappingPlan
from .points import is_parameter_name
from .naming import ModuleRecord
from .outputs import Records, fmt
from .records import BACKWARD, FORWARD, PARAM_GRAD, Dump
from .safetext import markdown
from .tolerances import BOUNDED, CLEAN

TOP_CANDIDATES = 5   # rank 1-2 modules listed above output_4's table; the rest are in the table
# Skip codes that mean the two sides hold tensors of different sizes (comparability's size test).
SIZE_CODES = ("shape_conflict", "tp_shard")


def source_info(dump: Dump, family: str, plan=None, layout=None) -> dict:
    """What was read for one side, including salvage and notes (marks partial analyses).

    ``plan`` is the side's part of the input plan (loaders/inputs.py) and ``layout`` how its ranks
    were merged (unshard.rank_relation); ``files`` lists every dump file read, step by step.
    """
    sal = dump.salvage
    return {
        "path": str(dump.path),
        "files": [str(f) for f in plan.files] if plan else [str(dump.path)],
        "steps": [st.step for st in plan.steps] if plan else [None],
        "ranks": [f.rank for f in plan.steps[0].files] if plan else [None],
        "rank_layout": None if layout is None else {"kind": layout.kind, "stages": [list(g) for g in layout.stages],
                                                    "layer_offsets": list(layout.offsets),
                                                    **({"units": [list(u) for u in layout.units]} if layout.units else {})},
        "format": dump.fmt, "task": dump.task, "level": dump.level,
        "framework": dump.framework, "family": family, "entries": len(dump.entries),
        "partial": sal is not None, "folded_calls": dump.folded,
        "salvage": None if sal is None else {
            "byte_offset": sal.byte_offset, "last_complete_key": sal.last_complete_key,
            "entries_recovered": sal.entries_recovered, "reason": sal.reason},
        "skipped_keys": dump.skipped_keys[:50], "skipped_key_count": len(dump.skipped_keys),
        "notes": dump.notes,
    }


def record_row(r: ModuleRecord) -> dict:
    """output_1 record of one entry."""
    return {
        "index": r.index, "key": r.key, "kind": r.kind, "direction": r.direction, "path": r.path,
        "raw_path": r.raw_path, "class": r.cls, "call": r.call, "calls": r.calls, "layer": r.layer, "block": r.block,
        "role": r.role, "family": r.family, "fused_parts": r.parts, "is_wrapper": r.is_wrapper,
        "explained": r.role is not None or r.kind == "api",
        "ports": [{"leaf": p.leaf, "point": p.point, "io": p.io} for p in r.ports],
    }


def output_1(sources: dict, recs: dict[str, list[ModuleRecord]]) -> tuple[dict, list]:
    """Key mapping: every entry of each side, parsed and normalised (records and rows are made as
    they are written)."""
    doc = {"sources": sources}
    for side, rs in recs.items():
        doc[side] = Records(record_row, rs)
        doc[f"{side}_unexplained"] = [r.key for r in rs if r.role is None and r.kind == "module"]
        doc[f"{side}_counts"] = dict(Counter(f"{r.kind}:{r.direction}" for r in rs))
    rows = ([side, r.index, r.key, r.kind, r.direction, r.path, r.cls, r.call, r.calls, r.layer,
             r.block, r.role or "", r.family, r.parts, r.is_wrapper] for side, rs in recs.items() for r in rs)
    header = ["side", "index", "key", "kind", "direction", "path", "class", "call", "calls", "layer", "block",
              "role", "family", "fused_parts", "is_wrapper"]
    return doc, [header, rows]


def _count(rs: list[ModuleRecord], direction: str) -> int:
    return sum(1 for r in rs if r.kind == "module" and r.direction == direction)


def _one_sided_record(o, r: ModuleRecord) -> dict:
    """The fields output_2 and output_4 share for one one-sided module (``key`` identifies it)."""
    return {"side": o.side, "module": r.path, "key": r.key, "class": r.cls, "layer": r.layer, "block": r.block,
            "role": r.role, "index": r.index, "expected": o.expected, "reason": o.reason,
            "activation_like": o.activation_like, "before_pair": o.before_pair, "after_pair": o.after_pair,
            "pass_through": o.pass_through}


def _stitched_calls(plan: MappingPlan, recs: list[ModuleRecord], side: str, mapped: set) -> int:
    """Calls of mapped modules that are stitched onto their first call: later calls left one-sided,
    and the later calls inside a folded record whose points are stitched."""
    later = sum(recs[o.rec].calls for o in plan.one_sided if o.side == side and recs[o.rec].path in mapped)
    first = {c.rec for p in plan.comparisons if p.stitched == side for c in getattr(p, side)[:1]}
    return later + sum(recs[i].calls - 1 for i in first)


def output_2(plan: MappingPlan, train: list[ModuleRecord], rollout: list[ModuleRecord]) -> tuple[dict, list]:
    """Mapping plan: pairs, one-sided modules, planned comparisons and the required summary."""
    recs = {"train": train, "rollout": rollout}
    fwd = {s: [r for r in rs if r.kind == "module" and r.direction == FORWARD] for s, rs in recs.items()}
    # Counts are of modules, not calls: the decode steps of a rollout call every module again, and
    # a later call of a mapped module is stitched onto its call 0 (``stitched_calls``).
    modules = {s: {r.path for r in rs} for s, rs in fwd.items()}
    mapped = {"train": {train[i].path for p in plan.pairs for i in p.train},
              "rollout": {rollout[i].path for p in plan.pairs for i in p.rollout}}
    one = {s: [o for o in plan.one_sided if o.side == s and recs[s][o.rec].path not in mapped[s]] for s in recs}
    only = {s: {recs[s][o.rec].path for o in one[s]} for s in recs}
    summary = {
        "train_modules": len(modules["train"]), "rollout_modules": len(modules["rollout"]),
        "train_calls": sum(r.calls for r in fwd["train"]), "rollout_calls": sum(r.calls for r in fwd["rollout"]),
        "mapped_train_modules": len(mapped["train"]), "mapped_rollout_modules": len(mapped["rollout"]),
        "train_only": len(only["train"]), "rollout_only": len(only["rollout"]),
        "train_only_unexpected": len({recs["train"][o.rec].path for o in one["train"] if not o.expected}),
        "rollout_only_unexpected": len({recs["rollout"][o.rec].path for o in one["rollout"] if not o.expected}),
        "stitched_calls": {s: _stitched_calls(plan, recs[s], s, mapped[s])
                           for s in recs},
        "pairs": len(plan.pairs), "pairs_by_kind": dict(Counter(p.kind for p in plan.pairs)),
        "pairs_by_alignment": dict(Counter(p.aligned_by for p in plan.pairs)),
        "comparisons": len(plan.comparisons),
        "train_coverage": len(mapped["train"]) / max(1, len(modules["train"])),
        "backward_entries": {s: _count(rs, BACKWARD) for s, rs in recs.items()},
        "parameters_grad_entries": {s: _count(rs, PARAM_GRAD) for s, rs in recs.items()},
        "api_entries": {s: sum(1 for r in rs if r.kind == "api") for s, rs in recs.items()},
    }
    def pair(p) -> dict:
        return {"pair_id": p.pid, "kind": p.kind, "layer": p.layer, "block": p.block, "role": p.role,
                "train_modules": [train[i].path for i in p.train],
                "rollout_modules": [rollout[i].path for i in p.rollout],
                "train_keys": [train[i].key for i in p.train], "rollout_keys": [rollout[i].key for i in p.rollout],
                "aligned_by": p.aligned_by, "note": p.note, "points": dict(p.points)}
    def one_sided(o) -> dict:
        return {**_one_sided_record(o, recs[o.side][o.rec]),
                "points": {io: [p.point for p in recs[o.side][o.rec].ports if p.io == io]
                           for io in ("in", "out", "param")}}
    def comparison(c) -> dict:
        return {"cid": c.cid, "point": c.point, "kind": c.kind, "axis": c.axis,
                "train": [{"key": train[x.rec].key, "module": train[x.rec].path, "leaf": x.leaf} for x in c.train],
                "rollout": [{"key": rollout[x.rec].key, "module": rollout[x.rec].path, "leaf": x.leaf}
                            for x in c.rollout],
                "train_layout": c.train_layout, "rollout_layout": c.rollout_layout, "pair": c.pair,
                "stitched": c.stitched,
                "heads": [{"what": what, "side": s, "key": recs[s][x.rec].key, "leaf": x.leaf}
                          for what, s, x in c.heads]}
    # Records: each record is made as it is written (the CSV rows make their own from the plan).
    doc = {"summary": summary, "pairs": Records(pair, plan.pairs), "one_sided": Records(one_sided, plan.one_sided),
           "comparisons": Records(comparison, plan.comparisons), "unmatched_points": plan.unmatched_points}
    header = ["pair_id", "kind", "layer", "block", "role", "train_modules", "rollout_modules", "expected", "note"]
    pair_rows = ([p.pid, p.kind, p.layer, p.block, p.role, [train[i].path for i in p.train],
                  [rollout[i].path for i in p.rollout], "", p.note or ""] for p in plan.pairs)
    one_rows = (["", f"{o.side}_only", r.layer, r.block, r.role, r.path if o.side == "train" else "",
                 r.path if o.side == "rollout" else "", o.expected, o.reason]
                for o in plan.one_sided for r in (recs[o.side][o.rec],))
    return doc, [header, itertools.chain(pair_rows, one_rows)]


def mode(results: list[Result]) -> str:
    """output_3 ``mode``: tensor when any comparison read tensors, else statistics."""
    return "tensor" if any(r.mode == "tensor" for r in results) else "statistics"


def output_3(results: list[Result], tolerances: dict, mode: str, reference: dict | None = None,
             replays: list | None = None, forward: dict | None = None) -> tuple[dict, list]:
    """Value comparison: one record per executed comparison; ``reference``: the checkpoint per side;
    ``replays`` and ``forward``: the tensor-mode replays and the reference forward (None when not run)."""
    doc = {"mode": mode, "tolerances": tolerances, "reference": reference,
           "summary": dict(Counter(r.status for r in results)),
           "logprob": logits_view(results),
           "results": results, "replays": replays, "reference_forward": forward}
    header = ["cid", "point", "kind", "mode", "status", "error", "tolerance", "train_modules", "rollout_modules",
              "train_dtype", "rollout_dtype", "train_shape", "rollout_shape", "max_diff", "min_diff", "mean_diff",
              "norm_diff", "norm_rel", "cosine", "rel_l2", "max_abs", "frac_within_tol", "first_token_past_tol",
              "calls_compared", "calls_diverged", "first_diverged_call", "train_matches_reference",
              "rollout_matches_reference", "reason"]
    return doc, [header, map(_row_3, results)]


def _row_3(r: Result) -> list:
    """output_3's CSV row of one result."""
    se, tm, calls = r.stat_errors or {}, r.tensor_metrics or {}, r.calls or {}
    counts = calls.get("counts", {})
    return [r.cid, r.point, r.kind, r.mode, r.status, r.error, r.tolerance, r.train["modules"],
            r.rollout["modules"], r.train["dtypes"], r.rollout["dtypes"], r.train["shapes"],
            r.rollout["shapes"], se.get("max_diff"), se.get("min_diff"), se.get("mean_diff"),
            se.get("norm_diff"), se.get("norm_rel"), tm.get("cosine"), tm.get("rel_l2"),
            tm.get("max_abs"), tm.get("frac_within_tol"), tm.get("first_token_past_tol"),
            calls.get("compared", 1), counts.get("mismatch", 0) + counts.get("nonfinite", 0) if calls else "",
            calls.get("first_diverged", ""), *_ref_cells(r.reference), r.reason or ";".join(r.notes)]


def logits_view(results: list[Result]) -> dict | None:
    """How far the model outputs differ: per-token log-probs (tensor mode) or the logits' statistics.

    Vectors stay in the logits result (``results[].logprob``); this is the summary an agent reads
    first, null when no logits were compared.
    """
    # SGLang dumps only the last token's logits (M.logits_last): statistics framing only.
    r = next((x for p in (LOGITS_POINT, LOGITS_POINT + "_last") for x in results
              if x.point == p and x.pair is None), None)
    if r is None:
        return None
    base = {"cid": r.cid, "point": r.point, "status": r.status, "error": r.error, "tolerance": r.tolerance,
            "margin": r.error / r.tolerance if r.error is not None and r.tolerance else None,
            "dtypes": [r.train["dtypes"][0], r.rollout["dtypes"][0]], "mode": r.mode, "reason": r.reason}
    if r.logprob is not None:
        return {"kind": "per_token_logprob", **base,
                **{k: v for k, v in r.logprob.items() if k not in ("abs_diff", "clean_level", "tokens")}}
    return {"kind": "logits_statistics", **base, "stat_errors": as_dict(r.stat_errors)}


def _ref_cells(ref: dict | None) -> list:
    return [(ref or {}).get(s, {}).get("matches_reference", "") for s in ("train", "rollout")]


def output_4(verdicts: list[ModuleVerdict], first: dict, plan: MappingPlan, results: list[Result],
             recs: dict[str, list[ModuleRecord]], partial: bool, comparability: dict,
             forward: dict | None = None, fit: dict | None = None) -> tuple[dict, str]:
    """Module analysis: verdicts in train order, first divergence, one-sided module point statuses;
    ``forward`` and ``fit``: the reference forward's summary and the checkpoint's fit (None without one)."""
    by_point = {r.point: r for r in results if r.pair is None}
    def one_sided(o) -> dict:
        r = recs[o.side][o.rec]
        pts = {io: [{"point": p.point, "cid": by_point[p.point].cid if p.point in by_point else None,
                     "status": by_point[p.point].status if p.point in by_point else "not_compared"}
                    for p in r.ports if p.io == io] for io in ("in", "out", "param")}
        return {**_one_sided_record(o, r), "points": pts}
    doc = {"partial": partial, "comparability": comparability, "first_divergence": first,
           "summary": {"by_status": dict(Counter(v.status for v in verdicts)),
                       "by_rank": dict(Counter(v.module_priority_rank for v in verdicts))},
           "rank_meanings": {str(k): v for k, v in RANK_MEANINGS.items()},
           "vocabulary": vocabulary.published(_point_names(results, recs)),
           "modules": verdicts, "one_sided": Records(one_sided, plan.one_sided), "reference_forward": forward,
           "reference_fit": fit}
    return doc, _markdown_4(verdicts, first, partial, comparability)


def _point_names(results: list[Result], recs: dict[str, list[ModuleRecord]]) -> list[str]:
    """Every point name the outputs use: each comparison's and each port's of either side (the
    pairs' and one-sided modules' points of output_4 and the ports of output_1 are among them)."""
    return [r.point for r in results] + [p.point for side in recs.values() for rec in side for p in rec.ports]


def _names(modules: list[str]) -> str:
    return markdown(", ".join(modules))


def _verdict_line(verdicts, first, comparability) -> str:
    top = [v for v in verdicts if v.module_priority_rank <= 2]
    if not comparability.get("comparable", True):
        return ("**Verdict:** the two dumps may not be comparable: "
                + markdown("; ".join(comparability["reasons"])) + ".")
    bounded = (comparability.get("activations") or {}).get("bounded")
    if not first.get("pair") and bounded:
        return (f"**Verdict:** no module output differs beyond tolerance, but {bounded} activation(s) were only "
                "bounded (one side holds a token more): consistent, not verified.")
    if not first.get("pair"):
        return "**Verdict:** no module output differs beyond tolerance."
    return (f"**Verdict:** {len(top)} root-cause candidate(s) (module_priority_rank 1-2); "
            f"first divergence at pair {markdown(first['pair'])}.")


def _markdown_4(verdicts, first, partial, comparability) -> str:
    """The people's view of output_4: what to read first, then every pair in execution order.

    Every name comes from a dump, so each goes through safetext.markdown (escaped, no code spans:
    a backtick inside a code span cannot be escaped).
    """
    lines = ["# Module analysis (output_4)", "", _verdict_line(verdicts, first, comparability), ""]
    if partial:
        lines += ["**Partial analysis**: at least one dump was damaged; see output_1 `sources`.", ""]
    if first.get("pair"):
        lines += [f"**First divergence:** {_names(first['train_modules'])} (train) / "
                  f"{_names(first['rollout_modules'])} (rollout), status {first['status']}, "
                  f"first diverging tensor {markdown(first['point'] or '-')}.", ""]
    else:
        lines += ["**First divergence:** none.", ""]
    top = [v for v in verdicts if v.module_priority_rank <= 2]
    if top:
        lines += ["**Top candidates** (module_priority_rank 1-2, in execution order):", ""]
        lines += [f"{i}. rank {v.module_priority_rank}, pair {v.pid}: {_names(v.train_modules)} (train) / "
                  f"{_names(v.rollout_modules)} (rollout): {v.status} ({markdown(v.rank_reason)})"
                  for i, v in enumerate(top[:TOP_CANDIDATES], 1)]
        if len(top) > TOP_CANDIDATES:
            lines.append(f"{len(top) - TOP_CANDIDATES} more rank 1-2 modules in the table below.")
        lines.append("")
    lines += ["## Every mapped pair, in execution order", "",
              "| rank | pair | layer | train module | rollout module | in | param | out | amp | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v.module_priority_rank} | {v.pid} | {fmt(v.layer)} | {_names(v.train_modules)} | "
                     f"{_names(v.rollout_modules)} | {v.input_status} | {v.parameter_status} | "
                     f"{v.output_status} | {fmt(v.amplification)} | {v.status} |")
    return "\n".join(lines) + "\n"


def layer_counts(recs: dict[str, list[ModuleRecord]]) -> dict[str, int]:
    """Per side, how many distinct layers its dumped modules belong to (comparability's input)."""
    return {s: len({r.layer for r in recs[s] if r.layer is not None and r.kind == "module"}) for s in recs}


def comparability(results: list[Result], summary: dict, layers: dict[str, int], tokens: dict | None = None) -> dict:
    """Say when the two dumps do not look like the same model on the same tokens.

    ``tokens`` is the input plan's token evidence (how identity was shown, and whether it was
    verified); it is reported as is, so weak evidence reads ``verified: false``.
    """
    reasons: list[tuple[str, str]] = []     # (code, prose): readers decide by the code
    one_short = bool(tokens) and tokens.get("how") == "count/max/min, last token not fed"
    if layers["train"] and layers["rollout"] and layers["train"] != layers["rollout"]:
        reasons.append(("layers", f"the sides have different numbers of layers (train {layers['train']}, "
                                  f"rollout {layers['rollout']})"))
    sized = [r for r in results if r.status in ("structural", "incomparable")
             and r.skip is not None and r.skip.code in SIZE_CODES]
    if results and len(sized) > 0.5 * len(results):
        reasons.append(("sizes", f"{len(sized)} of {len(results)} tensors differ in size (different model "
                                 "sizes, sequence lengths, or unmerged tensor-parallel shards)"))
    tok = next((r for r in results if r.point == "M.tokens"), None)
    # With the last sampled token not fed, the ids agree over the fed tokens only (tensor mode shows
    # it; statistics over n and n-1 tokens only bound each other): not a difference.
    if tok is not None and tok.status not in CLEAN + BOUNDED and not (one_short and tok.status == "incomparable"):
        reasons.append(("tokens", f"input token ids differ ({tok.status}: {tok.reason or 'statistics differ'})"))
    compared = [r for r in results if r.status not in ("incomparable", "structural")]
    if not compared:
        levels = "API-level (L1) dumps hold no modules: dump with level L0 or mix" if not (
            summary["train_modules"] and summary["rollout_modules"]) else "no module pairs share a comparable tensor"
        reasons.append(("nothing_compared", f"nothing was compared ({summary['pairs']} module pairs, "
                                            f"{len(results)} planned tensors; {levels})"))
    if summary["train_modules"] and summary["train_coverage"] < 0.3:
        reasons.append(("coverage", f"only {summary['mapped_train_modules']} of {summary['train_modules']} train "
                                    "modules map to the rollout side (different models, or a naming profile is "
                                    "missing)"))
    return {"comparable": not reasons, "reasons": [r for _, r in reasons], "codes": [c for c, _ in reasons],
            "tokens": tokens or {"how": "none", "verified": False},
            "activations": activations_compared(results)}


def activations_compared(results: list[Result]) -> dict:
    """How many activation comparisons (module inputs and outputs, not parameters, not the ids)
    ran, how many were only bounded (one side a token row more: consistent, not verified), and the
    commonest reason of those that did not run. Parameters that agree say nothing about the
    forward, nor do bounds that hold: with no activation compared, no reader may call the pair
    clean (references/output_schemas.md, output_4 ``comparability.activations``)."""
    acts = [r for r in results if r.point != "M.tokens" and not is_parameter_name(r.point)]
    skipped = [r for r in acts if r.status in ("incomparable", "structural")]
    bounded = sum(r.status in BOUNDED for r in acts)
    why = Counter(r.skip for r in skipped if r.skip is not None)
    main = why.most_common(1)[0][0] if why else None
    return {"compared": len(acts) - len(skipped) - bounded, "bounded": bounded, "planned": len(acts),
            "main_reason": main and main.reason, "main_skip": main}
