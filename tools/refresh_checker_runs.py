"""Re-run every ```console block of ml-debug/references/checker_runs.md and write back its real output.

Each block is `$ python3 scripts/<checker>.py ...`, its output, and `[exit N]`; the command runs
in the skill's folder as the page says, and the block is rewritten with what it printed (stdout
then stderr) and its exit status. tests/ml_debug/test_mldebug_docs.py reruns the same commands
and fails when the page is stale, so run this after changing a checker's output:

    python3 tools/refresh_checker_runs.py
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

SKILL = Path(__file__).resolve().parents[1] / "ml-debug"
PAGE = SKILL / "references" / "checker_runs.md"
BLOCK = re.compile(r"```console\n(\$ [^\n]+)\n.*?\n\[exit \d\]\n```", re.DOTALL)


def rerun(match: re.Match) -> str:
    """The block for one command, with the output and exit status of a fresh run."""
    command = match.group(1)
    argv = shlex.split(command[2:])
    argv[0] = sys.executable
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(argv, cwd=SKILL, capture_output=True, text=True, env=env, timeout=120)
    output = (proc.stdout + proc.stderr).rstrip("\n")
    return f"```console\n{command}\n{output}\n[exit {proc.returncode}]\n```"


def main() -> int:
    """Rewrite the page in place and say how many blocks were run."""
    text = PAGE.read_text(encoding="utf-8")
    new, count = BLOCK.subn(rerun, text)
    PAGE.write_text(new, encoding="utf-8")
    print(f"{PAGE}: {count} block(s) re-run, {'changed' if new != text else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
