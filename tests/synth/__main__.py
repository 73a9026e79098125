"""Command line: ``PYTHONPATH=tests python3 -m synth --out DIR [options]``.

Writes ``DIR/train/step0/<rank>/`` and ``DIR/rollout/step0/<rank>/`` and prints the two folders
and the injected faults.
"""
import argparse
import sys
from dataclasses import fields

import yaml

from .faults import FAULT_TYPES, parse_fault
from .generate import generate_pair
from .layouts import LAYOUTS
from .model import Config


def _option(text: str):
    """``key=value`` with a YAML scalar value (``checkpoint=true``, ``prefix=module.module.``)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, yaml.safe_load(value)


def _fault(text: str):
    try:
        return parse_fault(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _fault_help() -> str:
    lines = ["fault syntax: kind:side[:arg...], args in field order:"]
    for kind, cls in FAULT_TYPES.items():
        names = [f.name for f in fields(cls) if f.name != "side"]
        lines.append(f"  {kind}:<side>" + "".join(f"[:{n}]" for n in names))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m synth", description="Generate a synthetic msprobe train/rollout dump pair.",
        epilog=_fault_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output root folder")
    parser.add_argument("--train-layout", default="hf", choices=sorted(LAYOUTS))
    parser.add_argument("--rollout-layout", default="vllm", choices=sorted(LAYOUTS))
    parser.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    parser.add_argument("--tensor-format", default="npy", choices=["npy", "pt"])
    parser.add_argument("--fault", action="append", default=[], type=_fault,
                        help="fault to inject (repeatable), e.g. corrupt:rollout:gate:1")
    parser.add_argument("--train-option", action="append", default=[], type=_option,
                        help="layout option of the train side, key=value (repeatable)")
    parser.add_argument("--rollout-option", action="append", default=[], type=_option,
                        help="layout option of the rollout side, key=value (repeatable)")
    parser.add_argument("--rank-folder", default="rank0")
    parser.add_argument("--no-train-grad", action="store_true",
                        help="train side without autograd (requires_grad false everywhere)")
    defaults = Config()
    for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "seq_len",
                 "vocab", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    cfg = Config(layers=args.layers, hidden=args.hidden, intermediate=args.intermediate,
                 heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                 seq_len=args.seq_len, vocab=args.vocab, seed=args.seed)
    train_dir, rollout_dir = generate_pair(
        args.out, cfg, train_layout=args.train_layout, rollout_layout=args.rollout_layout,
        faults=args.fault, task=args.task, tensor_format=args.tensor_format,
        rank_folder=args.rank_folder, train_options=dict(args.train_option),
        rollout_options=dict(args.rollout_option), train_grad=not args.no_train_grad)
    print(f"train:   {train_dir}")
    print(f"rollout: {rollout_dir}")
    for fault in args.fault:
        print(f"fault:   {fault.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
