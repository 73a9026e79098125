"""Fault hypotheses tested by simulation (output_3/4 ``reference_forward.hypotheses``).

Where a side first leaves the reference, each candidate fault the analysis can name is injected
into the reference forward (refmodel.Injection) and the forward re-run from the departing layer,
resumed from the reference's own residual stream there. A candidate reproduces the side when the
side's values at that layer's points then agree with the injected reference within the same
tolerance the side failed; its residual (the largest error over those points) says how closely.
Candidates: the fused row orders (a plain [q; k; v] read as Megatron's per-group layout and the
reverse, [up; gate] for [gate; up]), a head tied to the embedding, one config value among the
replay grids (eps, rope theta, activation, attention scale), and the other forward precision.
Why: references/reference_forward_evidence.md.
"""
from __future__ import annotations

import math

import numpy as np

from . import modelconfig
from .arrays import leaf_array
from .callruns import side_leaves
from .compare.layout import interleave_parts
from .points import layer as point_layer
from .refparts import suspects
from .refpoints import RefRun, compare_side, point_arrays
from .replay.kernels import ACTS, EPS_GRID, ROPE_THETAS

# Points of the layer the candidates are judged on; a candidate is a hypothesis about that layer.
_MAX_CANDIDATES = 40


def _const(a: np.ndarray):
    return lambda _stored: a


