"""Replay attention from each side's own dumped tensors (tensor mode; output_3 ``replays``, op ``attention``).

Two shapes of the same math. transformers computes RoPE and the attention core inline in its
``XxxAttention.forward``: the composite is replayed from the q/k/v projection outputs (or the fused
qkv output split by the config's head counts), the q/k norm outputs where the family has them, and
RoPE from the dumped positions and a theta (or from the dumped cos/sin), against the input of
``o_proj``. vLLM and SGLang run the core as a module (``attn``) that takes q, k, v after RoPE: it
is replayed from its inputs against its output; a decode step needs the keys and values of the
earlier steps, taken from the earlier calls of the same module when the dump holds them.

The values that change the math are fitted one at a time, the others held at their best value:
the attention scale (head_dim**-0.5, (hidden_size/num_attention_heads)**-0.5,
query_pre_attn_scalar**-0.5, 1.0), rope_theta (composite only, from positions), the logit soft cap
and the sliding window (only where the config sets them). Why this decides a side, and when it
cannot: rl-consistency-analysis/references/deciding_the_side.md ("Replay", "Attention").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import modelconfig
from ..arrays import leaf_array, merge_rule, rel_error, to_dtype
from ..dtypes import dtype_key
from ..skips import Skip
from ..tolerances import pair_tolerances
from .kernels import MAX_LEAF, ROPE_THETAS, Fit, rope_angles, rotate

SOFTCAPS = (0.0, 30.0, 50.0)          # 0: no cap
# Score elements (query tokens x key tokens x heads) one evaluation may hold: the leading query
# tokens are replayed, which under a causal mask need only the leading keys.
MAX_SCORES = 1 << 19
MAX_ROUNDS = 2
SCALE = "attention scale"


def _sig(x: float) -> float:
    return float(f"{x:.9g}")


def _geometry(config: dict) -> tuple[int, int, int] | None:
    """(heads, kv heads, head_dim) from the config, None without them (or with unreadable ones)."""
    try:
        (heads, kv), hd = modelconfig.head_counts(config), modelconfig.head_dim(config)
    except ValueError:
        return None
    return (heads, kv, hd) if heads and hd else None


def scale_candidates(config: dict, head_dim: int) -> tuple[dict, float, str]:
    """({formula: scale}, the reference scale, the config key it comes from)."""
    cands = {"head_dim**-0.5": head_dim ** -0.5, "1.0": 1.0}
    if config.get("hidden_size") and config.get("num_attention_heads"):
        cands["(hidden_size/num_attention_heads)**-0.5"] = (
            int(config["hidden_size"]) / int(config["num_attention_heads"])) ** -0.5
    qpas = config.get("query_pre_attn_scalar")
    if qpas:
        cands["query_pre_attn_scalar**-0.5"] = float(qpas) ** -0.5
        return {k: _sig(v) for k, v in cands.items()}, _sig(float(qpas) ** -0.5), "query_pre_attn_scalar"
    return {k: _sig(v) for k, v in cands.items()}, _sig(head_dim ** -0.5), "head_dim"


def layer_window(config: dict, layer: int | None) -> int:
    """The sliding window the config gives this layer (0: none). ``layer_types`` says which layers
    slide (Gemma 2 alternates); without it the window applies to every layer unless
    ``use_sliding_window`` is false (Qwen2 keeps a window size it does not use)."""
    w = int(config.get("sliding_window") or 0)
    types = config.get("layer_types")
    if not w or config.get("use_sliding_window") is False:
        return 0
    if isinstance(types, list) and layer is not None and layer < len(types):
        return w if types[layer] == "sliding_attention" else 0
    return w


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, head_dim: int, scale: float, cap: float,
           window: int, kv_offset: int = 0) -> np.ndarray:
    """Causal softmax attention in float64 with grouped KV heads.

    q [T, H*d] are the last T of the S = kv_offset + T positions whose keys and values k, v
    [S, KV*d] hold; query head h reads KV head h // (H / KV). ``cap``: scores become
    cap * tanh(scores / cap) (0: none). ``window``: a query sees the last ``window`` positions,
    itself included (0: all earlier ones)."""
    t, s = q.shape[0], k.shape[0]
    qh = q.reshape(t, -1, head_dim).transpose(1, 0, 2)
    kh = k.reshape(s, -1, head_dim).transpose(1, 0, 2)
    vh = v.reshape(s, -1, head_dim).transpose(1, 0, 2)
    group = qh.shape[0] // kh.shape[0]
    kh, vh = np.repeat(kh, group, axis=0), np.repeat(vh, group, axis=0)
    scores = qh @ kh.transpose(0, 2, 1) * scale
    if cap:
        scores = cap * np.tanh(scores / cap)
    qpos = np.arange(s - t, s)[:, None]
    kpos = np.arange(s)[None, :]
    allowed = kpos <= qpos
    if window:
        allowed &= (qpos - kpos) < window
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(1, 0, 2).reshape(t, -1)


def rope_tables(positions: np.ndarray, rotary: int, theta: float, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, rotary/2] at ``theta``, rounded to the side's dtype as both engines store them."""
    ang = rope_angles(positions, rotary, theta)
    return (to_dtype(np.cos(ang), dtype).astype(np.float64), to_dtype(np.sin(ang), dtype).astype(np.float64))


