"""Each side's parameters against the reference checkpoint (output_3 ``reference``).

The checkpoint is a third copy of the tensors both engines loaded, so the question per side is
the one compare/params.py answers between the sides (md5, tensor, statistics), asked again with
the reference in the other seat. The reference tensor of a dumped parameter is found through the
naming profiles: each checkpoint tensor name is classified like a dumped module path, which gives
its logical point (``L1.q.weight``); a fused point (``L1.q.weight+L1.k.weight+L1.v.weight``) is
the concatenation of its parts in that order. The side's layout is then reproduced: tensor-parallel
ranks concatenated part by part, Megatron's per-query-group qkv, padded vocabulary rows (zeros),
one rank's slice, and the side's dtype (round to nearest even). Why each rule holds:
references/reference_checkpoint.md.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np

from . import modelconfig, tensorio
from .arrays import leaf_array, merge_rule, to_dtype
from .checkpoint import Checkpoint
from .compare import leaf_stats
from .compare import params as P
from .compare.layout import GROUPED, VOCAB_POINTS, interleave_parts
from .compare.stats import Stats, combine, stat_errors
from .dtypes import dtype_key
from .naming import Namer
from .tolerances import pair_tolerances

# config.json keys that change the math of standard modules (issue 12; references/reference_checkpoint.md).
MATH_KEYS = ("rms_norm_eps", "layer_norm_eps", "layernorm_epsilon", "rope_theta", "rope_scaling",
             "partial_rotary_factor", "head_dim", "hidden_act", "hidden_activation", "tie_word_embeddings",
             "torch_dtype", "dtype", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
             "sliding_window", "norm_topk_prob", "num_experts_per_tok", "hidden_size", "num_attention_heads",
             "num_key_value_heads", "vocab_size")


def math_config(config: dict) -> dict:
    """The math-changing keys of a config; rope values nested in ``rope_parameters`` (transformers 5)
    are lifted to the top-level names older configs use."""
    out = {k: config[k] for k in MATH_KEYS if k in config}
    for key, value in modelconfig.lifted_rope(config).items():
        out.setdefault(key, value)
    return out


@dataclass
class SideReference:
    """One side's reference: its checkpoint, the config it resolved, and point -> tensor names."""
    checkpoint: Checkpoint
    config: dict
    points: dict[str, str]
    taken_as: str
    config_file: str | None = None

    def describe(self) -> dict:
        """output_3/output_5 ``reference`` entry of this side."""
        return {"folder": str(self.checkpoint.folder), "files": [f.name for f in self.checkpoint.files],
                "tensors": len(self.checkpoint.tensors), "taken_as": self.taken_as,
                "config_file": self.config_file or str(self.checkpoint.folder / "config.json"),
                "config": math_config(self.config),
                "model_config": math_config(self.checkpoint.config)}


# Mixture of experts: one expert's projections in a checkpoint (transformers 4.x / vLLM names, and
# Mixtral's w1 = gate, w3 = up, w2 = down) and the stacked tensors of transformers 5.x / vLLM.
_EXPERT = re.compile(r"^(?P<base>.+)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)$")
_EXPERT_PART = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
_STACKED = {"gate_up_proj": "gate_up", "w13_weight": "gate_up", "down_proj": "down", "w2_weight": "down"}
_EXPERTS_POINT = re.compile(r"^(?P<scope>L\d+)\.experts\.(?P<part>gate_up|down)\.weight$")


def _expert_point(namer: Namer, path: str, pname: str) -> str | None:
    """The point of a per-expert or stacked experts tensor, None for any other tensor."""
    m = _EXPERT.match(path)
    base, tail = (m["base"], f"{m['e']}.{_EXPERT_PART[m['proj']]}.{pname}") if m else (path, None)
    layer, _local, rule = namer.classify(base)
    if layer is None or rule is None or rule["role"] != "experts":
        return None
    if tail is not None:
        return f"L{layer}.experts.{tail}"
    return f"L{layer}.experts.{_STACKED[pname]}.weight" if pname in _STACKED else None


