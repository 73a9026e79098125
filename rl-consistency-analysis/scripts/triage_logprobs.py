#!/usr/bin/env python3
"""Is the train/rollout log-prob mismatch precision noise or a bug? Writes logprob_triage.json (see --help)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rootcause.logprob_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
