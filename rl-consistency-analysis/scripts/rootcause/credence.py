"""The credence scale shared with ml-debug: a confidence number and the word that goes with it."""
from __future__ import annotations

SCALE = [  # (lowest percent, word)
    (86, "almost certain"), (71, "highly likely"), (56, "likely"), (46, "even"),
    (31, "unlikely"), (16, "highly unlikely"), (1, "remote"),
]


def clamp(x: float) -> float:
    """Keep a confidence inside [0.01, 0.99]: the dumps never prove or exclude a cause outright."""
    return round(min(0.99, max(0.01, x)), 2)


def word(confidence: float) -> str:
    """Credence word for a confidence between 0 and 1."""
    pct = round(confidence * 100)
    for low, w in SCALE:
        if pct >= low:
            return w
    return "remote"
