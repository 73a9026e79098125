"""Write recorded entries as an msprobe (26.x) PyTorch dump folder.

Layout of the folder, as msprobe writes it::

    dump.json            {"task", "level", "framework": "pytorch", "dump_data_dir", "data"}
    construct.json       {entry key: parent entry key | null}, in module start order
    dump_tensor_data/    tensor task only: one file per Leaf, named by its data_name

Leaf statistics follow msprobe's ``get_stat_info`` (default low precision): Max/Min/Mean/Norm are
reduced in the tensor's own float dtype (so a float32 mask of -3.4e38 gives ``Mean: -Infinity``
like the real file), bf16 Mean/Norm are rounded to bf16, and integer tensors get integer
Max/Min with null Mean/Norm.
"""
import json
import os
from pathlib import Path

import numpy as np

from .model import F32, to_bf16
from .record import Leaf

DATA_DIR = "dump_tensor_data"
# msprobe keeps the dump path of the machine that wrote the dump; readers must not trust it.
STALE_ROOT = "/home/ma-user/work/msprobe_dump"


def leaf_stats(leaf: Leaf) -> dict:
    """``{"Max", "Min", "Mean", "Norm"}`` of a tensor as msprobe computes them."""
    data = leaf.data
    if data.size == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if not leaf.is_float:
        if leaf.dtype == "torch.bool":
            return {"Max": bool(data.any()), "Min": bool(data.all()), "Mean": None, "Norm": None}
        return {"Max": int(data.max()), "Min": int(data.min()), "Mean": None, "Norm": None}
    x = np.asarray(data, dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.mean(x, dtype=F32)
        norm = np.sqrt(np.sum(np.square(x), dtype=F32))
    if leaf.dtype == "torch.bfloat16":
        mean, norm = to_bf16(np.array([mean, norm], F32))
    return {"Max": float(x.max()), "Min": float(x.min()), "Mean": float(mean), "Norm": float(norm)}


def leaf_json(leaf: Leaf, data_name) -> dict:
    """A tensor's dump.json record: dtype, shape, statistics, and its file's name in tensor mode."""
    out = {"type": "torch.Tensor", "dtype": leaf.dtype, "shape": list(leaf.data.shape)}
    out.update(leaf_stats(leaf))
    out["requires_grad"] = leaf.requires_grad
    if data_name is not None:
        out["data_name"] = data_name
    return out


class _TensorSink:
    """Names each Leaf like msprobe's ``get_save_file_path`` and, in tensor mode, saves it."""

    def __init__(self, folder, tensor_format):
        self.folder = folder
        self.ext = tensor_format
        self._save_pt = _load_save_pt() if folder is not None and tensor_format == "pt" else None

    def convert(self, item, prefix: str):
        if isinstance(item, Leaf):
            return leaf_json(item, self._save(item, prefix))
        if isinstance(item, list):
            return [self.convert(v, f"{prefix}.{i}") for i, v in enumerate(item)]
        if isinstance(item, dict):
            return {k: self.convert(v, f"{prefix}.{k}") for k, v in item.items()}
        return item

    def _save(self, leaf: Leaf, prefix: str):
        if self.folder is None:
            return None
        name = f"{prefix}.{self.ext}"
        path = self.folder / name
        if self._save_pt is not None:
            self._save_pt(path, leaf.data, leaf.dtype.replace("torch.", ""))
        else:
            # numpy has no bfloat16: bf16 tensors are stored as their exact float32 values.
            np.save(path, leaf.data)
        return name


def _load_save_pt():
    from .ptfile import save_pt
    return save_pt


def entry_json(entry, sink: _TensorSink) -> dict:
    """The dump.json value of one Entry (msprobe key order)."""
    key = entry.key
    return {
        "input_args": [sink.convert(v, f"{key}.input.{i}") for i, v in enumerate(entry.input_args)],
        "input_kwargs": {k: sink.convert(v, f"{key}.kwargs.{k}") for k, v in entry.input_kwargs.items()},
        "output": [sink.convert(v, f"{key}.output.{i}") for i, v in enumerate(entry.output)],
        "parameters": {k: sink.convert(v, f"{key}.parameters.{k}") for k, v in entry.parameters.items()},
    }


def write_dump(dump_dir, entries, task: str = "statistics", tensor_format: str = "npy",
               level: str = "L0") -> Path:
    """Write ``entries`` (post-order ``Entry`` list) as an msprobe dump folder; returns the folder.

    ``task`` is ``"statistics"`` or ``"tensor"``; in tensor mode every Leaf also gets a
    ``data_name`` and a file in ``dump_tensor_data/`` (``.npy``, or ``.pt`` through
    ``synth.ptfile.save_pt``), and ``dump_data_dir`` names a stale absolute path of a
    fictional machine, as real dumps copied between machines do.
    """
    if task not in ("statistics", "tensor"):
        raise ValueError(f"unsupported task {task!r}")
    if tensor_format not in ("npy", "pt"):
        raise ValueError(f"unsupported tensor_format {tensor_format!r}")
    dump_dir = Path(dump_dir)
    dump_dir.mkdir(parents=True, exist_ok=True)
    folder, data_dir = None, None
    if task == "tensor":
        folder = dump_dir / DATA_DIR
        folder.mkdir(exist_ok=True)
        data_dir = "/".join([STALE_ROOT, *dump_dir.resolve().parts[-3:], DATA_DIR])
    sink = _TensorSink(folder, tensor_format)
    dump = {"task": task, "level": level, "framework": "pytorch", "dump_data_dir": data_dir,
            "data": {e.key: entry_json(e, sink) for e in entries}}
    construct = {e.key: e.parent for e in sorted(entries, key=lambda e: e.start)}
    _write_json(dump_dir / "dump.json", dump)
    _write_json(dump_dir / "construct.json", construct)
    return dump_dir


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
