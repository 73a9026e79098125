"""Built-in YAML data files and users' overrides of them (always read with the safe loader)."""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

import yaml

from .errors import InputError


@lru_cache(maxsize=None)
def _parsed(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def builtin(path: Path) -> dict:
    """A bundled YAML file, parsed once per process; callers get their own copy."""
    return copy.deepcopy(_parsed(str(path)))


def read_user_yaml(path: str, what: str) -> dict:
    """Read a user's YAML mapping with the safe loader, or raise InputError naming the file."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read {what} ({' '.join(str(exc).split())})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: {what} must be a YAML mapping")
    return doc


def merge(base: dict, extra: dict) -> dict:
    """Deep merge of a user override: maps merge key by key, lists are prepended (user rules
    are consulted first), anything else replaces the built-in value."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = v + out[k]
        else:
            out[k] = v
    return out
