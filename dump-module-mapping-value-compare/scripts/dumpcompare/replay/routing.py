"""Routing replay of mixture-of-experts layers (tensor mode; output_3 ``replays``, ops ``routing``
and ``routing_compare``).

A router's top-k choice is a known function of its logits and a few config values: the scoring
(softmax, or DeepSeek-style sigmoid with ``e_score_correction_bias`` added for the choice only),
``num_experts_per_tok`` and ``norm_topk_prob``. Each side's routing is replayed from its own
dumped logits and checked against what that side did with them (the transformers router's dumped
top-k weights and ids; vLLM's FusedMoE output, rebuilt from its stacked expert weights; a vLLM 0.32
MoERunner's, which holds none, rebuilt with the checkpoint's experts or else the other side's), which
gives the values the side used. The two sides' choices are then compared token by token: a
top-k set that differs only where the logits are within precision of a tie is a routing flip
(rounding), anything else is systematic. Why: rl-consistency-analysis/references/
deciding_the_side.md ("Routing") and analysis_rules.md ("Mixture of experts").
"""
from __future__ import annotations

import numpy as np

from ..arrays import leaf_array, rel_error, to_dtype
from ..dtypes import dtype_key
from ..tolerances import pair_tolerances
from .kernels import ACT_NAMES, MAX_LEAF, Fit, activation

SCORINGS = ("softmax", "sigmoid")
# Unit roundoff per dtype: two logits closer than a few of these (relative to their size) are a
# tie that rounding can break either way.
ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
MAX_TOKENS = 4096
# Rebuilding a FusedMoE output costs tokens x top_k x the expert's weights in multiply-adds: the
# leading tokens within this budget are enough to tell routing candidates apart.
FUSED_BUDGET = 1 << 31


def router_config(config: dict) -> dict:
    """The routing values of a config.json (defaults where a key is absent): top_k, norm_topk_prob,
    scoring_func, routed_scaling_factor, n_group, topk_group."""
    return {"top_k": int(config.get("num_experts_per_tok") or 2),
            # Mixtral has no key and always renormalises (softmax over the top-k logits).
            "norm_topk_prob": bool(config.get("norm_topk_prob", config.get("model_type") == "mixtral")),
            "scoring_func": str(config.get("scoring_func") or "softmax"),
            "routed_scaling_factor": float(config.get("routed_scaling_factor") or 1.0),
            "n_group": int(config.get("n_group") or 1), "topk_group": int(config.get("topk_group") or 1)}


def _scores(logits: np.ndarray, scoring: str) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    if scoring == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _choice_scores(scores: np.ndarray, cfg: dict, bias: np.ndarray | None) -> np.ndarray:
    """Scores the top-k is taken over: plus the correction bias (sigmoid scoring), experts outside
    the best ``topk_group`` groups removed (group-limited routing)."""
    choice = scores + bias if bias is not None and cfg["scoring_func"] == "sigmoid" else scores.copy()
    g = cfg["n_group"]
    if g > 1 and choice.shape[-1] % g == 0:
        grouped = choice.reshape(choice.shape[0], g, -1)
        group_score = np.sort(grouped, axis=-1)[..., -2:].sum(-1)   # best two of a group (DeepSeek-V3)
        keep = np.argsort(-group_score, axis=-1, kind="stable")[:, :cfg["topk_group"]]
        mask = np.zeros(group_score.shape, bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, grouped.shape[-1], axis=-1), choice, -np.inf)
    return choice


def route(logits: np.ndarray, config: dict, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k routing of ``logits`` [tokens, experts] as ``config`` sets it (config.json keys, or the
    keys ``router_config`` returns): (indices [tokens, k] best first, weights [tokens, k] float64).
    ``bias`` is DeepSeek's ``e_score_correction_bias``, used for the choice, not the weights."""
    cfg = {**router_config(config), **{k: config[k] for k in ("top_k",) if k in config}}
    scores = _scores(logits, cfg["scoring_func"])
    choice = _choice_scores(scores, cfg, bias)
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, :cfg["top_k"]]
    w = np.take_along_axis(scores, idx, axis=-1)
    if cfg["norm_topk_prob"]:
        w = w / w.sum(-1, keepdims=True)
    return idx, w * cfg["routed_scaling_factor"]


def _dense(idx: np.ndarray, w: np.ndarray, experts: int) -> np.ndarray:
    out = np.zeros((idx.shape[0], experts))
    np.put_along_axis(out, idx.astype(np.int64), w, axis=-1)
    return out


