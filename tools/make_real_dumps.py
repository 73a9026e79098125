"""Write small real msprobe dumps of train/rollout pairs into tests/data/real/ (a developer tool).

Not used by the tests at run time: they read what this wrote. Needs torch (CPU), transformers,
mindstudio-probe and safetensors (e.g. /work/toolenv/bin/python). Every case is a folder

    tests/data/real/<case>/{train,rollout}/step<i>/{rank<r>,proc0}/   as msprobe wrote them
    tests/data/real/<case>/case.json                                    what was injected, what to expect

and every family's tiny checkpoint is saved once under tests/data/real/_models/<family>/.
The cases and their faults are listed in tools/real_dumps/cases.py, and in every
tools/real_dumps/cases_<name>.py (its own CASES and make_case, e.g. the megatron-core train
sides); the rollout models are tools/real_dumps/vllm_like.py. Regenerating gives the same numbers (seeded weights and prompts,
single-threaded CPU kernels).

    python tools/make_real_dumps.py --list
    python tools/make_real_dumps.py                 # every case
    python tools/make_real_dumps.py --only llama_tp2_fp32_clean --only llama_tp1_fp32_clean
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_dumps.cases import CASES, describe, measure  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "real"


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.4g}") if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v) for v in x]
    return x


_SAVED = set()


def _save_model(family, root):
    """The checkpoint the family's cases were built from, rewritten once per run (weights may have
    changed since the last one)."""
    from real_dumps import families

    if family in _SAVED:
        return
    dest = root / "_models" / family
    if dest.exists():
        shutil.rmtree(dest)
    families.hf_model(family).save_pretrained(dest, safe_serialization=True)
    _SAVED.add(family)


def make_case(case, root):
    from real_dumps import msprobe_run, sides

    dest = root / case.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        msprobe_run.run_ranks(sides.rollout_side, case.rollout_tp, case, str(dest / "rollout"), scratch)
        train_ranks = 0 if case.train_layout == "hf" else 2  # a plain script never initialises a group
        msprobe_run.run_ranks(sides.train_side, train_ranks, case, str(dest / "train"), scratch)
        msprobe_run.stable_proc_names(dest / "train")
        doc = _round(describe(case, measure(case, scratch)))
    (dest / "case.json").write_text(json.dumps(doc, indent=1) + "\n")
    _save_model(case.family, root)
    return doc


def all_cases():
    """name -> (case, make) for cases.py (made by ``make_case`` here) and for every
    real_dumps/cases_<name>.py, which lists its own ``CASES`` and brings its own
    ``make_case(case, root) -> case.json document``."""
    out = {name: (c, make_case) for name, c in CASES.items()}
    for path in sorted((Path(__file__).resolve().parent / "real_dumps").glob("cases_*.py")):
        module = importlib.import_module(f"real_dumps.{path.stem}")
        out.update({name: (c, module.make_case) for name, c in module.CASES.items()})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"corpus root (default {DEFAULT_OUT})")
    ap.add_argument("--only", action="append", metavar="CASE", help="make only this case (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    cases = all_cases()
    if args.list:
        for name, (c, _make) in cases.items():
            fault = c.fault["kind"] + "@" + c.fault["side"] if c.fault else "clean"
            where = (f"{c.family:9} {c.mode:10} {c.train_layout:5} {c.rollout_engine:6} "
                     f"tp={c.rollout_tp} steps={c.new_tokens}") if name in CASES else c.summary()
            print(f"{name:40} {where} {fault}")
        return 0
    unknown = [n for n in args.only or [] if n not in cases]
    if unknown:
        print(f"error: unknown case(s) {', '.join(unknown)} (see --list)", file=sys.stderr)
        return 2
    try:  # imported before forking so that every child starts warm
        import msprobe.pytorch  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"error: {exc.name} is not installed (pip install torch mindstudio-probe transformers "
              f"safetensors)", file=sys.stderr)
        return 2
    for name in args.only or list(cases):
        case, make = cases[name]
        doc = make(case, args.out)
        # msprobe's call stacks (stack.json) are ~40% of a statistics case and nothing reads them.
        for stack in (args.out / name).rglob("stack.json"):
            stack.unlink()
        m = doc["measured"]
        print(f"{name}: expected {doc['expected']['verdict']} {doc['expected']['category'] or ''} "
              f"noise {m['noise']} signal {m.get('rel_error', '-')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
