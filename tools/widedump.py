"""A msprobe statistics pair with one wide module, for planning at scale (issue 28, item 3).

``python tools/widedump.py --out DIR --leaves 300000 [--fault-leaf K]`` writes
``DIR/{train,rollout}/step0/rank0/dump.json``: the token embedding, then one module of a class no
naming profile knows (``model.layers.0.mixer``, ``WideMixer``) that returns ``--leaves`` tensors,
so each of its outputs is a point of its own, as a custom module returning a long tuple is. Both
sides hold the same statistics except, with ``--fault-leaf K``, output K on the rollout side
(every statistic doubled): the one divergence, injected here and so known in advance.

``PLAN_TIMING`` is the bench's ``wide`` stage (tools/bench.py): it loads and names such a pair,
then times ``build_plan`` alone, CPU and wall per leaf, best of several runs in one process.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "dump-module-mapping-value-compare" / "scripts"
MODULE = "model.layers.0.mixer"
KEY = f"Module.{MODULE}.WideMixer.forward.0"
EMBED = "Module.model.embed_tokens.Embedding.forward.0"
TOKENS = 4


def _leaf(i: int, scale: float) -> str:
    # Distinct values per leaf, so that no two outputs look alike to value alignment.
    mx, mean = (1.0 + i * 1e-3) * scale, (0.25 + i * 1e-4) * scale
    return (f'{{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [{TOKENS}, 8], '
            f'"Max": {mx!r}, "Min": {-mx!r}, "Mean": {mean!r}, "Norm": {4 * mx!r}, "requires_grad": false}}')


def _dump(leaves: int, fault_leaf: int | None) -> str:
    ids = (f'{{"type": "torch.Tensor", "dtype": "torch.int64", "shape": [1, {TOKENS}], "Max": 11, "Min": 3, '
           f'"Mean": null, "Norm": null, "requires_grad": false}}')
    outputs = ", ".join(_leaf(i, 2.0 if i == fault_leaf else 1.0) for i in range(leaves))
    return ('{"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": null, "data": {'
            f'"{EMBED}": {{"input_args": [{ids}], "input_kwargs": {{}}, "output": [{_leaf(0, 1.0)}]}}, '
            f'"{KEY}": {{"input_args": [{_leaf(0, 1.0)}], "input_kwargs": {{}}, "output": [{outputs}]}}}}}}')


def write_pair(out: Path, leaves: int, fault_leaf: int | None = None) -> dict:
    """Write the pair under ``out``; returns {side: dump.json path}."""
    paths = {}
    for side in ("train", "rollout"):
        folder = Path(out) / side / "step0" / "rank0"
        folder.mkdir(parents=True, exist_ok=True)
        paths[side] = folder / "dump.json"
        paths[side].write_text(_dump(leaves, fault_leaf if side == "rollout" else None), encoding="utf-8")
    return paths


PLAN_TIMING = """
import functools, json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from dumpcompare import value_align
from dumpcompare.tolerances import load_tolerances
from dumpcompare.loaders import load_path
from dumpcompare.mapping import build_plan
from dumpcompare.naming import Namer, load_profiles, name_side
root, leaves, repeat = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
namer = Namer(load_profiles(None))
dumps = {s: load_path(root / s / "step0" / "rank0" / "dump.json") for s in ("train", "rollout")}
recs = {s: name_side(dumps[s], s, namer)[1] for s in dumps}
values = value_align.Values({s: d.entries for s, d in dumps.items()}, load_tolerances(None)["statistics"])
cpu, wall = [], []
# At least `repeat` runs and 5 s of them: the best of many short runs is as steady as that of a
# few long ones on a machine whose other work comes and goes.
while len(cpu) < repeat or sum(wall) < 5.0 and len(cpu) < 100:
    c0, t0 = time.process_time(), time.perf_counter()
    plan = build_plan(recs["train"], recs["rollout"], namer, functools.partial(value_align.align, values=values))
    cpu.append(time.process_time() - c0)
    wall.append(time.perf_counter() - t0)
    del plan
print(json.dumps({"leaves": leaves, "cpu_us_per_leaf": min(cpu) / leaves * 1e6,
                  "wall_us_per_leaf": min(wall) / leaves * 1e6}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write a msprobe statistics pair with one module of many outputs.")
    ap.add_argument("--out", required=True, help="folder for train/ and rollout/")
    ap.add_argument("--leaves", type=int, default=300_000, help="outputs of the wide module (default 300000)")
    ap.add_argument("--fault-leaf", type=int, default=None, help="rollout output whose statistics are doubled")
    args = ap.parse_args(argv)
    if args.leaves < 1 or args.fault_leaf is not None and not 0 <= args.fault_leaf < args.leaves:
        ap.error("--leaves must be positive and --fault-leaf one of its outputs")
    paths = write_pair(Path(args.out), args.leaves, args.fault_leaf)
    print(json.dumps({s: str(p) for s, p in paths.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
