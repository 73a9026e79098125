"""Inside a vLLM worker: this rank's weights, read back under checkpoint names and compared with
the checkpoint's slice for this rank (a weight-sync check before any activation dump).

A fused module is split back into the checkpoint tensors it holds (``qkv_proj`` into q/k/v by head
counts, ``gate_up_proj`` into gate/up halves), and each part is compared with the rows or columns
of the checkpoint tensor this TP rank holds (column-parallel: rows; row-parallel: columns;
vocabulary-parallel: rows of the padded vocabulary; replicated KV heads: the head this rank uses).
A weight the engine keeps only in a kernel format (the CPU build prepacks dense linears into an
empty ``[0]`` parameter) is recovered by probing: the layer's own kernel applied to an identity
matrix returns the weight's transpose exactly (one product by 1, the rest by 0). A weight neither
visible nor probeable is reported ``not_visible``, never equal. Mixture-of-experts weights
(``FusedMoE``'s stacked ``w13``/``w2``) are not read yet.

Public API: compare_rank(worker, checkpoint_dir) -> list[dict]  (module-level: usable through
``llm.collective_rpc``), rows ``{rank, tensor, engine_module, rows, cols, status, max_abs_diff,
ref_norm, how}``.
"""
from __future__ import annotations

from pathlib import Path


def _reference(checkpoint_dir):
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    handles = [safe_open(str(f), "pt") for f in files]
    return {k: h for h in handles for k in h.keys()}


def _weight(module, torch):
    """(weight [out, in] of this rank, how) or (None, why)."""
    w = getattr(module, "weight", None)
    if w is not None and w.numel() > 0:
        return w.detach().float(), "parameter"
    method = getattr(module, "quant_method", None)
    n_in = getattr(module, "input_size_per_partition", None)
    if method is None or n_in is None:
        return None, "no visible weight and no kernel to probe"
    dtype = w.dtype if w is not None and w.is_floating_point() else torch.float32
    try:
        with torch.no_grad():
            out = method.apply(module, torch.eye(n_in, dtype=dtype), bias=None)
    except Exception as exc:  # a kernel that refuses the probe: the weight stays unseen, never "equal"
        return None, f"probe failed: {type(exc).__name__}: {exc}"
    if getattr(out, "ndim", None) != 2 or out.shape[0] != n_in:
        return None, f"probe returned shape {list(getattr(out, 'shape', []))}, not [{n_in}, out]"
    return out.detach().float().T.contiguous(), "probed"


def _parts(name, module):
    """[(checkpoint tensor, row slice of the engine weight, slicer of the checkpoint tensor)]."""
    prefix, _, leaf = name.rpartition(".")
    cls = type(module).__name__
    rank, size = getattr(module, "tp_rank", 0), getattr(module, "tp_size", 1)
    if cls == "QKVParallelLinear":
        hd = module.head_size
        nq, nkv = module.num_heads * hd, module.num_kv_heads * hd
        kv_rank = rank // getattr(module, "num_kv_head_replicas", 1)
        return [(f"{prefix}.q_proj.weight", (0, nq), ("rows", rank * nq, (rank + 1) * nq)),
                (f"{prefix}.k_proj.weight", (nq, nq + nkv), ("rows", kv_rank * nkv, (kv_rank + 1) * nkv)),
                (f"{prefix}.v_proj.weight", (nq + nkv, nq + 2 * nkv), ("rows", kv_rank * nkv, (kv_rank + 1) * nkv))]
    if cls == "MergedColumnParallelLinear" and leaf == "gate_up_proj":
        n = module.output_sizes[0] // size
        return [(f"{prefix}.gate_proj.weight", (0, n), ("rows", rank * n, (rank + 1) * n)),
                (f"{prefix}.up_proj.weight", (n, 2 * n), ("rows", rank * n, (rank + 1) * n))]
    if cls == "RowParallelLinear":
        n = module.input_size_per_partition
        return [(f"{name}.weight", None, ("cols", rank * n, (rank + 1) * n))]
    if cls in ("ColumnParallelLinear", "MergedColumnParallelLinear"):
        n = sum(module.output_partition_sizes)
        return [(f"{name}.weight", None, ("rows", rank * n, (rank + 1) * n))]
    if cls in ("VocabParallelEmbedding", "ParallelLMHead"):
        idx = module.shard_indices
        n = idx.org_vocab_end_index - idx.org_vocab_start_index
        return [(f"{name}.weight", (0, n), ("rows", idx.org_vocab_start_index, idx.org_vocab_end_index))]
    if cls == "ReplicatedLinear" or "Norm" in cls:
        return [(f"{name}.weight", None, None)]
    return []


def compare_rank(worker, checkpoint_dir):
    """One row per checkpoint tensor part this worker holds (see the module docstring)."""
    import torch

    model = worker.model_runner.model
    ref = _reference(checkpoint_dir)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    rows = []
    for name, module in model.named_modules():
        parts = _parts(name, module)
        if not parts:
            continue
        weight, how = _weight(module, torch)
        for tensor, engine_rows, sl in parts:
            row = {"rank": rank, "tensor": tensor, "engine_module": name, "how": how}
            if tensor not in ref:
                if tensor == "lm_head.weight" and "model.embed_tokens.weight" in ref:  # tied head
                    tensor = "model.embed_tokens.weight"
                else:
                    rows.append({**row, "status": "not_in_checkpoint"})
                    continue
            expected = ref[tensor].get_tensor(tensor).float()
            if sl is not None:
                expected = expected[sl[1]:sl[2]] if sl[0] == "rows" else expected[:, sl[1]:sl[2]]
            if weight is None:
                rows.append({**row, "status": "not_visible", "ref_norm": float(expected.norm())})
                continue
            got = weight if engine_rows is None else weight[engine_rows[0]:engine_rows[1]]
            if tuple(got.shape) != tuple(expected.shape):
                rows.append({**row, "status": "shape_differs", "engine_shape": list(got.shape),
                             "ref_shape": list(expected.shape)})
                continue
            diff = float((got - expected).abs().max())
            scale = float(expected.abs().max()) or 1.0
            rows.append({**row, "status": "equal" if diff <= 1e-6 * scale else "differs", "max_abs_diff": diff,
                         "ref_norm": float(expected.norm()),
                         "slice": None if sl is None else list(sl)})
    return rows
