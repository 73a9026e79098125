"""Write a large synthetic msprobe statistics dump pair (train HF names, rollout vLLM names), fast.

The structure of every entry (keys, Items, nesting, null items, kwargs, parameters, shapes,
dtypes, requires_grad, the attention mask's ``Mean: -Infinity``) and the statistics of one
forward pass come from the numpy model of ``tests/synth`` run once at a small hidden size, so
both sides agree where the math says they should (fused qkv/gate_up, fused add+norm, ...)
and an injected synth fault (``--fault``) is a real divergence. That forward is then turned
into text templates and written many times as repeated calls (``...forward.0``,
``...forward.1``, ...) until each side reaches the target size:

* each call uses one of ``--variants`` precomputed value sets: every float statistic of the
  forward scaled by one positive factor per variant (the same factor on both sides, so the
  sides still agree and their differences stay relative), rounded to float32 like msprobe;
* one extra variant (unless ``--no-nonfinite``), used by call 1 of every file, puts overflowed
  logits on both sides (``Max: Infinity, Min: -Infinity, Mean: NaN, Norm: Infinity``), so each
  file holds bare ``NaN``, ``Infinity`` and ``-Infinity`` tokens as real dumps do (the HF train
  side also has the float32 causal mask with ``Mean: -Infinity`` in every call);
* files are written with ``indent=1`` like msprobe, call by call, each call one ``str.join``,
  and the files of all sides, steps and ranks are written by a process pool.

Layout: ``OUT/{train,rollout}/step{S}/rank{R}/{dump.json,construct.json}``. ``--size-mb`` is
the target size of one side (split over its step x rank files); both sides get the same number
of calls, chosen so that the average side size matches the target.

    python3 tools/bigdump.py --out /tmp/big                     # ~1 GB per side, 80 layers
    python3 tools/bigdump.py --out /tmp/big --size-mb 50 --steps 2 --ranks 2 \\
        --fault corrupt:rollout:gate:40

Needs numpy and pyyaml (for tests/synth); prints one JSON summary line on stdout.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SYNTH_PARENT = ROOT / "tests"

STAT_KEYS = ("Max", "Min", "Mean", "Norm")
_SLOT = "@@F{}@@"
_SLOT_RE = re.compile(r'"@@F(\d+)@@"')
_CALL = "\x00"  # stands for the call index inside a forward template
_HEADER = ('{{\n "task": "statistics",\n "level": "{level}",\n "framework": "pytorch",\n'
           ' "dump_data_dir": null,\n "data": {{\n')


def _import_synth():
    if str(SYNTH_PARENT) not in sys.path:
        sys.path.insert(0, str(SYNTH_PARENT))
    import synth  # noqa: E402  (tests/synth: the numpy Llama model)
    return synth


def _is_float_leaf(item) -> bool:
    return (isinstance(item, dict) and item.get("type") == "torch.Tensor"
            and isinstance(item.get("dtype"), str) and "float" in item["dtype"])


class _Slots:
    """Replaces every finite float statistic of an entry with a numbered slot marker."""

    def __init__(self):
        self.values: list[float] = []

    def mark(self, item):
        if isinstance(item, list):
            return [self.mark(v) for v in item]
        if isinstance(item, dict):
            if _is_float_leaf(item):
                out = dict(item)
                for k in STAT_KEYS:
                    v = item.get(k)
                    # Fill values such as a mask's float32 minimum stay as they are.
                    if isinstance(v, float) and math.isfinite(v) and abs(v) < 1e30:
                        out[k] = _SLOT.format(len(self.values))
                        self.values.append(v)
                return out
            return {k: self.mark(v) for k, v in item.items()}
        return item


def _first_float_leaf(item):
    if _is_float_leaf(item):
        return item
    values = item if isinstance(item, list) else (item.values() if isinstance(item, dict) else ())
    for v in values:
        found = _first_float_leaf(v)
        if found is not None:
            return found
    return None


def _overflow_logits(data: dict) -> None:
    """Overflowed logits (both sides alike): the output of the last entry that has a float one."""
    for key in reversed(list(data)):
        leaf = _first_float_leaf(data[key].get("output"))
        if leaf is not None:
            leaf.update(Max=math.inf, Min=-math.inf, Mean=math.nan, Norm=math.inf)
            return


def _entry_text(key_prefix: str, entry: dict) -> str:
    """``  "<key>": {...}`` at the nesting depth of ``data`` members, with ``indent=1``."""
    body = json.dumps(entry, indent=1).replace("\n", "\n  ")
    return f'  "{key_prefix}{_CALL}": {body}'


def _split_key(key: str) -> str:
    head, sep, tail = key.rpartition(".forward.")
    if not sep or tail != "0":
        raise ValueError(f"unexpected synth key {key!r}")
    return head + sep


def _marked(key: str, entry: dict):
    """The entry's text split around its float slots, and the slots' base values."""
    slots = _Slots()
    text = _entry_text(_split_key(key), slots.mark(entry))
    pieces = _SLOT_RE.split(text)  # text, slot index, text, slot index, ..., text
    return pieces[0::2], np.asarray(slots.values, dtype=np.float64)


def _fill(parts: list[str], base, scale: float) -> str:
    vals = (base * scale).astype(np.float32).astype(np.float64)
    vals = np.where(np.isfinite(vals), vals, base).tolist()
    out = [parts[0]]
    for v, p in zip(vals, parts[1:]):
        out.append(repr(v))
        out.append(p)
    return "".join(out)


class SideTemplate:
    """One side's forward as text: per variant, the parts to join with the call index."""

    def __init__(self, dump: dict, construct: dict, scales: list[float], overflow_variant):
        data = dump["data"]
        self.level = dump.get("level", "L0")
        self.n_entries = len(data)
        marked = [_marked(k, e) for k, e in data.items()]
        over_data = json.loads(json.dumps(data))
        _overflow_logits(over_data)
        over = {i: _marked(k, e) for i, (k, e) in enumerate(over_data.items())
                if e != data[k]}
        self.forward_parts: list[list[str]] = []
        self.forward_bytes: list[int] = []
        for v, scale in enumerate(scales):
            texts = [_fill(*(over.get(i, m) if v == overflow_variant else m), scale)
                     for i, m in enumerate(marked)]
            forward = ",\n".join(texts)
            self.forward_parts.append(forward.split(_CALL))
            self.forward_bytes.append(len(forward.encode()))
        lines = []
        for key, parent in construct.items():
            p = "null" if parent is None else f'"{_split_key(parent)}{_CALL}"'
            lines.append(f' "{_split_key(key)}{_CALL}": {p}')
        self.construct_parts = ",\n".join(lines).split(_CALL)
        self.overflow = overflow_variant
        self.plain = [v for v in range(len(scales)) if v != overflow_variant]

    def variant(self, call: int, calls: int, offset: int) -> int:
        """Call 1 (call 0 of a one-call file) has the overflowed logits; the others cycle."""
        if self.overflow is not None and call == min(1, calls - 1):
            return self.overflow
        return self.plain[(call + offset) % len(self.plain)]

    def call_text(self, call: int, variant: int) -> str:
        return str(call).join(self.forward_parts[variant])


