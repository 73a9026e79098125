"""Faults made the way RL jobs get them, on copies of a committed checkpoint.

Public API:
    stale(w, seed, rows=None) -> tensor     ``w`` moved by half its spread (a tensor from another
                                            step); ``rows=(lo, hi)`` moves only those rows, or
                                            ``cols=(lo, hi)`` those columns (one TP shard)
    faulty_checkpoint(src, dst, tensor, seed, rows=None, cols=None, config=None) -> dst
        a copy of the model folder ``src`` with one tensor stale and/or config values changed
    read_weights(model_dir) -> list[(name, tensor)]   every checkpoint tensor, for a weight sync
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path


def stale(w, seed, rows=None, cols=None):
    """``w`` plus seeded noise of half its spread (at least 0.05: norm weights spread little)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn(w.shape, generator=gen, dtype=torch.float32)
    scale = 0.5 * max(float(w.float().std()), 0.05) if w.numel() > 1 else 0.5
    mask = torch.zeros_like(noise)
    if rows is None and cols is None:
        mask.fill_(1.0)
    elif rows is not None:
        mask[rows[0]:rows[1]] = 1.0
    else:
        mask[..., cols[0]:cols[1]] = 1.0
    return (w.float() + scale * noise * mask).to(w.dtype)


def read_weights(model_dir):
    """All tensors of ``model_dir/model.safetensors`` as (name, tensor), in file order."""
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as fh:
        return [(k, fh.get_tensor(k)) for k in fh.keys()]


def faulty_checkpoint(src, dst, tensor=None, seed=0, rows=None, cols=None, config=None):
    """Copy the model folder ``src`` to ``dst`` with ``tensor`` stale and ``config`` keys set."""
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    if tensor:
        weights = dict(read_weights(src))
        if tensor not in weights:
            raise KeyError(f"{src}: no tensor {tensor}")
        weights[tensor] = stale(weights[tensor], seed, rows, cols)
        save_file({k: v.contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"),
                  metadata={"format": "pt"})
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
