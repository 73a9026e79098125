"""Layout knowledge the executor needs when two tensors do not line up element for element:
size relations (padded vocabulary, tensor-parallel shards) and Megatron's per-group qkv order."""
from __future__ import annotations

import numpy as np

# Points whose size follows the vocabulary, which engines pad (vLLM to 64, Megatron to 128 x TP).
# Megatron packs a fused qkv per query group ([q_g; k_g; v_g] per group), not as [q; k; v].
GROUPED = "megatron_grouped_qkv"
VOCAB_POINTS = {"M.embed.weight", "M.lm_head.weight", "M.logits", "M.logits_last"}
_MAX_PAD = 1024
_MAX_SHARDS = 256


def _squeeze(shape) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def size_relation(point: str, tshape, rshape) -> tuple[str | None, int | None]:
    """How two shapes that differ are related: ('padded_vocab', axis), ('tp_shard', ratio) or (None, None).

    Size-1 dimensions are ignored ([T, 1, V] from Megatron against [T, V] from vLLM). Padding
    applies only to vocabulary-sized tensors and to their first or last dimension; any other
    single dimension that is an integer multiple of the other side's is read as a shard.
    """
    if tshape is None or rshape is None:
        return None, None
    a, b = _squeeze(tshape), _squeeze(rshape)
    if len(a) != len(b):
        return None, None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) != 1:
        return None, None
    i = diff[0]
    big, small = max(a[i], b[i]), min(a[i], b[i])
    if point in VOCAB_POINTS and i in (0, len(a) - 1) and big % 64 == 0 and big - small < _MAX_PAD:
        return "padded_vocab", i
    if small and big % small == 0 and 2 <= big // small <= _MAX_SHARDS:
        return "tp_shard", big // small
    return None, None


def trim_padding(t: np.ndarray, r: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop the padded vocabulary rows (on squeezed arrays) so both sides have the real vocabulary."""
    t, r = np.squeeze(t), np.squeeze(r)
    n = min(t.shape[axis], r.shape[axis])
    return np.take(t, range(n), axis=axis), np.take(r, range(n), axis=axis)


def interleave_parts(parts: list[np.ndarray], groups: int, axis: int) -> np.ndarray:
    """Concatenate ``parts`` group by group along ``axis``: [p0_g0, p1_g0, ..., p0_g1, p1_g1, ...].

    This is Megatron's per-query-group qkv order (groups = KV heads) and also what gathering the
    rank shards of a fused column-parallel output gives (groups = tensor-parallel ranks).
    """
    moved = [np.moveaxis(x, axis, 0) for x in parts]
    rest = moved[0].shape[1:]
    out = np.concatenate([x.reshape(groups, -1, *rest) for x in moved], axis=1).reshape(-1, *rest)
    return np.moveaxis(out, 0, axis)


def qkv_split(total: int, q_rows: int | None, kv_rows: int | None, head_dim: int | None,
              heads_per_group: int | None) -> tuple[int, int, int] | None:
    """(q rows, rows of k and of v, query groups) of a fused qkv of ``total`` rows, or None.

    Megatron packs each query group as its ``heads_per_group`` q heads, then one k and one v
    head, all ``head_dim`` wide, so the groups follow from the head size: from the q/k/v part
    sizes of the other side when it has them, else from the number of q heads per k head.
    """
    if not head_dim or total % head_dim:
        return None
    if q_rows is None or kv_rows is None:
        if not heads_per_group or (total // head_dim) % (heads_per_group + 2):
            return None
        groups = total // head_dim // (heads_per_group + 2)
        q_rows, kv_rows = groups * heads_per_group * head_dim, groups * head_dim
    if q_rows + 2 * kv_rows != total or kv_rows % head_dim or q_rows % kv_rows:
        return None
    return q_rows, kv_rows, kv_rows // head_dim


def gather_rank_qkv(fused: np.ndarray, ranks: int, axis: int, head_dim: int | None,
                    heads_per_group: int | None) -> np.ndarray | None:
    """[q; k; v] from a fused qkv merged from ``ranks`` tensor-parallel ranks, or None.

    vLLM and SGLang give each rank its own [q_r; k_r; v_r]; concatenated, the ranks' blocks follow
    one another. Each block is split by the head geometry and the parts gathered across ranks.
    """
    block = fused.shape[axis] // ranks if ranks else 0
    split = qkv_split(block, None, None, head_dim, heads_per_group) if block * ranks == fused.shape[axis] else None
    if split is None:
        return None
    q, kv, _ = split
    parts = [np.split(b, [q, q + kv], axis=axis) for b in np.split(fused, ranks, axis=axis)]
    return np.concatenate([p[i] for i in range(3) for p in parts], axis=axis)


def regroup_qkv(standard: np.ndarray, axis: int, split: tuple[int, int, int]) -> np.ndarray:
    """Lay a [q; k; v] tensor out in Megatron's per-group order (``split`` from :func:`qkv_split`)."""
    q, kv, groups = split
    return interleave_parts(np.split(standard, [q, q + kv], axis=axis), groups, axis)