def _seq(a: np.ndarray) -> np.ndarray:
    """[tokens, features] float64 of the first sequence ([B, T, F] batch first, or [T, F])."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 3:
        a = a[0]
    elif a.ndim == 4:                                # [B, T, heads, d]: q/k norm outputs
        a = a[0].reshape(a.shape[1], -1)
    if a.ndim != 2:
        raise ValueError(f"attention tensor of {a.ndim} dimensions")
    return a


@dataclass
class Problem:
    """One attention call to replay: its tensors (float64) and what the config says."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    target: np.ndarray
    head_dim: int
    dtype: str
    kv_offset: int = 0
    positions: np.ndarray | None = None        # query positions: RoPE still to apply (composite)
    cos_sin: tuple | None = None               # dumped tables [T, r/2] (composite without positions)
    rotary: int = 0


def _limit(p: Problem, heads: int) -> Problem:
    """The leading query tokens of a prefill, as many as MAX_SCORES allows (keys cut alike)."""
    t = p.q.shape[0]
    if p.kv_offset or t * t * heads <= MAX_SCORES:
        return p
    n = max(1, int((MAX_SCORES / heads) ** 0.5))
    cut = lambda a: None if a is None else a[:n]  # noqa: E731
    return Problem(p.q[:n], p.k[:n], p.v[:n], p.target[:n], p.head_dim, p.dtype, 0, cut(p.positions),
                   None if p.cos_sin is None else (p.cos_sin[0][:n], p.cos_sin[1][:n]), p.rotary)


class _Evaluator:
    """Residual of the replay at one set of values, memoised (the coordinate search revisits)."""

    def __init__(self, p: Problem):
        self.p, self.memo, self.rot = p, {}, {}

    def _rotated(self, theta):
        """q and k after RoPE (at ``theta``, or with the dumped tables), rounded as the side stores them."""
        p = self.p
        if theta is None and p.cos_sin is None:
            return p.q, p.k                              # RoPE applied before the module
        if theta not in self.rot:
            cos, sin = p.cos_sin if theta is None else rope_tables(p.positions, p.rotary, theta, p.dtype)
            self.rot[theta] = tuple(to_dtype(rotate(a, cos, sin, p.head_dim), p.dtype).astype(np.float64)
                                    for a in (p.q, p.k))
        return self.rot[theta]

    def __call__(self, values: dict) -> float:
        key = tuple(sorted(values.items()))
        if key not in self.memo:
            q, k = self._rotated(values.get("rope_theta"))
            out = attend(q, k, self.p.v, self.p.head_dim, values[SCALE], values.get("attn_logit_softcapping", 0.0),
                         values.get("sliding_window", 0), self.p.kv_offset)
            self.memo[key] = rel_error(to_dtype(out, self.p.dtype).astype(np.float64), self.p.target)
        return self.memo[key]


