"""The msprobe config file the dumpers hand to ``PrecisionDebugger``: the keys of
``make_dump_config.py`` (one source of them), written next to the dump so the user sees it.

Public API:
    write_config(path, dump_path, task, layers) -> Path
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .cli import InputError


def _make_dump_config():
    # make_dump_config.py is a sibling script, not a package module: import it by its folder.
    here = str(Path(__file__).resolve().parent.parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import make_dump_config
    return make_dump_config


def write_config(path, dump_path, task="statistics", layers=None):
    """Write the L0 forward-only config of ``task`` dumping into ``dump_path``; ``layers`` is a
    ``--layers`` spec such as ``2-4`` (None: every layer)."""
    mdc = _make_dump_config()
    try:
        layer_list = mdc.layer_list(layers) if layers else None
    except mdc.UsageError as exc:
        raise InputError(str(exc)) from None
    doc = mdc.build(task, str(Path(dump_path).resolve()), layers=layer_list)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return Path(path)
