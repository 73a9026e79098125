"""A msprobe statistics pair of many distinct modules, for memory and time at scale (issue 28, item 4).

``python tools/manydump.py --out DIR --calls 40 [--layers 80]`` writes
``DIR/{train,rollout}/step0/rank0/{dump.json,construct.json}``: the forward of ``tools/bigdump.py``
(HF names on the train side, vLLM names on the rollout side, ``--fault`` injected by tests/synth)
called ``--calls`` times, the calls alternating between two sequence lengths as micro-batches of
different lengths do. Calls whose shapes differ cannot be folded (loaders/folding.py folds a dump
only when every call of every module has call 0's structure), so every call of every module is an
entry of its own: ``calls x ~1000`` modules per side at 80 layers, the shape of a large real job
whose calls do not fold. Both sides run the same sequence lengths in the same calls.

Prints a JSON summary (paths, bytes, entries per side) on its last stdout line; ``tools/bench.py
--stages many`` runs it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bigdump  # noqa: E402  (tools/bigdump.py: the forward as text templates)

SEQ_LENS = (8, 9)


def _write(path: Path, head: str, texts, tail: str) -> int:
    """Write ``head``, the texts joined by ``,\\n``, then ``tail``; returns the file's bytes."""
    with open(path, "w", buffering=1 << 22) as f:
        f.write(head)
        for i, text in enumerate(texts):
            if i:
                f.write(",\n")
            f.write(text)
        f.write(tail)
    return path.stat().st_size


def write_pair(out: Path, calls: int, layers: int = 80, faults=(), seed: int = 0) -> dict:
    """Write the pair under ``out``; returns a summary (folders, files, bytes, entries per side)."""
    # One template set per sequence length; the same seed gives both the same value variants.
    sets = [bigdump.build_templates(layers=layers, seq_len=n, faults=faults, seed=seed) for n in SEQ_LENS]
    out = Path(out)
    files, sizes, entries = {}, {}, {}
    for side in ("train", "rollout"):
        folder = out / side / "step0" / "rank0"
        folder.mkdir(parents=True, exist_ok=True)
        tpls = [s[side] for s in sets]

        def tpl(n):
            return tpls[n % len(tpls)]
        head = bigdump._HEADER.format(level=tpls[0].level)
        files[side] = folder / "dump.json"
        sizes[side] = _write(files[side], head,
                             (tpl(n).call_text(n, tpl(n).variant(n, calls, 0)) for n in range(calls)), "\n }\n}")
        _write(folder / "construct.json", "{\n", (str(n).join(tpl(n).construct_parts) for n in range(calls)), "\n}")
        entries[side] = sum(tpl(n).n_entries for n in range(calls))
    return {"train": str(out / "train"), "rollout": str(out / "rollout"),
            "files": {s: str(p) for s, p in files.items()}, "bytes": sizes, "entries": entries,
            "calls": calls, "layers": layers}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write a msprobe statistics pair of many modules whose calls "
                                             "do not fold (calls of alternating sequence lengths).")
    ap.add_argument("--out", required=True, help="folder for train/ and rollout/")
    ap.add_argument("--calls", type=int, default=40, help="forward calls per side (default 40: ~40k modules)")
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--fault", action="append", default=[], help="synth fault, e.g. corrupt:rollout:gate:40")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if min(args.calls, args.layers) < 1:
        ap.error("--calls and --layers must be positive")
    print(json.dumps(write_pair(Path(args.out), args.calls, args.layers, args.fault, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