def fit(p: Problem, config: dict, layer: int | None, tol: float, with_theta: bool) -> list[dict]:
    """One ``Fit`` record per key: each key's candidates tried with the other keys at their best
    value (a coordinate search from the reference values; one wrong value is found in the first
    round, a second round settles two)."""
    heads = p.q.shape[1] // p.head_dim
    p = _limit(p, heads)
    scales, ref_scale, source = scale_candidates(config, p.head_dim)
    grid = {SCALE: (ref_scale, sorted(set(scales.values())))}
    if with_theta:
        ref = modelconfig.rope_theta(config) or None
        grid["rope_theta"] = (ref, sorted(set(ROPE_THETAS) | ({ref} if ref else set())))
    cap = float(config.get("attn_logit_softcapping") or 0.0)
    if cap:
        grid["attn_logit_softcapping"] = (cap, sorted(set(SOFTCAPS) | {cap}))
    window = layer_window(config, layer)
    if window:
        grid["sliding_window"] = (window, [0, window])
    ev = _Evaluator(p)
    current = {k: (ref if ref is not None else cands[0]) for k, (ref, cands) in grid.items()}
    fits = {}
    for _ in range(MAX_ROUNDS):
        before = dict(current)
        for key, (ref, cands) in grid.items():
            f = Fit(key, ref, tol)
            for c in cands:
                f.add(c, ev({**current, key: c}))
            current[key] = f.record()["fitted"]["value"]
            fits[key] = f
        if current == before:
            break
    out = []
    for key, f in fits.items():
        f = Fit(key, grid[key][0], tol)                      # against the final values of the others
        for c in grid[key][1]:
            f.add(c, ev({**current, key: c}))
        rec = {**f.record(), "values": dict(current), "residuals": [[c, r] for c, r in f.res.items()],
               "tokens": {"queries": p.q.shape[0], "keys": p.k.shape[0]}}
        if key == SCALE:
            rec["scale_candidates"], rec["scale_from"] = scales, source
        out.append(rec)
    return out


def _index(recs: list) -> dict:
    """(layer, role, call) -> the first forward module record."""
    idx = {}
    for r in recs:
        if r.kind == "module" and r.direction == "forward":
            idx.setdefault((r.layer, r.role, r.call), r)
    return idx


class _TooLarge(Exception):
    """A leaf over MAX_LEAF elements: its tensor file would be read whole."""


def _get(view, rec, name):
    """One leaf's array; None when absent, without a file, or a partial sum of row-parallel ranks."""
    if rec is None:
        return None
    leaf = view.leaves[rec.index].get(name)
    if leaf is None or merge_rule(leaf.merge).is_sum:
        return None
    if (leaf.numel or 0) > MAX_LEAF:
        raise _TooLarge(f"{rec.path} {name} holds {leaf.numel} elements (over {MAX_LEAF})")
    return leaf_array(view, leaf)


def _int_leaf(view, rec, names) -> np.ndarray | None:
    for n in names:
        leaf = view.leaves[rec.index].get(n) if rec is not None else None
        if leaf is not None and leaf.dtype and "int" in leaf.dtype:
            a = leaf_array(view, leaf)
            if a is not None:
                return np.asarray(a).reshape(-1) if a.ndim <= 1 else np.asarray(a)[0].reshape(-1)
    return None


_POSITION_LEAVES = ("input_kwargs.positions", "input_kwargs.position_ids", "input_args.0", "input_args.1")


