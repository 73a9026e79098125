#!/usr/bin/env python3
"""Map and compare a train dump and a rollout dump; writes output_1 .. output_4 (see --help)."""
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The runtime requirements (requirements.txt beside SKILL.md): a missing one is a one-line error
# with the install command, not a traceback from deep inside the package.
_MISSING = [mod for mod, _pkg in (("numpy", "numpy"), ("yaml", "pyyaml")) if importlib.util.find_spec(mod) is None]
if _MISSING and __name__ == "__main__":
    print(f"error: {', '.join(_MISSING)} not installed for {sys.executable}: run "
          f"{sys.executable} -m pip install -r {HERE.parent / 'requirements.txt'}", file=sys.stderr)
    sys.exit(2)

from dumpcompare.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
