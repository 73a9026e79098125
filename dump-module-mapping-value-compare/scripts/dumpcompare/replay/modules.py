"""Replay standard modules from each side's own dumped tensors (tensor mode; output_3 ``replays``).

A norm, an activation, a linear layer or an embedding lookup is a known function of its dumped
inputs, parameters and one config value (eps, the activation, the bias, the embedding scale).
Replaying it on each side with the reference config's value says whether that side computed what
the config says; trying the other candidate values says which one it did use. Why this decides a
side, and when it cannot: rl-consistency-analysis/references/deciding_the_side.md ("Replay").
"""
from __future__ import annotations

import math

import numpy as np

from .. import modelconfig
from ..arrays import leaf_array, merge_rule, rel_error, to_dtype
from ..dtypes import dtype_key
from ..tolerances import pair_tolerances
from .kernels import (ACT_NAMES, ACTS, EPS_GRID, MAX_ELEMENTS, MAX_LEAF, ROPE_THETAS, Fit, activation, norm, rope,
                      softcap)

NORM_ROLES = ("input_norm", "post_norm", "final_norm", "q_norm", "k_norm")
LINEAR_ROLES = ("q", "k", "v", "o", "gate", "up", "down", "qkv", "gate_up", "lm_head")


def _rows(a: np.ndarray) -> np.ndarray:
    """[tokens, features] float64, the leading tokens only."""
    a = np.asarray(a, dtype=np.float64)
    a = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    return a[:max(1, MAX_ELEMENTS // max(1, a.shape[1]))]


def _norm_kind(cls: str) -> str:
    if "Gemma" in cls:
        return "gemma_rms"
    return "layer" if "LayerNorm" in cls and "RMS" not in cls else "rms"


def _op(rec) -> str | None:
    if rec.role in NORM_ROLES or any(t in rec.cls for t in ("RMSNorm", "LayerNorm")):
        return "norm"
    if rec.cls in ("SiluAndMul", "GeluAndMul") or rec.role == "act":
        return "act"
    if rec.role in LINEAR_ROLES:
        return "linear"
    if rec.role == "embed":
        return "embed"
    if rec.role == "logits":
        return "head"
    if rec.role == "rotary":
        return "rope"
    return None


def _config_eps(config: dict, kind: str):
    keys = ("layer_norm_eps", "layernorm_epsilon") if kind == "layer" else ("rms_norm_eps",)
    for k in keys:
        if k in config:
            return k, float(config[k])
    return keys[0], None


def replay_module(rec, leaves: dict, view, config: dict, tol: float, head=None) -> dict | None:
    """Replay one module of one side; None when it is not a standard module or a tensor is missing.

    ``head``: the reference lm_head weight, for a logits processor (vLLM never dumps the head's
    weight there: lm_head.forward does not run)."""
    op = _op(rec)
    if op is None or (op == "head" and head is None):
        return None
    get = lambda name: leaf_array(view, leaves[name]) if name in leaves else None  # noqa: E731
    out = get("output.0")
    if out is None:
        return None
    dtype = dtype_key(leaves["output.0"].dtype)
    if any(merge_rule(lf.merge).is_sum for lf in leaves.values()):
        return None                                   # partial sums of row-parallel ranks
    y = _rows(out)
    if op == "norm":
        x, w = get("input_args.0"), get("parameters.weight")
        if x is None or w is None:
            return None
        x = _rows(x)
        res = get("input_args.1")
        if res is not None and "output.1" in leaves:     # vLLM fused add + norm: normalises x + residual
            x = x + _rows(res)
        b = get("parameters.bias")
        kind = _norm_kind(rec.cls)
        key, ref = _config_eps(config, kind)
        fit = Fit(key, ref, tol)
        for eps in sorted(set(EPS_GRID) | ({ref} if ref is not None else set())):
            z = to_dtype(norm(kind, x, w.astype(np.float64), None if b is None else b.astype(np.float64), eps), dtype)
            fit.add(eps, rel_error(z.astype(np.float64), y))
        detail = {"norm": kind}
    elif op == "act":
        x = get("input_args.0")
        if x is None:
            return None
        x = _rows(x)
        gated = rec.cls in ("SiluAndMul", "GeluAndMul") or x.shape[-1] == 2 * y.shape[-1]
        key = "hidden_activation" if "hidden_activation" in config else "hidden_act"
        ref = ACT_NAMES.get(str(config.get(key))) if key in config else None
        fit = Fit(key, ref, tol)
        for name in ACTS:
            if gated:
                h = x.shape[-1] // 2
                z = activation(name, x[:, :h]) * x[:, h:]
            else:
                z = activation(name, x)
            fit.add(name, rel_error(to_dtype(z, dtype).astype(np.float64), y))
        detail = {"gated": gated}
    elif op == "linear":
        x, w = get("input_args.0"), get("parameters.weight")
        if x is None or w is None or leaves["parameters.weight"].merge:
            return None
        x, b = _rows(x), get("parameters.bias")
        fit = Fit("bias", b is not None, tol)
        fit.add(False, rel_error(to_dtype(x @ w.astype(np.float64).T, dtype).astype(np.float64), y))
        if b is not None:
            fit.add(True, rel_error(to_dtype(x @ w.astype(np.float64).T + b, dtype).astype(np.float64), y))
        detail = {}
    elif op == "rope":
        pos, q, k, k_out = get("input_args.0"), get("input_args.1"), get("input_args.2"), get("output.1")
        head = modelconfig.head_dim(config) or 0
        if pos is None or q is None or k is None or k_out is None or not head or modelconfig.rope_type(config) != "default":
            return None                       # rope_scaling variants are not replayed
        rotary = int(head * float(config.get("partial_rotary_factor", 1.0)))
        positions = np.asarray(pos).reshape(-1)
        q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
        y = np.concatenate([_rows(out), _rows(k_out)], axis=-1)
        ref = modelconfig.rope_theta(config)
        fit = Fit("rope_theta", ref, tol)
        for theta in set(ROPE_THETAS) | ({ref} if ref else set()):
            # The pairing style is the engine's choice per model, not a config value: the better one.
            fit.add(theta, min(rel_error(to_dtype(_rows(np.concatenate(
                [rope(q, positions, head, rotary, theta, il), rope(k, positions, head, rotary, theta, il)], -1)),
                dtype).astype(np.float64), y) for il in (False, True)))
        detail = {"head_dim": head, "rotary_dim": rotary}
    elif op == "head":
        x = get("input_args.1")
        if x is None:
            return None
        x = _rows(x)
        logits = x @ head.astype(np.float64)[: y.shape[-1]].T
        ref = float(config.get("final_logit_softcapping") or 0.0)      # 0: no capping
        fit = Fit("final_logit_softcapping", ref, tol)
        for cap in {0.0, 30.0, 50.0, ref}:
            fit.add(cap, rel_error(to_dtype(softcap(logits, cap), dtype).astype(np.float64), y))
        detail = {}
    else:  # embedding lookup, scaled (Gemma multiplies by sqrt(hidden))
        ids, w = get("input_args.0"), get("parameters.weight")
        if ids is None or w is None or leaves["parameters.weight"].merge:
            return None
        looked = _rows(w.astype(np.float64)[np.asarray(ids).reshape(-1)[: len(y)]])
        hidden = w.shape[-1]
        gemma = str(config.get("model_type", "")).startswith("gemma")
        ref = (round(math.sqrt(hidden), 6) if gemma else 1.0) if config else None
        fit = Fit("embedding scale", ref, tol)
        for scale in {1.0, round(math.sqrt(hidden), 6)} | ({ref} if ref else set()):
            fit.add(scale, rel_error(to_dtype(looked * scale, dtype).astype(np.float64), y))
        detail = {}
    return {"module": rec.path, "class": rec.cls, "role": rec.role, "layer": rec.layer, "op": op, "dtype": dtype,
            **detail, **fit.record()}


def run(recs: dict, views: dict, refs: dict, tolerances: dict) -> list[dict]:
    """Replays of every standard module on both sides (forward calls with tensor files)."""
    out = []
    for side in ("train", "rollout"):
        ref = refs.get(side)
        config = ref.checkpoint.config if ref else {}
        head_name = ref.points.get("M.lm_head.weight") if ref else None
        head = ref.checkpoint.read(head_name) if head_name else None
        for rec in recs[side]:
            if rec.kind != "module" or rec.direction != "forward" or rec.call != 0:
                continue
            leaves = views[side].leaves[rec.index]
            if "output.0" not in leaves or not leaves["output.0"].data_name \
                    or any((lf.numel or 0) > MAX_LEAF for lf in leaves.values()):
                continue
            dt = leaves["output.0"].dtype
            tol, _ = pair_tolerances(tolerances["replay"], dt, dt)
            try:
                r = replay_module(rec, leaves, views[side], config, tol, head)
            except (ValueError, IndexError):
                # Tensors that do not fit the standard module's signature (another layout, a
                # module that only shares the role's name): it is not replayed, never blamed.
                r = None
            if r is not None:
                out.append({"side": side, **r})
    return out