def _layout_candidates(ckpt_read, config: dict, layer: int) -> list[tuple[str, dict]]:
    """Weight injections for fused row orders at ``layer``: name -> (description, {hf name: fn})."""
    out = []
    base = f"model.layers.{layer}"
    heads = int(config.get("num_attention_heads") or 0)
    kv = int(config.get("num_key_value_heads") or heads or 0)
    names = [f"{base}.self_attn.{p}_proj.weight" for p in "qkv"]
    parts = [ckpt_read(n) for n in names]
    if all(p is not None for p in parts) and kv:
        sizes = [p.shape[0] for p in parts]
        cut = np.cumsum(sizes)[:-1]
        plain = np.concatenate(parts)
        # A plain [q; k; v] that the engine reads as Megatron's per-group layout.
        groups = [np.split(g, np.cumsum([s // kv for s in sizes])[:-1]) for g in np.split(plain, kv)]
        read = [np.concatenate([g[i] for g in groups]) for i in range(3)]
        out.append(("qkv stored as plain [q; k; v], read as Megatron's per-query-group layout",
                    {n: _const(a) for n, a in zip(names, read)}))
        # The reverse: a per-group layout read as plain [q; k; v].
        grouped = interleave_parts(parts, kv, 0)
        out.append(("qkv stored in Megatron's per-query-group layout, read as plain [q; k; v]",
                    {n: _const(a) for n, a in zip(names, np.split(grouped, cut))}))
    gate, up = (f"{base}.mlp.{p}_proj.weight" for p in ("gate", "up"))
    g, u = ckpt_read(gate), ckpt_read(up)
    if g is not None and u is not None and g.shape == u.shape:
        out.append(("gate_up stored as [up; gate] instead of [gate; up]", {gate: _const(u), up: _const(g)}))
    return out


def _config_candidates(config: dict, eps: float | None, theta: float | None, act: str | None) -> list[tuple[str, dict]]:
    out = [(f"rms_norm_eps = {e:g}", {"rms_norm_eps": e}) for e in EPS_GRID if eps is None or not
           math.isclose(e, eps)]
    out += [(f"rope_theta = {t:g}", {"rope_theta": t}) for t in ROPE_THETAS if theta is None or not math.isclose(t, theta)]
    out += [(f"hidden_act = {a}", {"hidden_act": {"gelu_tanh": "gelu_pytorch_tanh"}.get(a, a)}) for a in ACTS
            if a != act]
    hd = modelconfig.head_dim(config)
    if hd:
        out += [(f"attention scale 1/{d} instead of 1/sqrt({hd})", {"attention_scale": 1.0 / d}) for d in (hd, 1.0)]
    if config.get("num_experts") or config.get("num_local_experts"):
        # The routing normalisation is the MoE key an engine most often sets apart from config.json
        # (vLLM's FusedMoE ``renormalize``); without it here a config fault at the experts, whose
        # weights a vLLM 0.32 dump never shows, would read as an unseen weight.
        norm = bool(config.get("norm_topk_prob", config.get("model_type") == "mixtral"))
        out.append((f"norm_topk_prob = {not norm} (top-k weights {'not ' if norm else ''}renormalised)",
                    {"norm_topk_prob": not norm}))
    return out


def own_weights(results, plans, side: str, view, layer: int | None, ckpt) -> list[tuple[str, dict]]:
    """The side's own dumped parameters that differ from the checkpoint at ``layer`` (tensor mode),
    each as a candidate that puts it in the reference: it reproduces the side when that weight is
    the whole fault (a stale or corrupted copy)."""
    by_cid = {p.cid: p for p in plans}
    out = []
    for res in results:
        rec = (res.reference or {}).get(side) or {}
        names = rec.get("checkpoint_tensors") or []
        if rec.get("matches_reference") is not False or len(names) != 1 or point_layer(res.point) != layer:
            continue
        leaves = [view.leaves[c.rec].get(c.leaf) for c in getattr(by_cid[res.cid], side)]
        arr = leaf_array(view, leaves[0]) if len(leaves) == 1 and leaves[0] is not None else None
        if arr is None or tuple(arr.shape) != tuple(ckpt.tensors[names[0]].shape):
            continue
        out.append((f"the {side} side's own {res.point} (differs from the checkpoint)",
                    {names[0]: _const(np.asarray(arr, dtype=np.float32))}))
    return out


def hypotheses(refmodel, ref, run: RefRun, ids, forward_dtype: str, dep: dict, plans, side: str, view,
               judged: dict, tolerances: dict, use_tensors: bool, namer, call_ends: list[int] | None,
               own: list[tuple[str, dict]] = ()) -> dict:
    """Candidates injected at the departing layer of ``side``, with their residuals (``own``: the
    side's differing weights, from :func:`own_weights`)."""
    layer = dep["layer"]
    at = [p for p in plans if p.cid in judged and point_layer(p.point) == layer]
    base_err = max((judged[p.cid]["error"] or 0.0) for p in at) if at else None
    cfg = ref.config
    names = set(ref.checkpoint.tensors)

    def read(name):
        stored = name if name in names else name[len("model."):] if name[len("model."):] in names else None
        return ref.checkpoint.read(stored) if stored else None

    cands: list[tuple[str, str, dict, dict, str]] = [("weight", lab, w, {}, forward_dtype) for lab, w in own]
    if layer is not None:
        cands += [("layout", lab, w, {}, forward_dtype) for lab, w in _layout_candidates(read, cfg, layer)]
        cands += [("config", lab, {}, c, forward_dtype) for lab, c in _config_candidates(
            cfg, cfg.get("rms_norm_eps"), modelconfig.rope_theta(cfg), cfg.get("hidden_act"))]
    elif dep["point"].startswith("M.logits") and "lm_head.weight" in names and not cfg.get("tie_word_embeddings"):
        emb = read("model.embed_tokens.weight")
        if emb is not None:
            cands.append(("weight", "lm_head tied to the embedding (a stale or untied head)",
                          {"lm_head.weight": _const(emb)}, {}, forward_dtype))
    other = "fp32" if forward_dtype == "bf16" else "bf16"
    cands.append(("dtype", f"forward in {other} instead of {forward_dtype}", {}, {}, other))
    tried = []
    for kind, label, weights, over, dtype in cands[:_MAX_CANDIDATES]:
        sim = _simulate(refmodel, ref, run, ids, dtype, layer, weights, over, namer, at)
        got = compare_side(sim, at, side, view, tolerances, use_tensors, call_ends)
        errs = [g["error"] for g in got.values() if g["error"] is not None]
        ok = bool(got) and all(g["matches_reference"] is True for g in got.values())
        tried.append({"kind": kind, "candidate": label, "config": over or None, "dtype": dtype,
                      "residual": max(errs) if errs else None, "points": len(got), "reproduces": ok})
    tried.sort(key=lambda t: (not t["reproduces"], t["residual"] if t["residual"] is not None else math.inf))
    return {"side": side, "layer": layer, "point": dep["point"], "baseline_error": base_err,
            "points": [p.point for p in at], "candidates": tried,
            "reproduced_by": [t["candidate"] for t in tried if t["reproduces"]],
            "parts": _fused_parts(refmodel, ref, run, ids, forward_dtype, dep, plans, side, view, judged, namer,
                                  call_ends, at) if dep["how"].startswith("statistics") else None}


def _fused_parts(refmodel, ref, run: RefRun, ids, dtype: str, dep: dict, plans, side: str, view, judged: dict,
                 namer, call_ends, at) -> dict | None:
    """refparts.suspects at a fused departure point, on the layer's reference points (re-run from
    the reference stream: the first run dropped them once judged)."""
    plan = next((p for p in plans if p.cid == dep["cid"]), None)
    if plan is None or "+" not in plan.point or dep["layer"] is None:
        return None
    leaves = side_leaves(view.leaves, getattr(plan, side), plan.stitched == side)
    if not leaves or None in leaves:
        return None
    clean = _simulate(refmodel, ref, run, ids, dtype, dep["layer"], {}, {}, namer, at)
    return suspects(plan.point, clean.arrays, view, leaves, call_ends, judged[plan.cid]["tolerance"])


def _simulate(refmodel, ref, run: RefRun, ids, dtype: str, layer: int | None, weights: dict, over: dict,
              namer, plans) -> RefRun:
    """The reference re-run with one injection, resumed at ``layer`` from the reference stream."""
    start = layer or 0
    hidden = run.arrays.get(f"L{start - 1}.resid_out") if start else None
    inject = refmodel.Injection(config=over, weights=weights, from_layer=start)
    kwargs = {"start_layer": start, "hidden": hidden} if hidden is not None else {}
    outs = []
    for out in refmodel.forward(ref.checkpoint, ref.config, ids, dtype=dtype, inject=inject,
                                   engine_points=True, **kwargs):
        lay = namer.classify(namer.strip_wrappers(out.module))[0]
        if layer is not None and lay is not None and lay > layer:
            break      # the candidate is judged on its own layer: the rest of the forward is not needed
        outs.append(out)
    # Points before the resumed layer come from the reference run (the stream the layer starts from).
    before = {k: v for k, v in run.arrays.items() if start and point_layer(k) is not None and point_layer(k) < start}
    # A candidate judged outside the layers (the logits) runs them all: their points are dropped
    # layer by layer, as in the reference run itself.
    return point_arrays(outs, namer, before, {p.point for p in plans},
                        on_layer=(lambda _arrays: None) if layer is None else None)