def _candidates(base: dict) -> dict:
    return {(s, n): {**base, "scoring_func": s, "norm_topk_prob": n} for s in SCORINGS for n in (True, False)}


class _Side:
    """One side's routing at one layer: its logits and how to test a routing candidate against it."""

    def __init__(self, router, experts, logits, dtype, residual):
        self.router, self.experts, self.logits, self.dtype = router, experts, logits, dtype
        # candidate config -> relative error against the dump; None when no dumped output depends
        # on the routing config (only the router's logits are known: the top-k sets still are)
        self.residual = residual
        self.observed = None                # (idx, weights) the side dumped, when it did
        # Where the experts' weights came from when the side's dump holds none (vLLM 0.32): "checkpoint"
        # (--model), or the other side's name (its dump's stacked experts).
        self.weights_from = None


def _hf_router(rec, leaves, view, bias):
    """transformers 5.x router: output (logits, top-k weights, top-k ids)."""
    get = lambda n: leaf_array(view, leaves[n]) if n in leaves else None  # noqa: E731
    logits, w, idx = get("output.0"), get("output.1"), get("output.2")
    if logits is None or w is None or idx is None:
        return None
    logits = logits.reshape(-1, logits.shape[-1])[:MAX_TOKENS].astype(np.float64)
    n = logits.shape[0]
    w, idx = w.reshape(n, -1).astype(np.float64), idx.reshape(n, -1).astype(np.int64)
    seen = _dense(idx, w, logits.shape[1])
    dtype = dtype_key(leaves["output.1"].dtype)

    def residual(cfg):
        i, ww = route(logits, cfg, bias)
        return rel_error(to_dtype(_dense(i, ww, logits.shape[1]), dtype).astype(np.float64), seen)
    side = _Side(rec, None, logits, dtype_key(leaves["output.0"].dtype), residual)
    side.observed = (idx, w)
    return side


def _fused_experts(rec, leaves, view, act, bias):
    """vLLM FusedMoE (one rank): hidden_states, router_logits, w13 [E, 2I, H] = [gate; up], w2."""
    get = lambda n: leaf_array(view, leaves[n]) if n in leaves else None  # noqa: E731
    x, logits, out = get("input_kwargs.hidden_states"), get("input_kwargs.router_logits"), get("output.0")
    w13, w2 = get("parameters.w13_weight"), get("parameters.w2_weight")
    if any(a is None for a in (x, logits, out, w13, w2)) or any(lf.merge for lf in leaves.values()):
        return None                          # merged TP ranks hold partial sums: not replayed
    return _experts_side(rec, x, logits, out, w13, w2, act, bias, dtype_key(leaves["output.0"].dtype),
                         dtype_key(leaves["input_kwargs.router_logits"].dtype))