_TEMPLATES: dict[str, SideTemplate] = {}


def _write_file(job) -> tuple[str, int]:
    side, folder, calls, offset, construct = job
    tpl = _TEMPLATES[side]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dump.json"
    tmp = folder / "dump.json.tmp"
    with open(tmp, "w", buffering=1 << 22) as f:
        f.write(_HEADER.format(level=tpl.level))
        for n in range(calls):
            if n:
                f.write(",\n")
            f.write(tpl.call_text(n, tpl.variant(n, calls, offset)))
        f.write("\n }\n}")
    os.replace(tmp, path)
    if construct:
        ctmp = folder / "construct.json.tmp"
        with open(ctmp, "w", buffering=1 << 22) as f:
            f.write("{\n")
            for n in range(calls):
                if n:
                    f.write(",\n")
                f.write(str(n).join(tpl.construct_parts))
            f.write("\n}")
        os.replace(ctmp, folder / "construct.json")
    return str(path), path.stat().st_size


def build_templates(layers=80, hidden=64, intermediate=None, heads=None, kv_heads=None,
                    head_dim=None, seq_len=8, vocab=128, seed=0, faults=(),
                    train_layout="hf", rollout_layout="vllm", variants=16,
                    nonfinite=True) -> dict[str, SideTemplate]:
    """Run the synth model once and return ``{"train": SideTemplate, "rollout": SideTemplate}``."""
    synth = _import_synth()
    heads = heads or max(1, hidden // 16)
    kv_heads = kv_heads or max(1, heads // 2)
    cfg = synth.Config(layers=layers, hidden=hidden, intermediate=intermediate or 2 * hidden,
                       heads=heads, kv_heads=kv_heads, head_dim=head_dim or hidden // heads,
                       seq_len=seq_len, vocab=vocab, seed=seed)
    parsed = [synth.parse_fault(f) if isinstance(f, str) else f for f in faults]
    rng = np.random.default_rng(seed + 12345)
    scales = [1.0] + [float(x) for x in np.exp(rng.uniform(-0.7, 0.7, size=max(0, variants - 1)))]
    overflow = None
    if nonfinite:
        overflow = len(scales)
        scales.append(float(np.exp(rng.uniform(-0.7, 0.7))))
    with tempfile.TemporaryDirectory(prefix="bigdump-") as tmp:
        dirs = synth.generate_pair(tmp, cfg, train_layout=train_layout,
                                   rollout_layout=rollout_layout, faults=parsed)
        out = {}
        for side, d in zip(("train", "rollout"), dirs):
            dump = json.loads((Path(d) / "dump.json").read_text())
            construct = json.loads((Path(d) / "construct.json").read_text())
            out[side] = SideTemplate(dump, construct, scales, overflow)
    return out


def write_pair(out, size_mb=1024.0, calls=None, steps=1, ranks=1, jobs=None, construct=True,
               **model) -> dict:
    """Write the pair under ``out``; returns a summary (files, sizes, calls, seconds)."""
    t0 = time.perf_counter()
    templates = build_templates(**model)
    t_tpl = time.perf_counter() - t0
    files_per_side = steps * ranks
    if calls is None:
        per_call = sum(t.forward_bytes[0] for t in templates.values()) / len(templates)
        calls = max(1, round(size_mb * 1e6 / files_per_side / per_call))
    out = Path(out)
    work = []
    for side in ("train", "rollout"):
        for s in range(steps):
            for r in range(ranks):
                work.append((side, str(out / side / f"step{s}" / f"rank{r}"), calls,
                             7 * s + 3 * r, construct))
    _TEMPLATES.clear()
    _TEMPLATES.update(templates)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    if jobs == 1:
        written = [_write_file(w) for w in work]
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(jobs) as pool:
            written = pool.map(_write_file, work, chunksize=1)
    sizes = {}
    for side in ("train", "rollout"):
        sizes[side] = sum(sz for p, sz in written if f"{os.sep}{side}{os.sep}" in p)
    return {
        "out": str(out),
        "train": str(out / "train"),
        "rollout": str(out / "rollout"),
        "files": [{"path": p, "bytes": sz} for p, sz in written],
        "calls": calls,
        "entries_per_call": {s: t.n_entries for s, t in templates.items()},
        "side_bytes": sizes,
        "largest_file_bytes": max(sz for _, sz in written),
        "template_seconds": round(t_tpl, 3),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Write a large synthetic msprobe statistics dump pair (L0, train HF names "
                    "vs rollout vLLM names) quickly, for benchmarks.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Fault syntax is tests/synth's (python3 -m synth --help), e.g. "
               "corrupt:rollout:gate:40.")
    ap.add_argument("--out", required=True, help="output root (train/ and rollout/ go below)")
    ap.add_argument("--size-mb", type=float, default=1024.0,
                    help="target size of one side in MB (1e6 bytes), over all its files "
                         "(default 1024)")
    ap.add_argument("--calls", type=int, default=None,
                    help="forward calls per file (overrides --size-mb)")
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--hidden", type=int, default=64,
                    help="hidden size of the synth model run once for the values (default 64)")
    ap.add_argument("--intermediate", type=int, default=None, help="default 2 x hidden")
    ap.add_argument("--seq-len", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1, help="step folders per side (default 1)")
    ap.add_argument("--ranks", type=int, default=1, help="rank folders per step (default 1)")
    ap.add_argument("--fault", action="append", default=[],
                    help="synth fault to inject (repeatable), e.g. corrupt:rollout:gate:40")
    ap.add_argument("--train-layout", default="hf")
    ap.add_argument("--rollout-layout", default="vllm")
    ap.add_argument("--variants", type=int, default=16,
                    help="distinct value sets cycled over the calls (default 16)")
    ap.add_argument("--no-nonfinite", action="store_true",
                    help="no overflowed-logits variant (the HF mask still has -Infinity)")
    ap.add_argument("--no-construct", action="store_true", help="do not write construct.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=None, help="writer processes (default: cores)")
    args = ap.parse_args(argv)
    for name in ("steps", "ranks", "layers", "variants"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    summary = write_pair(
        args.out, size_mb=args.size_mb, calls=args.calls, steps=args.steps, ranks=args.ranks,
        jobs=args.jobs, construct=not args.no_construct, layers=args.layers, hidden=args.hidden,
        intermediate=args.intermediate, seq_len=args.seq_len, vocab=args.vocab, seed=args.seed,
        faults=args.fault, train_layout=args.train_layout, rollout_layout=args.rollout_layout,
        variants=args.variants, nonfinite=not args.no_nonfinite)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
