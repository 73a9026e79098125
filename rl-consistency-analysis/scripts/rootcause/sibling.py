"""Run the sibling compare skill as a subprocess (argument list, never a shell)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SIBLING = "dump-module-mapping-value-compare"
ENTRY = Path("scripts") / "run_compare.py"


class SiblingError(Exception):
    """The sibling skill is missing or could not produce its outputs (exit 2)."""


def locate(skill_root: Path) -> Path:
    """Path of the sibling's run_compare.py next to this skill's folder."""
    script = skill_root.parent / SIBLING / ENTRY
    if not script.is_file():
        raise SiblingError(f"{script}: sibling skill '{SIBLING}' not found next to {skill_root.name}/ "
                           f"(both folders must sit in the same skills directory)")
    return script


def run(script: Path, argv: list[str], timeout: float | None = None) -> None:
    """Run the compare skill; on failure raise SiblingError with its one-line message."""
    cmd = [sys.executable, str(script), *argv, "--quiet"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, shell=False)
    except subprocess.TimeoutExpired:
        raise SiblingError(f"{script}: timed out") from None
    except OSError as exc:
        raise SiblingError(f"{script}: cannot run ({exc.strerror})") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()]
        msg = lines[-1] if lines else f"exit code {proc.returncode}"
        raise SiblingError(f"compare step failed: {msg.removeprefix('error: ')}")