def index_points(ckpt: Checkpoint, namer: Namer) -> dict[str, str]:
    """Logical point of every checkpoint tensor, named by the rules that name dumped modules."""
    out = {}
    for name in ckpt.tensors:
        path, _, pname = name.rpartition(".")
        path = namer.strip_wrappers(path)
        expert = _expert_point(namer, path, pname)
        if expert is not None:
            out.setdefault(expert, name)
            continue
        layer, _local, rule = namer.classify(path)
        scope = f"L{layer}" if layer is not None else "M"
        if rule is None or rule["role"] in ("dropout", "wrapper"):
            point = f"path:{path}:parameters.{pname}"
        elif rule.get("parts"):
            point = "+".join(f"{scope}.{part}.{pname}" for part in rule["parts"])
        else:
            point = f"{scope}.{rule['role']}.{pname}"
        out.setdefault(point, name)
    if "M.lm_head.weight" not in out and "M.embed.weight" in out and ckpt.config.get("tie_word_embeddings", True):
        out["M.lm_head.weight"] = out["M.embed.weight"]   # tied: the head is the embedding
    return out


def reference_parts(ref: SideReference, point: str) -> list[str] | None:
    """Checkpoint tensor names whose concatenation is ``point`` (None when one is missing)."""
    if point in ref.points:
        return [ref.points[point]]
    names = [ref.points.get(p) for p in point.split("+")]
    return None if None in names else names


def expert_names(ref: SideReference, point: str) -> list[str] | None:
    """Checkpoint tensors of a stacked experts point (``L1.experts.gate_up.weight``): the stacked
    tensor itself, or every expert's gate and up (down) tensors in expert order; None otherwise."""
    m = _EXPERTS_POINT.match(point)
    if m is None:
        return None
    if point in ref.points:
        return [ref.points[point]]
    parts = ("gate", "up") if m["part"] == "gate_up" else ("down",)
    names, e = [], 0
    while f"{m['scope']}.experts.{e}.{parts[0]}.weight" in ref.points:
        got = [ref.points.get(f"{m['scope']}.experts.{e}.{p}.weight") for p in parts]
        if None in got:
            return []
        names += got
        e += 1
    return names


def _expert_parts(arrays: list[np.ndarray], gate_up: bool) -> list[np.ndarray]:
    """The checkpoint's expert tensors as [E, I, H] gate and up (``down``: one [E, H, I])."""
    if len(arrays) == 1:            # stacked in the checkpoint: its halves are gate and up
        return np.split(arrays[0], 2, axis=1) if gate_up else arrays
    k = 2 if gate_up else 1
    return [np.stack(arrays[i::k]) for i in range(k)]


def stacked_experts(arrays: list[np.ndarray], point: str) -> np.ndarray:
    """The experts stacked as an engine holds them whole: [E, 2I, H] with each expert's [gate; up]
    rows (``down``: [E, H, I])."""
    return np.concatenate(_expert_parts(arrays, ".gate_up." in point), axis=1)


def expert_layouts(arrays: list[np.ndarray], point: str, shape: tuple | None,
                   ranks: list[int]) -> list[tuple[str, np.ndarray]]:
    """Candidate arrangements of stacked experts: whole (:func:`stacked_experts`); under tensor
    parallelism each rank holds [gate_r; up_r] of every expert (down: its slice of I), and merged
    ranks are those shards side by side."""
    gate_up = ".gate_up." in point
    parts = _expert_parts(arrays, gate_up)
    full = np.concatenate(parts, axis=1)
    cands = [("stacked per expert", full)]
    if shape is not None and tuple(full.shape) == tuple(shape) and not ranks:
        return cands            # one unmerged side holding every expert whole: no shard can fit
    ax = 1 if gate_up else 2
    for n in range(2, 17):
        if any(p.shape[ax] % n for p in parts):
            continue
        shards = [np.concatenate([np.split(p, n, axis=ax)[r] for p in parts], axis=1) for r in range(n)]
        if gate_up and n in ranks:
            cands.append((f"per-rank concatenation of {n} shards", np.concatenate(shards, axis=1)))
        cands += [(f"shard {r} of {n} along dim {ax}", a) for r, a in enumerate(shards)]
    return [c for c in cands if shape is None or c[1].shape == tuple(shape)]