def _positions(view, idx, layer, call) -> np.ndarray | None:
    """The query positions of a call: from the layer's rotary or attention module, else the
    model-level rotary table's input (transformers)."""
    for role, lay in (("rotary", layer), ("attn", layer), ("rotary_model", None)):
        got = _int_leaf(view, idx.get((lay, role, call)), _POSITION_LEAVES)
        if got is not None:
            return got
    return None


def _split_qkv(qkv: np.ndarray, heads: int, kv: int, hd: int):
    if qkv.shape[-1] != (heads + 2 * kv) * hd:
        raise ValueError("fused qkv width is not (heads + 2 * kv_heads) * head_dim")
    return np.split(qkv, [heads * hd, (heads + kv) * hd], axis=-1)


def _composite(view, idx, attn, config, geom) -> Problem | Skip:
    """transformers: q/k/v (after q/k norm) + RoPE -> the o_proj input."""
    heads, kv, hd = geom
    L, c = attn.layer, attn.call
    g = lambda role, leaf="output.0": _get(view, idx.get((L, role, c)), leaf)  # noqa: E731
    target = g("o", "input_args.0")
    qkv = g("qkv")
    if qkv is not None:
        q, k, v = _split_qkv(_seq(qkv), heads, kv, hd)
    else:
        q, k, v = g("q"), g("k"), g("v")
        if q is None or k is None or v is None:
            return Skip("missing_tensor", "the q/k/v projection outputs are not all dumped with tensors")
        q, k, v = _seq(q), _seq(k), _seq(v)
    if target is None:
        return Skip("missing_tensor", "o_proj's input is not dumped with its tensor")
    qn, kn = g("q_norm"), g("k_norm")
    q = _seq(qn) if qn is not None else q
    k = _seq(kn) if kn is not None else k
    dtype = dtype_key(view.leaves[idx[(L, "o", c)].index]["input_args.0"].dtype)
    rotary = int(hd * float(config.get("partial_rotary_factor") or 1.0))
    p = Problem(q, k, v, _seq(target), hd, dtype, rotary=rotary)
    positions = _positions(view, idx, L, c)
    if positions is not None and positions.size and positions[0] > 0:
        return Skip("earlier_kv_missing", f"positions start at {int(positions[0])}: the keys and values of the "
                    "earlier positions (transformers' past_key_values) are not in the dump")
    if modelconfig.rope_type(config) == "default" and positions is not None:
        p.positions = positions[: q.shape[0]]
        return p
    cos, sin = g("attn", "input_kwargs.position_embeddings.0"), g("attn", "input_kwargs.position_embeddings.1")
    if cos is None or sin is None:
        cos, sin = g("rotary_model", "output.0"), g("rotary_model", "output.1")
    if cos is None or sin is None:
        return Skip("rope_scaling" if positions is not None else "positions_unknown",
                    "rope_scaling is not the default and no cos/sin tables are dumped" if positions is not None
                    else "neither the positions nor the cos/sin tables are dumped")
    cos, sin = _seq(cos), _seq(sin)
    half = cos.shape[-1] // 2                          # transformers repeats the angles: [a, a]
    p.cos_sin = (cos[: q.shape[0], :half], sin[: q.shape[0], :half])
    return p


