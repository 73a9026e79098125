"""Command-line plumbing shared by ``dump_vllm.py`` and ``dump_trainer.py``.

Public API:
    InputError              a bad option or input file (exit 2, one line)
    require(modules, what, pip)  import each module or raise InputError with one "needs ..." line
    DTYPES                  accepted ``--dtype`` spellings -> torch dtype name
    add_dump_options(ap)    the options both dumpers share: --dtype, --task, --layers
    out_subdir(out, name) -> Path   ``out/name``, refused if it already holds files (or ``out`` is a file)
    run(main_fn, argv) -> int       call ``main_fn(argv)``; InputError -> message on stderr, 2
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16"}


class InputError(Exception):
    """A bad option value or input file: reported in one line, exit code 2."""


def require(modules, what, pip):
    """Import every module name in ``modules``; a missing one is an InputError naming the install.

    Checked before any work so the user gets one line instead of a traceback from deep inside."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise InputError(f"needs {what} ({name} is not importable: {exc}): pip install {pip}") from None


def add_dump_options(ap):
    """--dtype, --task and --layers, spelled and defaulted the same on both sides."""
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="model dtype (default fp32)")
    ap.add_argument("--task", choices=("statistics", "tensor"), default="statistics", help="msprobe task")
    ap.add_argument("--layers", help="dump only these decoder layers, e.g. 2-4 (default: all)")


def out_subdir(out, name):
    """``out/name`` for a new dump; an existing non-empty one is refused so no earlier dump is lost."""
    if Path(out).exists() and not Path(out).is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    sub = Path(out) / name
    if sub.exists() and (not sub.is_dir() or any(sub.iterdir())):
        raise InputError(f"{sub}: already exists and is not empty; choose another --out or remove it")
    return sub


def model_dir(path):
    """A Hugging Face model folder (holding config.json), or an InputError."""
    p = Path(path)
    if not (p / "config.json").is_file():
        raise InputError(f"{p}: not a model folder (no config.json)")
    return p


def run(main_fn, argv):
    """Run ``main_fn(argv)``; an InputError becomes ``error: ...`` on stderr and exit code 2."""
    try:
        return main_fn(argv)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