def checkpoint_experts(ref, layer: int, dtype: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(w13 [E, 2I, H] = [gate; up] per expert, w2 [E, H, I]) of ``layer`` as the checkpoint holds
    them, rounded to ``dtype``; None when the checkpoint names no experts there."""
    from ..reference import expert_names, stacked_experts
    out = []
    for part in ("gate_up", "down"):
        point = f"L{layer}.experts.{part}.weight"
        names = expert_names(ref, point)
        if not names:
            return None
        out.append(stacked_experts([to_dtype(ref.checkpoint.read(n), dtype) for n in names], point))
    return out[0], out[1]


# Stacked expert weights as a dump entry holds them: transformers 5.x experts (gate_up_proj
# [E, 2I, H] = [gate; up] per expert, down_proj [E, H, I]) and vLLM's FusedMoE (w13, w2: same layout).
_STACKED_EXPERTS = (("parameters.gate_up_proj", "parameters.down_proj"),
                    ("parameters.w13_weight", "parameters.w2_weight"))


def _dumped_experts(experts, view) -> tuple[np.ndarray, np.ndarray] | None:
    """(w13 [E, 2I, H], w2 [E, H, I]) as one side's experts module dumped them (tensor mode, one
    rank or whole experts), or None when that entry holds no stacked expert weight of that layout."""
    if experts is None:
        return None
    leaves = experts[1]
    for w13_name, w2_name in _STACKED_EXPERTS:
        pair = leaves.get(w13_name), leaves.get(w2_name)
        if None in pair or any(lf.merge for lf in pair):
            continue                         # merged tensor-parallel shards cut each expert: not this layout
        w13, w2 = (leaf_array(view, lf) for lf in pair)
        if w13 is not None and w2 is not None and w13.ndim == w2.ndim == 3 and w13.shape[0] == w2.shape[0] \
                and w13.shape[1] == 2 * w2.shape[2] and w13.shape[2] == w2.shape[1]:
            return w13, w2
    return None


def _runner_experts(router, experts, view, act, bias, ref, layer, other):
    """vLLM 0.32 (a GateLinear router, a MoERunner that holds no expert weight in any dump entry):
    the runner's own input and output, the router's logits, and the experts as the checkpoint
    (``--model``) holds them, or else as the other side's dump holds them (``other``: a callable
    returning (that side's name, (w13, w2)) or None). A fit then tests the routing keys and the
    expert weights together: a config that reproduces the output also says the runner's experts
    are those weights."""
    rleaves, eleaves = router[1], experts[1]
    x_leaf, y_leaf, l_leaf = eleaves.get("input_kwargs.hidden_states"), eleaves.get("output.0"), rleaves.get("output.0")
    if ref is None and other is not None:
        other = other()
    if (ref is None and other is None) or None in (x_leaf, y_leaf, l_leaf) \
            or any(lf.merge for lf in (x_leaf, y_leaf, l_leaf)):
        return None
    x, y, logits = (leaf_array(view, lf) for lf in (x_leaf, y_leaf, l_leaf))
    if x is None or y is None or logits is None:
        return None
    dtype = dtype_key(y_leaf.dtype)
    if ref is not None:
        source, weights = "checkpoint", checkpoint_experts(ref, layer, dtype)
    else:
        source, weights = other[0], tuple(to_dtype(w, dtype) for w in other[1])
    if weights is None or weights[0].shape[0] != logits.shape[-1] or weights[0].shape[-1] != x.shape[-1]:
        return None
    side = _experts_side(router[0], x, logits, y, *weights, act, bias, dtype, dtype_key(l_leaf.dtype))
    side.weights_from = source
    return side


def _experts_side(rec, x, logits, out, w13, w2, act, bias, dtype, logits_dtype):
    """A side whose experts' output can be rebuilt: its input ``x``, router ``logits``, output ``out``
    and the experts' weights (its own, or the checkpoint's)."""
    # top-k is not known yet: 8, the most today's MoE models route to
    rows = max(1, min(MAX_TOKENS, FUSED_BUDGET // max(1, 8 * (w13[0].size + w2[0].size))))
    logits = logits.reshape(-1, logits.shape[-1])[:rows].astype(np.float64)
    n = logits.shape[0]
    x = x.reshape(-1, x.shape[-1])[:n].astype(np.float64)
    y = out.reshape(-1, out.shape[-1])[:n].astype(np.float64)
    w13, w2 = w13.astype(np.float64), w2.astype(np.float64)
    inter, cache = w13.shape[1] // 2, {}

    def expert_out(e, rows):
        key = (e, rows.tobytes())
        if key not in cache:
            h = x[rows] @ w13[e].T
            cache[key] = (activation(act, h[:, :inter]) * h[:, inter:]) @ w2[e].T
        return cache[key]

    def residual(cfg):
        idx, w = route(logits, cfg, bias)
        z = np.zeros_like(y)
        for e in np.unique(idx):
            rows, slot = np.nonzero(idx == e)
            z[rows] += expert_out(int(e), rows) * w[rows, slot, None]
        return rel_error(to_dtype(z, dtype).astype(np.float64), y)
    return _Side(None, rec, logits, logits_dtype, residual)


def _router_logits(rec, leaves, view, experts: int | None):
    """A router whose only output is its logits (vLLM 0.32's GateLinear, whose MoERunner holds no
    expert weights in any dump entry): the top-k sets follow from the logits, the routing weights
    and the config keys that shape them do not."""
    leaf = leaves.get("output.0")
    logits = leaf_array(view, leaf) if leaf is not None else None
    if logits is None or logits.ndim < 2 or leaf.merge or (experts and logits.shape[-1] != experts):
        return None
    logits = logits.reshape(-1, logits.shape[-1])[:MAX_TOKENS].astype(np.float64)
    return _Side(rec, None, logits, dtype_key(leaf.dtype), None)


def _fit_records(side: _Side, base: dict, reference: dict | None, tol: float) -> tuple[dict, list[dict]]:
    """(the config the side behaves as, one record per routing key)."""
    if side.residual is None:
        return reference or base, []
    res = {c: side.residual(cfg) for c, cfg in _candidates(base).items()}
    best = min(res, key=res.get)
    if reference is not None and res[(reference["scoring_func"], reference["norm_topk_prob"])] <= tol:
        best = (reference["scoring_func"], reference["norm_topk_prob"])   # the reference's when it fits
    out = []
    for pos, key in enumerate(("scoring_func", "norm_topk_prob")):
        fit = Fit(key, None if reference is None else reference[key], tol)
        for c, r in res.items():
            if all(c[i] == best[i] for i in range(2) if i != pos):     # the other key held at its fit
                fit.add(c[pos], r)
        out.append(fit.record())
    return {**base, "scoring_func": best[0], "norm_topk_prob": best[1]}, out


def _tie_gap(logits: np.ndarray, own: set, other: set, tol: float) -> bool:
    """The experts only the other side chose are within ``tol`` of this side's k-th choice, in
    logits: they order the choice for softmax and sigmoid scoring alike (a correction bias shifts
    that order, and a tie is then judged on the unbiased logits)."""
    kth = min(logits[e] for e in own)
    return all(kth - logits[e] <= tol for e in other - own)


def compare(train: tuple, rollout: tuple, lt: np.ndarray, lr: np.ndarray, dtype: str, tol: float,
            weights_known: bool = True) -> dict:
    """Token-by-token comparison of two sides' routing ((idx, weights) each) over their common
    leading tokens. A token whose top-k sets differ is a flip when its logits agree within ``tol``
    (relative) and, on both sides, the experts the other side chose are within the logits'
    difference plus a few roundings of a tie; ``from_logits`` when its logits themselves differ
    (the cause is upstream of the routing); systematic otherwise. Without ``weights_known`` (a side
    whose dump shows only its router's logits) the routing weights are not compared."""
    n = min(lt.shape[0], lr.shape[0], train[0].shape[0], rollout[0].shape[0])
    flips = systematic = from_logits = 0
    wt, wr = [], []
    for t in range(n):
        a, b = set(train[0][t].tolist()), set(rollout[0][t].tolist())
        if a == b:
            wt.append(train[1][t][np.argsort(train[0][t])])
            wr.append(rollout[1][t][np.argsort(rollout[0][t])])
            continue
        if rel_error(lr[t], lt[t]) > tol:
            from_logits += 1
            continue
        margin = float(np.max(np.abs(lt[t] - lr[t]))) + 4 * ROUNDOFF.get(dtype, 2.0 ** -8) * float(
            max(np.max(np.abs(lt[t])), np.max(np.abs(lr[t]))))
        if _tie_gap(lt[t], a, b, margin) and _tie_gap(lr[t], b, a, margin):
            flips += 1
        else:
            systematic += 1
    werr = rel_error(np.concatenate(wr), np.concatenate(wt)) if wt and weights_known else None
    if systematic or (werr is not None and werr > tol):
        verdict = "systematic"
    else:
        verdict = "logits_differ" if from_logits else "flips_only" if flips else "same"
    return {"tokens": n, "set_differs": flips + systematic + from_logits, "flips": flips,
            "systematic_sets": systematic, "from_logits": from_logits, "weights_rel_error": werr,
            "weights_tolerance": tol, "verdict": verdict}


def _by_layer(recs, views, side):
    """layer -> {role: (record, leaves)} for the routers and experts of one side (forward, call 0);
    a module with a leaf over replay.MAX_LEAF elements is left out (tensor files are read whole)."""
    out: dict = {}
    for rec in recs[side]:
        if rec.kind == "module" and rec.direction == "forward" and rec.call == 0 and rec.layer is not None \
                and rec.role in ("router", "experts"):
            leaves = views[side].leaves[rec.index]
            if all((lf.numel or 0) <= MAX_LEAF for lf in leaves.values()):
                out.setdefault(rec.layer, {})[rec.role] = (rec, leaves)
    return out


def _bias(found, view):
    rec = found.get("router")
    leaf = rec[1].get("parameters.e_score_correction_bias") if rec else None
    a = leaf_array(view, leaf) if leaf is not None else None
    return None if a is None else a.astype(np.float64).reshape(-1)


def _side_routing(found, view, config, ref, layer, other=None):
    act = ACT_NAMES.get(str(config.get("hidden_act", "silu")), "silu")
    bias = _bias(found, view)
    router, experts = found.get("router"), found.get("experts")
    side = None
    if router is not None and "output.2" in router[1]:
        side = _hf_router(*router, view, bias)
    elif experts is not None and "parameters.w13_weight" in experts[1]:
        side = _fused_experts(*experts, view, act, bias)
    elif experts is not None and router is not None:
        side = _runner_experts(router, experts, view, act, bias, ref, layer, other)
    if side is None and router is not None and "output.2" not in router[1]:
        side = _router_logits(*router, view, config.get("num_experts") or config.get("num_local_experts"))
    if side is not None:
        side.router, side.experts = (router or (None,))[0], (experts or (None,))[0]
    return side, bias


class _OtherExperts:
    """The other side's stacked experts of one layer, read when first asked for (only a side whose
    own dump holds no expert weight, replayed without --model, needs them)."""

    def __init__(self, mods, view, side: str):
        self.mods, self.view, self.side, self._got = mods, view, side, None

    def __call__(self) -> tuple[str, tuple[np.ndarray, np.ndarray]] | None:
        if self._got is None:
            weights = _dumped_experts(self.mods.get("experts"), self.view)
            self._got = (None if weights is None else (self.side, weights),)
        return self._got[0]


def _other_experts(mods, view, side: str) -> _OtherExperts | None:
    return None if mods is None or "experts" not in mods else _OtherExperts(mods, view, side)


def run(recs: dict, views: dict, refs: dict, tolerances: dict) -> list[dict]:
    """Routing records of every MoE layer: per side, the routing values its dumped outputs imply
    (``routing``), and per layer the two sides' top-k choices compared (``routing_compare``)."""
    found, configs = {}, {}
    mods_of = {side: _by_layer(recs, views, side) for side in ("train", "rollout")}
    for side, other_side in (("train", "rollout"), ("rollout", "train")):
        configs[side] = refs[side].config if refs.get(side) else {}
        for layer, mods in mods_of[side].items():
            other = _other_experts(mods_of[other_side].get(layer), views[other_side], other_side)
            try:
                s, bias = _side_routing(mods, views[side], configs[side], refs.get(side), layer, other)
            except (ValueError, IndexError):
                s = None                     # tensors that do not fit the layout: not replayed
            if s is not None:
                found.setdefault(layer, {})[side] = (s, bias)
    # Without a config, a side that dumped its top-k ids tells k for both.
    seen_k = next((int(s.observed[0].shape[1]) for sides in found.values() for s, _ in sides.values()
                   if s.observed is not None), 2)
    per_side, out = {}, []
    for layer, sides in sorted(found.items()):
        for side, (s, bias) in sides.items():
            config = configs[side]
            reference = router_config(config) if config else None
            base = reference or {**router_config({}), "top_k": seen_k}
            tol, _ = pair_tolerances(tolerances["replay"], s.dtype, s.dtype)
            behaves, records = _fit_records(s, base, reference, tol)
            if s.weights_from not in (None, "checkpoint") and records and records[0]["fitted"]["residual"] > tol:
                # The other side's experts reproduce this side's output under no routing: its experts
                # (or their math) differ, so nothing is known of its routing weights or keys.
                s.residual, s.weights_from = None, None
                behaves, records = _fit_records(s, base, reference, tol)
            mod = s.experts or s.router
            for r in records:
                out.append({"side": side, "module": mod.path, "class": mod.cls, "role": mod.role, "layer": layer,
                            "op": "routing", "router_module": s.router.path if s.router else None,
                            "dtype": s.dtype, **r, **({"expert_weights": s.weights_from} if s.weights_from else {})})
            per_side.setdefault(layer, {})[side] = (s, s.observed or route(s.logits, behaves, bias), behaves)
    for layer, sides in sorted(per_side.items()):
        if len(sides) < 2:
            continue
        (st, ct, bt), (sr, cr, br) = sides["train"], sides["rollout"]
        dtype = st.dtype if ROUNDOFF.get(st.dtype, 1) >= ROUNDOFF.get(sr.dtype, 1) else sr.dtype
        tol, _ = pair_tolerances(tolerances["tensor"]["rel_l2"], st.dtype, sr.dtype)   # engine to engine
        known = st.residual is not None and sr.residual is not None
        rec = compare(ct, cr, st.logits, sr.logits, dtype, tol, known)
        out.append({"side": "both", "op": "routing_compare", "layer": layer,
                    "train_module": (st.experts or st.router).path, "rollout_module": (sr.experts or sr.router).path,
                    "top_k": int(ct[0].shape[1]), **rec,
                    # A side seen only through its router's logits shows no config key.
                    "differing_keys": [{"key": k, "train": bt[k], "rollout": br[k]}
                                       for k in ("scoring_func", "norm_topk_prob") if known and bt[k] != br[k]]})
    return out