def _module(view, idx, recs_by_path, core, config, geom) -> Problem | Skip:
    """vLLM/SGLang ``attn``: q, k, v after RoPE -> its output; a decode step with the earlier calls' k, v."""
    _heads, _kv, hd = geom
    g = lambda rec, leaf: _get(view, rec, leaf)  # noqa: E731
    q, k, v, out = (g(core, n) for n in ("input_args.0", "input_args.1", "input_args.2", "output.0"))
    if q is None or k is None or v is None or out is None:
        return Skip("missing_tensor", "q, k, v or the output of the attention module is not dumped with its tensor")
    training = q.ndim == 4 and k.ndim == 4 and out.ndim == 3
    if training:
        # Megatron's core_attention: [s, b, heads, d] and [s, b, heads*d]; the first sequence.
        q, k, v, out = (a[:, 0].reshape(a.shape[0], -1) for a in (q, k, v, out))
    if q.ndim != 2 or k.ndim != 2 or q.shape[-1] % hd or k.shape[-1] % hd or out.shape != q.shape:
        return Skip("layout", f"q {list(q.shape)}, k {list(k.shape)}: not [tokens, heads*head_dim] rows")
    positions = _positions(view, idx, core.layer, core.call)
    if positions is None and not training:
        return Skip("positions_unknown", "no dumped positions say whether this call is a prefill or a decode step")
    # Megatron's sequence-first layout is its training forward, which holds no KV cache.
    start = int(positions[0]) if positions is not None and positions.size else 0
    earlier = [r for r in recs_by_path[core.path] if r.call < core.call]
    ks = [g(r, "input_args.1") for r in earlier]
    vs = [g(r, "input_args.2") for r in earlier]
    have = sum(a.shape[0] for a in ks if a is not None)
    if start and (any(a is None for a in ks + vs) or have != start):
        return Skip("earlier_kv_missing", f"a decode step at position {start} needs the keys and values of "
                    f"{start} earlier positions; the earlier steps in this dump hold {have}")
    if start:
        k, v = np.concatenate(ks + [k]), np.concatenate(vs + [v])
    dtype = dtype_key(view.leaves[core.index]["output.0"].dtype)
    f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
    return Problem(f64(q), f64(k), f64(v), f64(out), hd, dtype, kv_offset=start)


def run(recs: dict, views: dict, refs: dict, tolerances: dict) -> list[dict]:
    """Attention replays of both sides: vLLM/SGLang ``attn`` modules, else transformers' composite."""
    out = []
    for side in ("train", "rollout"):
        ref = refs.get(side)
        config = ref.checkpoint.config if ref else {}
        view, idx, geom = views[side], _index(recs[side]), _geometry(config)
        by_path: dict[str, list] = {}
        for r in recs[side]:
            if r.kind == "module" and r.direction == "forward" and r.role == "attn_core":
                by_path.setdefault(r.path, []).append(r)
        for (layer, role, call), rec in sorted(idx.items(), key=lambda kv: kv[1].index):
            core = idx.get((layer, "attn_core", call))
            if role == "attn_core":
                subject, composite = rec, False
            elif role == "attn" and core is None and (layer, "o", call) in idx:
                subject, composite = rec, True
            else:
                continue
            head = {"side": side, "module": subject.path, "class": subject.cls, "role": subject.role,
                    "layer": layer, "op": "attention", "call": call,
                    "source": "composite: q/k/v outputs and RoPE against o_proj's input" if composite
                    else "attention module: q, k, v against its output"}
            try:
                prob = (Skip("no_config", "the head counts and head_dim come from the config (--model): none "
                             "readable") if geom is None
                        else _composite(view, idx, subject, config, geom) if composite
                        else _module(view, idx, by_path, subject, config, geom))
                if isinstance(prob, Skip):
                    out.append({**head, "skipped": prob.code, "reason": prob.reason, "skip": prob})
                    continue
                tol, _ = pair_tolerances(tolerances["replay"], prob.dtype, prob.dtype)
                for r in fit(prob, config, layer, tol, with_theta=prob.positions is not None):
                    out.append({**head, "dtype": prob.dtype, "head_dim": prob.head_dim,
                                "rope": "positions" if prob.positions is not None else
                                "dumped cos/sin" if prob.cos_sin is not None else "applied before", **r})
            except _TooLarge as exc:
                out.append({**head, "skipped": "too_large", "reason": str(exc), "skip": Skip("too_large", str(exc))})
            except (ValueError, IndexError, TypeError) as exc:
                # Tensors that do not fit the standard signature: not replayed, never blamed.
                out.append({**head, "skipped": "layout", "reason": str(exc), "skip": Skip("layout", str(exc))})
    return out
