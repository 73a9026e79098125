"""Run both sides of a train/rollout pair and write their msprobe dumps."""
from pathlib import Path

import numpy as np

from .faults import Fault
from .layouts import LAYOUTS
from .layouts.common import Side
from .model import Config, init_weights, make_tokens
from .plan import SidePlan
from .record import Recorder
from .writer import write_dump


def run_side(cfg: Config, layout: str, faults=(), grad: bool = False, options=None,
             weights=None, sink=None) -> list:
    """Run one side's forward pass in ``layout`` and return its recorded ``Entry`` list.

    ``faults`` are applied as given (their ``side`` is not consulted here), ``grad`` marks a
    training forward (requires_grad on parameters and activations), ``options`` are the layout's
    options, ``weights`` default to ``init_weights(cfg)``. With ``sink``, each entry is passed to
    it as its module finishes and the list returned is empty (a large model's activations are not
    all held).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    plan = SidePlan.clean(cfg, weights if weights is not None else init_weights(cfg))
    for fault in faults:
        fault.check(cfg, layout)
        fault.apply(plan)
    kernels = plan.kernels()
    tokens = make_tokens(cfg)
    side = Side(cfg=cfg, plan=plan, k=kernels, rec=Recorder(kernels, grad, sink), ids=tokens,
                positions=np.arange(cfg.seq_len, dtype=np.int64), options=dict(options or {}))
    LAYOUTS[layout](side)
    return side.rec.entries


def generate_pair(out_root, cfg: Config = None, train_layout: str = "hf",
                  rollout_layout: str = "vllm", faults=(), task: str = "statistics",
                  tensor_format: str = "npy", rank_folder: str = "rank0", train_options=None,
                  rollout_options=None, train_grad: bool = True):
    """Write a train dump and a rollout dump of the same model, weights and tokens.

    Writes ``out_root/train/step0/<rank_folder>/`` and ``out_root/rollout/step0/<rank_folder>/``
    (dump.json, construct.json, and dump_tensor_data/ in tensor mode) and returns the two folders
    as ``(train_dump_dir, rollout_dump_dir)``. Each fault hits only its own side. The train side
    runs with autograd unless ``train_grad`` is False; the rollout side never does.
    """
    cfg = cfg or Config()
    faults = tuple(faults)
    for fault in faults:
        if not isinstance(fault, Fault):
            raise TypeError(f"not a fault: {fault!r}")
    weights = init_weights(cfg)
    out_root = Path(out_root)
    dirs = []
    for name, layout, options, grad in (("train", train_layout, train_options, train_grad),
                                        ("rollout", rollout_layout, rollout_options, False)):
        mine = [f for f in faults if f.side == name]
        entries = run_side(cfg, layout, mine, grad=grad, options=options, weights=weights)
        dirs.append(write_dump(out_root / name / "step0" / rank_folder, entries, task=task,
                               tensor_format=tensor_format))
    return tuple(dirs)
