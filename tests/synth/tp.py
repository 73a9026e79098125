"""Split one vLLM/SGLang-layout forward into the per-rank dumps of a tensor-parallel run.

Follows the engines' sharding: column-parallel ``qkv_proj``/``gate_up_proj`` keep each rank's
slice of every part ([q_r | k_r | v_r], [gate_r | up_r]); RoPE, attention and the activation see
the local heads and columns; row-parallel ``o_proj``/``down_proj`` take the local inputs and the
matching weight columns and return the all-reduced output (or, with ``partial=True``, each rank's
partial sum, as SGLang models that defer the all-reduce do); the vocabulary-parallel embedding
holds a slice of the rows; everything else is replicated.
"""
import copy

import numpy as np

from dumpcompare.unshard import RuleFacts

from .model import Config
from .record import Leaf


def _split(a: np.ndarray, tp: int, axis: int) -> list:
    return np.split(a, tp, axis=axis)


def _split_parts(a: np.ndarray, sizes: list, tp: int, axis: int) -> list:
    """Per rank, the rank's slice of each part laid side by side ([p0_r | p1_r | ...])."""
    parts = np.split(a, np.cumsum(sizes)[:-1], axis=axis)
    per_part = [_split(p, tp, axis) for p in parts]
    return [np.concatenate([pp[r] for pp in per_part], axis=axis) for r in range(tp)]


def _leaf(leaf: Leaf, data: np.ndarray) -> Leaf:
    return Leaf(np.ascontiguousarray(data), leaf.dtype, leaf.requires_grad)


def shard_entries(entries: list, cfg: Config, tp: int, partial: bool = False) -> list:
    """Return ``tp`` entry lists, one per rank, for a ``vllm``/``sglang`` layout run."""
    if cfg.heads % tp or cfg.kv_heads % tp or cfg.intermediate % tp or cfg.vocab % tp:
        raise ValueError(f"heads, kv_heads, intermediate and vocab must divide by tp={tp}")
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    qkv_sizes, gu_sizes = [q, kv, kv], [cfg.intermediate, cfg.intermediate]
    ranks = [[] for _ in range(tp)]
    partials: dict = {}
    for e in entries:
        copies = [copy.deepcopy(e) for _ in range(tp)]
        key = e.key

        def put(get, split):
            """Replace one leaf in every rank's copy by that rank's piece."""
            leaf = get(e)
            if leaf is None:
                return
            pieces = split(leaf.data)
            for r, c in enumerate(copies):
                _set(c, get, _leaf(leaf, pieces[r]))

        if ".qkv_proj." in key:
            put(_param, lambda a: _split_parts(a, qkv_sizes, tp, 0))
            put(_out(0), lambda a: _split_parts(a, qkv_sizes, tp, -1))
        elif ".gate_up_proj." in key:
            put(_param, lambda a: _split_parts(a, gu_sizes, tp, 0))
            put(_out(0), lambda a: _split_parts(a, gu_sizes, tp, -1))
        elif ".act_fn." in key:
            put(_arg(0), lambda a: _split_parts(a, gu_sizes, tp, -1))
            put(_out(0), lambda a: _split(a, tp, -1))
        elif ".rotary_emb." in key or ".attn." in key:
            for i in (0, 1, 2):
                if i < len(e.input_args) and isinstance(e.input_args[i], Leaf) and e.input_args[i].is_float:
                    put(_arg(i), lambda a: _split(a, tp, -1))
            for i in range(len(e.output)):
                if isinstance(e.output[i], Leaf):
                    put(_out(i), lambda a: _split(a, tp, -1))
        elif ".o_proj." in key or ".down_proj." in key:
            xs = _split(e.input_args[0].data, tp, -1)
            ws = _split(e.parameters["weight"].data, tp, 1)
            put(_arg(0), lambda a: xs)
            put(_param, lambda a: ws)
            if partial:
                sums = [x.astype(np.float64) @ w.T.astype(np.float64) for x, w in zip(xs, ws)]
                sums = [s.astype(np.float32) for s in sums]
                put(_out(0), lambda a: sums)
                partials[key.rsplit(".", 4)[0]] = sums
        elif ".embed_tokens." in key:
            put(_param, lambda a: _split(a, tp, 0))
        elif partial and (key.endswith(".LlamaAttention.forward.0") or key.endswith(".LlamaMLP.forward.0")):
            inner = "self_attn.o_proj" if "Attention" in key else "mlp.down_proj"
            owner = key.rsplit(".", 3)[0]
            sums = partials.get(f"{owner}.{inner}")
            if sums is not None:
                put(_out(0), lambda a: sums)
        for r, c in enumerate(copies):
            ranks[r].append(c)
    return ranks


def _param(e):
    return e.parameters.get("weight")


def _arg(i):
    return lambda e: e.input_args[i] if i < len(e.input_args) and isinstance(e.input_args[i], Leaf) else None


def _out(i):
    return lambda e: e.output[i] if i < len(e.output) and isinstance(e.output[i], Leaf) else None


def _set(entry, get, leaf: Leaf) -> None:
    for container in (entry.input_args, entry.output):
        for i, item in enumerate(container):
            if item is get(entry):
                container[i] = leaf
                return
    for k, item in entry.parameters.items():
        if item is get(entry):
            entry.parameters[k] = leaf
            return


def merge_rule(rec, leaf: str, group: list, rules: dict) -> str:
    """The rank-merge rule the running merge decides for ``group`` (one leaf's copy per rank)."""
    facts = RuleFacts(group[0])
    for g in group[1:]:
        facts.add(g)
    return facts.rule(rec, leaf, rules)
