#!/usr/bin/env python3
"""Map and compare a train dump and a rollout dump; writes output_1 .. output_4 (see --help)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dumpcompare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
