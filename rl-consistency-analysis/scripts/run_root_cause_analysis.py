#!/usr/bin/env python3
"""Find the first credible train/rollout divergence and its root cause; writes output_5 (see --help)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rootcause.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
