"""Writing the skill's output files: atomically, inside the out-dir, JSON without NaN tokens."""
from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from . import sibling


def json_safe(obj):
    """``obj`` with non-finite floats as the strings "NaN", "Infinity", "-Infinity" (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    return obj


def write_text(path: Path, text: str | Iterable[str]) -> Path:
    """Write ``text`` (or its pieces, as they come) to ``path`` atomically, through the sibling
    skill's one writer (atomicfile.py)."""
    return sibling.load_atomicfile(sibling.SKILL_ROOT).write_text(path, text)