def split_fused_qkv(parts: list[np.ndarray], point: str, config: dict) -> list[np.ndarray]:
    """A checkpoint that stores qkv fused (Phi-3) split into [q, k, v] by the config's head counts."""
    hd, (heads, kv) = modelconfig.head_dim(config), modelconfig.head_counts(config)
    if len(parts) != 1 or len(point.split("+")) != 3 or not hd or not heads:
        return parts
    q_rows, kv_rows = heads * hd, kv * hd
    if parts[0].shape[0] != q_rows + 2 * kv_rows:
        return parts
    return np.split(parts[0], [q_rows, q_rows + kv_rows], axis=0)


def _rank_rows(part: np.ndarray, r: int, ranks: int, head: int) -> np.ndarray:
    """Rank ``r``'s rows of a column-parallel part: an even split, or, when the part has fewer heads
    than ranks (KV heads under a wider tensor parallelism), the head the rank replicates."""
    heads = part.shape[0] // head
    if heads >= ranks:
        return np.split(part, ranks, axis=0)[r]
    h = r * heads // ranks
    return part[h * head:(h + 1) * head]


def layouts(parts: list[np.ndarray], shape: tuple | None, ranks: list[int], grouped: bool, config: dict,
            vocab: bool, qkv: bool = False) -> list[tuple[str, np.ndarray]]:
    """Candidate arrangements of the reference parts in the side's layout, most likely first."""
    cands = [("concatenated", np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0])]
    head = (modelconfig.head_dim(config) if qkv else 1) or 1
    for n in ranks if len(parts) > 1 and all(p.shape[0] % head == 0 for p in parts) else ():
        if any(p.shape[0] // head >= n and (p.shape[0] // head) % n for p in parts):
            continue
        a = np.concatenate([_rank_rows(p, r, n, head) for r in range(n) for p in parts])
        if shape is None or a.shape == tuple(shape):
            cands.append((f"per-rank concatenation of {n} shards", a))
    kv = modelconfig.head_counts(config)[1] or 0
    if grouped and len(parts) == 3 and kv and all(p.shape[0] % kv == 0 for p in parts):
        cands.append((f"Megatron per-group qkv ({kv} groups)", interleave_parts(parts, kv, 0)))
    if shape is None:
        return cands
    out = []
    for label, a in cands:
        if a.shape == tuple(shape):
            out.append((label, a))
        elif a.ndim == len(shape) and vocab and shape[0] > a.shape[0] and a.shape[1:] == tuple(shape[1:]):
            pad = np.zeros((shape[0] - a.shape[0], *a.shape[1:]), a.dtype)
            out.append((label + ", vocabulary padded with zero rows", np.concatenate([a, pad])))
        elif a.ndim == len(shape):
            out += _slices(label, a, tuple(shape))
    return out


def _slices(label: str, a: np.ndarray, shape: tuple) -> list[tuple[str, np.ndarray]]:
    """One rank's shard: each equal slice along the one dimension that differs."""
    diff = [i for i, (x, y) in enumerate(zip(a.shape, shape)) if x != y]
    if len(diff) != 1 or not shape[diff[0]] or a.shape[diff[0]] % shape[diff[0]]:
        return []
    d, n = diff[0], a.shape[diff[0]] // shape[diff[0]]
    return [(f"{label}, shard {i} of {n} along dim {d}", s) for i, s in enumerate(np.split(a, n, axis=d))]


def _crc(a: np.ndarray, dtype: str) -> str:
    if dtype == "bfloat16":
        data = tensorio.bfloat16_bits(a).astype("<u2")
    elif dtype == "float16":
        data = a.astype("<f2")
    else:
        data = a.astype({"float64": "<f8"}.get(dtype, "<f4"))
    return f"{zlib.crc32(np.ascontiguousarray(data).tobytes()):08x}"


def _stats(a: np.ndarray, dtype: str) -> Stats:
    w = a.astype(np.float64)
    return Stats(float(w.max()), float(w.min()), float(w.mean()), float(np.sqrt(np.sum(w * w))), int(a.size), dtype)


def _side_tensor(view, leaves) -> np.ndarray | None:
    """The side's parameter as one array (parts stacked along rows), or None without files."""
    arrays = [leaf_array(view, lf) for lf in leaves]
    if any(a is None for a in arrays):
        return None
    return np.concatenate(arrays, axis=0) if len(arrays) > 1 else arrays[0]


def _differing_ranks(ref: np.ndarray, side: np.ndarray, leaf) -> list[int]:
    """Ranks whose shard differs, for a leaf merged from equal shards along its concat dimension."""
    rule = merge_rule(leaf.merge)
    if not leaf.shards or not rule.is_concat or len(leaf.shards) < 2:
        return []
    n, dim = len(leaf.shards), rule.dim
    if ref.shape[dim] % n:
        return []
    return [i for i, (a, b) in enumerate(zip(np.split(ref, n, axis=dim), np.split(side, n, axis=dim)))
            if not np.array_equal(a, b, equal_nan=True)]


def judge_side(ref: SideReference, point: str, view, leaves, layout: str | None, tolerances: dict,
               use_tensors: bool) -> dict:
    """``matches_reference`` of one side's parameter: true | false | unknown, with how it is known."""
    stacked = expert_names(ref, point)
    names = reference_parts(ref, point) if stacked is None else stacked
    base = {"checkpoint_tensors": names}
    if not names:
        return {**base, "matches_reference": "unknown", "how": None, "exact": False,
                "detail": f"no tensor of the checkpoint is named {point}"}
    dtype = dtype_key(leaves[0].dtype)
    parts = [to_dtype(ref.checkpoint.read(n), dtype) for n in names]
    parts = parts if stacked is not None else split_fused_qkv(parts, point, ref.config)
    if len(leaves) == len(parts) > 1 and stacked is None:
        shape = (sum(lf.shape[0] for lf in leaves), *leaves[0].shape[1:]) if all(lf.shape for lf in leaves) else None
    else:
        shape = leaves[0].shape if len(leaves) == 1 else None
    # Merged ranks: their count is known from the tensor files, else every count the shape allows.
    merged = len(leaves) == 1 and merge_rule(leaves[0].merge).is_concat
    ranks = ([len(leaves[0].shards)] if leaves[0].shards else list(range(2, 17))) if merged else []
    base_point = point.split("+")[0]
    cands = expert_layouts(parts, point, shape, ranks) if stacked is not None else layouts(
        parts, shape, ranks, layout == GROUPED, ref.config, any(p in VOCAB_POINTS for p in (base_point, point)),
        base_point.split(".")[1:2] == ["q"])
    if all(lf.numel == 0 for lf in leaves):
        # vLLM's CPU build repacks linear weights for oneDNN and leaves an empty tensor behind.
        return {**base, "matches_reference": "unknown", "how": None, "exact": False,
                "detail": "not visible: the dump holds an empty tensor for this weight (an engine that keeps it "
                          "prepacked, such as vLLM's CPU build); compare it in the engine (check_weight_sync.py)"}
    if not cands:
        return {**base, "matches_reference": "unknown", "how": None, "exact": False,
                "detail": f"reference shape {[list(p.shape) for p in parts]} fits no layout of side shape "
                          f"{list(shape) if shape else None}"}
    eq = label = None
    lf0 = leaves[0]
    if len(leaves) == 1 and lf0.checksum and not lf0.merge:
        hits = [lab for lab, a in cands if _crc(a, dtype) == lf0.checksum]
        label = hits[0] if hits else cands[0][0]
        eq = {"equal": bool(hits), "how": "md5", "exact": True,
              "detail": "equal CRC-32 digest" if hits else f"digest {lf0.checksum} is no layout's digest of the reference"}
    side = _side_tensor(view, leaves) if use_tensors and eq is None else None
    if side is not None:
        side = side.reshape(cands[0][1].shape) if side.size == cands[0][1].size else side
        same = [lab for lab, a in cands if a.shape == side.shape and np.array_equal(a, side, equal_nan=True)]
        if same:
            label, eq = same[0], P.by_tensor(0.0)
        else:
            fits = [(float(np.max(np.abs(a.astype(np.float64) - side))), lab, a) for lab, a in cands
                    if a.shape == side.shape]
            if not fits:
                return {**base, "matches_reference": "unknown", "how": "tensor", "exact": False,
                        "detail": f"side tensor {list(side.shape)} fits no layout of the reference"}
            diff, label, a = min(fits, key=lambda f: f[0])
            eq = P.by_tensor(diff)
            bad = _differing_ranks(a, side, lf0) if len(leaves) == 1 else []
            if bad:
                eq["detail"] += f"; only in the shard of rank(s) {', '.join(map(str, bad))}"
            if np.array_equal(np.sort(a, axis=None), np.sort(side, axis=None)):
                eq["detail"] += "; the same values in another order (a permuted or mis-ordered weight)"
    if eq is None:
        ss = combine([leaf_stats(lf) for lf in leaves])
        tol, _strict = pair_tolerances(tolerances["statistics"], dtype, dtype)
        best = None
        for lab, a in cands:
            rs = _stats(a, dtype)
            err = stat_errors(ss, rs).get("scaled_error")
            e = P.by_statistics(ss, rs, dtype, dtype, err is not None and err <= tol)
            if best is None or (e["equal"] and not best[1]["equal"]):
                best = (lab, e)
        label, eq = best
    eq = {**eq, "detail": eq["detail"].replace("train ", "side ").replace("rollout ", "reference ")}
    value = "unknown" if eq["equal"] is None else bool(eq["equal"])
    return {**base, "matches_reference": value, "how": eq["how"], "exact": eq["exact"], "layout": label,
            "detail": eq["detail"]}


def check(results, plans, views: dict, refs: dict, tolerances: dict, use_tensors: bool) -> None:
    """Set ``reference`` on every parameter result: per side, whether it equals the checkpoint."""
    by_cid = {p.cid: p for p in plans}
    for res in results:
        plan = by_cid.get(res.cid)
        if plan is None or not all(lf.startswith("parameters.") for lf in res.train["leaves"] + res.rollout["leaves"]):
            continue
        out = {}
        for side, carriers, layout in (("train", plan.train, plan.train_layout),
                                       ("rollout", plan.rollout, plan.rollout_layout)):
            view = views[side]
            leaves = [view.leaves[c.rec].get(c.leaf) for c in carriers]
            if refs.get(side) is None or None in leaves:
                continue
            out[side] = judge_side(refs[side], res.point, view, leaves, layout, tolerances, use_tensors)
        res.reference = out or None


def unpaired(plans, recs: dict, views: dict, refs: dict, tolerances: dict, use_tensors: bool) -> dict[str, list[dict]]:
    """Per side, the parameters only that side dumps (no comparison plans them), each against the
    checkpoint: a transformers 5.x experts module's stacked ``gate_up_proj`` while vLLM 0.32's
    MoERunner dumps no expert weight, a trainer's ``lm_head`` while the engine never calls it. The
    other side's missing copy does not make the visible one unjudgeable (output_3
    ``reference.<side>.unpaired_parameters``)."""
    out: dict[str, list[dict]] = {}
    planned = {p.point for p in plans}
    for side, ref in refs.items():
        if ref is None:
            continue
        # A leaf any comparison reads (a part of a fused composite included) is judged by check().
        carried = {(c.rec, c.leaf) for p in plans for c in getattr(p, side)}
        seen, found = set(), []
        for r in recs[side]:
            if r.kind != "module" or r.direction != "forward":
                continue
            for port in r.ports:
                if port.io != "param" or (r.index, port.leaf) in carried or port.point in planned \
                        or port.point in seen:
                    continue
                leaf = views[side].leaves[r.index].get(port.leaf)
                if leaf is None:
                    continue
                seen.add(port.point)
                found.append({"point": port.point, "module": r.path, "leaf": port.leaf,
                              **judge_side(ref, port.point, views[side], [leaf], None, tolerances, use_tensors)})
        out[side] = found
    return out
