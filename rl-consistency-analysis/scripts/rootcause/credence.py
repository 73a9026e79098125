"""A confidence number and its credence word, on the scale ml-debug defines.

The scale is ml-debug's (``ml-debug/scripts/credence_scale.json``); this skill ships its own copy
beside this module so that it runs without ml-debug installed next to it
(tests/rootcause/test_skill_standalone.py checks that the two copies are identical).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCALE_FILE = Path(__file__).with_name("credence_scale.json")


class CredenceError(Exception):
    """The ml-debug skill's credence scale is missing or unreadable (exit 2)."""


@lru_cache(maxsize=None)
def scale(path: Path = SCALE_FILE) -> tuple[tuple[int, str], ...]:
    """(lowest percent, word) pairs, highest range first."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows = sorted(((int(d["low"]), str(d["word"])) for d in doc["scale"]), reverse=True)
    except OSError as exc:
        raise CredenceError(f"{path}: cannot read the credence scale ({exc.strerror}); reinstall the "
                            f"rl-consistency-analysis skill folder") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CredenceError(f"{path}: not a credence scale ({type(exc).__name__}: {exc})") from None
    return tuple(rows)


CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
UNCALIBRATED = "uncalibrated"


@lru_cache(maxsize=None)
def calibrated_bins(path: Path = CALIBRATION_FILE) -> frozenset[str]:
    """The sets of fired rules that held enough findings on the corpora to earn a credence word
    (references/calibration.md, written by tools/calibrate_rules.py)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        least = int(doc["min_findings"])
        return frozenset(k for k, b in doc["bins"].items() if int(b["findings"]) >= least)
    except OSError as exc:
        raise CredenceError(f"{path}: cannot read the calibration table ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CredenceError(f"{path}: not a calibration table ({type(exc).__name__}: {exc})") from None


def bin_key(fired: list[str]) -> str:
    """The calibration bin of a finding: its category rule, then its adjustments sorted."""
    return "+".join(list(fired[:1]) + sorted(fired[1:]))


def calibrated_word(confidence: float, fired: list[str]) -> str:
    """The credence word when the finding's bin of fired rules is calibrated, else "uncalibrated"."""
    return word(confidence) if bin_key(fired) in calibrated_bins() else UNCALIBRATED


def clamp(x: float) -> float:
    """Keep a confidence inside [0.01, 0.99]: the dumps never prove or exclude a cause outright."""
    return round(min(0.99, max(0.01, x)), 2)


def word(confidence: float) -> str:
    """Credence word for a confidence between 0 and 1."""
    pct = round(confidence * 100)
    rows = scale()
    return next((w for low, w in rows if pct >= low), rows[-1][1])
