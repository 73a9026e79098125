"""Test set-up: make the skills' script packages and the synthetic dump generator importable."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("dump-module-mapping-value-compare/scripts", "rl-consistency-analysis/scripts",
            "ml-debug/scripts", "tests"):
    p = str(ROOT / sub)
    if p not in sys.path:
        sys.path.insert(0, p)
