"""Tensor-parallel collectives over ``torch.distributed`` (gloo on CPU) for the rollout re-creations.

Public API:
    rank() -> int, world() -> int       this process's TP rank and the TP size (0 and 1 when
                                        torch.distributed is not initialised)
    all_reduce(x) -> Tensor             sum over ranks (a new tensor; x is left alone)
    gather_last_dim(x) -> Tensor | None concatenation over ranks along the last dim on rank 0,
                                        None on every other rank (vLLM's tensor_model_parallel_gather)
    all_gather_last_dim(x) -> Tensor    concatenation over ranks along the last dim on every rank
                                        (tensor_model_parallel_all_gather, as SGLang gathers logits)
    broadcast_int(v) -> int             rank 0's value on every rank (the sampled token)
    shard(t, dim) -> Tensor             this rank's contiguous slice of t along dim
"""
from __future__ import annotations

import torch
import torch.distributed as tdist


def rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def world() -> int:
    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if world() == 1:
        return x
    # gloo has no bf16 sum on every build: reduce in fp32 and round once, as a 2-rank bf16
    # NCCL ring sum does.
    buf = x.float().contiguous()
    tdist.all_reduce(buf)
    return buf.to(x.dtype)


def gather_last_dim(x: torch.Tensor) -> torch.Tensor | None:
    if world() == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world())] if rank() == 0 else None
    if x.dtype == torch.bfloat16:  # gloo gather of bf16 is not available everywhere
        fparts = [p.float() for p in parts] if parts is not None else None
        tdist.gather(x.float(), fparts, dst=0)
        parts = [p.to(x.dtype) for p in fparts] if fparts is not None else None
    else:
        tdist.gather(x, parts, dst=0)
    return torch.cat(parts, dim=-1) if parts is not None else None


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    if world() == 1:
        return x
    buf = x.float().contiguous()
    parts = [torch.empty_like(buf) for _ in range(world())]
    tdist.all_gather(parts, buf)
    return torch.cat(parts, dim=-1).to(x.dtype)


def broadcast_int(v: int) -> int:
    if world() == 1:
        return v
    t = torch.tensor([v if rank() == 0 else 0], dtype=torch.int64)
    tdist.broadcast(t, src=0)
    return int(t.item())


def shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    n = t.shape[dim] // world()
    return t.narrow(dim, rank() * n, n)
