"""Write the logs of ml-debug's second example set that cannot be produced by a run here.

verl needs Ray and GPUs, and a W&B export needs the W&B service, so these are written from the
frameworks' own format strings instead (read from their source with the search tool):

- verl's console logger prints `step:{step} - {key}:{value} - ...`, the values through
  `pprint.pformat` in recent versions and `{v:.3f}` in older ones; under Ray every line of the
  driver carries the launcher's `(TaskRunner pid=N)` prefix, coloured with ANSI codes;
- a W&B chart export is a CSV with a `Step` column and one `<run name> - <metric>` column per
  metric, each with `__MIN` and `__MAX` companions.

The curves are a healthy PPO / GRPO run drawn from a seeded generator (numpy only), so the files
are the same on every machine:

    python3 tools/make_mldebug_console_logs.py --out ml-debug/examples/stacks/good
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ANSI_CYAN, ANSI_RESET = "\x1b[36m", "\x1b[0m"


def ppo_curves(n: int, seed: int) -> dict[str, np.ndarray]:
    """A PPO run that learns: score rises, entropy falls, KL grows slowly, losses hover."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, n + 1)
    rise = 1 - np.exp(-t / 40)
    return {
        "actor/pg_loss": -0.01 * rise + 0.004 * rng.standard_normal(n),
        "actor/entropy": 1.2 - 0.5 * rise + 0.01 * rng.standard_normal(n),
        "actor/ppo_kl": 0.0008 + 0.0004 * rise + 0.0001 * np.abs(rng.standard_normal(n)),
        "actor/pg_clipfrac": 0.002 + 0.001 * np.abs(rng.standard_normal(n)),
        "actor/grad_norm": 0.30 + 0.05 * rng.standard_normal(n),
        "actor/lr": np.full(n, 1e-6),
        "critic/score/mean": 0.15 + 0.55 * rise + 0.02 * rng.standard_normal(n),
        "critic/vf_loss": 0.05 + 0.1 * np.exp(-t / 15) + 0.003 * rng.standard_normal(n),
        "response_length/mean": 420 - 80 * rise + 8 * rng.standard_normal(n),
        "timing_s/step": 38 + 1.5 * rng.standard_normal(n),
    }


def verl_console(n: int, seed: int, decimals: int | None, pid: int) -> str:
    """verl's console lines behind Ray's coloured `(TaskRunner pid=N)` prefix, with Ray's own chatter."""
    curves = ppo_curves(n, seed)
    prefix = f"{ANSI_CYAN}(TaskRunner pid={pid}){ANSI_RESET} "
    lines = [f"2026-11-28 02:14:07,311\tINFO worker.py:1821 -- Started a local Ray instance.",
             f"{prefix}Using dataset class: RLHFDataset",
             f"{prefix}Size of train dataloader: {n}, Size of val dataloader: 1",
             f"{prefix}Total training steps: {n}"]
    for i in range(n):
        step = i + 1
        parts = [f"step:{step}"]
        for key, values in curves.items():
            v = float(values[i])
            parts.append(f"{key}:{v:.{decimals}f}" if decimals is not None else f"{key}:{v!r}")
        lines.append(prefix + " - ".join(parts))
        if step % 25 == 0:
            lines.append(f"{prefix}local_global_step_folder: checkpoints/ppo/global_step_{step}")
    lines.append(f"{prefix}Final validation metrics: {{'val-core/gsm8k/reward/mean@1': 0.702}}")
    return "\n".join(lines) + "\n"


def wandb_export(n: int, seed: int, run: str, metrics: list[str]) -> str:
    """A W&B chart export: Step, then `<run> - <metric>` with its __MIN and __MAX columns."""
    curves = ppo_curves(n, seed)
    header = ["Step"] + [f"{run} - {m}{suffix}" for m in metrics for suffix in ("", "__MIN", "__MAX")]
    rows = [",".join(f'"{h}"' for h in header)]
    for i in range(n):
        cells = [str((i + 1) * 2)]
        for m in metrics:
            v = float(curves[m][i])
            cells += [f"{v:.6g}", f"{v:.6g}", f"{v:.6g}"]
        rows.append(",".join(cells))
    return "\n".join(rows) + "\n"


def main() -> int:
    """Write the four files into --out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder (examples/stacks/good)")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "verl_ppo_console.log").write_text(verl_console(120, 7, 3, 48213), encoding="utf-8")
    (out / "verl_grpo_console.log").write_text(verl_console(90, 11, None, 90417), encoding="utf-8")
    (out / "wandb_export_ppo.csv").write_text(
        wandb_export(100, 5, "ppo-qwen-0.5b-s1", ["actor/entropy", "critic/score/mean", "actor/ppo_kl"]),
        encoding="utf-8")
    (out / "wandb_export_grpo.csv").write_text(
        wandb_export(80, 9, "grpo gsm8k run 3", ["critic/score/mean", "response_length/mean", "actor/pg_loss"]),
        encoding="utf-8")
    print(f"wrote 4 files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
