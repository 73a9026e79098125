"""Write real msprobe dumps of a tiny Llama run over several micro-batches (repeated calls).

Not used by the tests (they read the dumps this wrote, committed under tests/data/msprobe/);
rerun it to regenerate them. Needs torch (CPU), mindstudio-probe and transformers, e.g. in a
separate venv: ``pip install torch==2.13.0 mindstudio-probe transformers``.

    python tools/make_msprobe_calls.py OUT            # OUT/{clean,perturbed,updated}/step0/proc*/

Every run does ``--calls`` forward passes of the same model on different tokens inside one
msprobe step, so each module appears as ``forward.0 .. forward.<calls-1>``:

* ``clean``: the model as initialised;
* ``perturbed``: 0.05 * N(0, 1) noise added to ``model.layers.1.mlp.down_proj.weight`` before
  the first call (a wrong weight in every call);
* ``updated``: the same noise added after call 1, so only calls 2.. see it (a weight that changes
  during the step).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

VARIANTS = ("clean", "perturbed", "updated")


def _run(out: Path, variant: str, calls: int) -> None:
    import torch
    from msprobe.pytorch import PrecisionDebugger, seed_all
    from transformers import LlamaConfig, LlamaForCausalLM

    dump = out / variant
    cfg = {"task": "statistics", "dump_path": str(dump), "rank": [], "step": [], "level": "L0",
           "async_dump": False, "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                                "summary_mode": "statistics"}}
    cfg_path = out / f"{variant}_config.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    seed_all(seed=1234, mode=True)
    debugger = PrecisionDebugger(config_path=str(cfg_path))
    mc = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                     attn_implementation="eager")
    model = LlamaForCausalLM(mc).eval()
    noise = 0.05 * torch.randn(model.model.layers[1].mlp.down_proj.weight.shape,
                               generator=torch.Generator().manual_seed(99))
    batches = [torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(10 + i))
               for i in range(calls)]
    debugger.start(model=model)
    with torch.no_grad():
        for i, ids in enumerate(batches):
            if (variant == "perturbed" and i == 0) or (variant == "updated" and i == 2):
                model.model.layers[1].mlp.down_proj.weight.add_(noise)
            model(input_ids=ids)
    debugger.stop()
    debugger.step()
    cfg_path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder to write clean/, perturbed/, updated/ into (replaced)")
    ap.add_argument("--calls", type=int, default=3, help="forward passes per run (default 3)")
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)   # one run, in a child
    args = ap.parse_args(argv)
    try:
        import msprobe  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is not installed (pip install torch==2.13.0 mindstudio-probe "
              f"transformers)", file=sys.stderr)
        return 2
    out = Path(args.out)
    if args.variant:
        _run(out, args.variant, args.calls)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for variant in VARIANTS:
        if (out / variant).exists():
            shutil.rmtree(out / variant)
        # msprobe's debugger is a process-wide singleton that keeps counting steps: one process per run.
        subprocess.run([sys.executable, __file__, str(out), "--calls", str(args.calls), "--variant", variant],
                       check=True)
    # msprobe names a non-distributed run step0/proc<pid>/: rename it for stable paths.
    for variant in VARIANTS:
        for proc in (out / variant / "step0").glob("proc*"):
            proc.rename(proc.with_name("proc0"))
    print(f"wrote {out}/{{clean,perturbed,updated}}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
