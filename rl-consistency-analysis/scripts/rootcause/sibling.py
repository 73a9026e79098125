"""Run the sibling compare skill as a subprocess (argument list, never a shell)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

PROGRESS_PREFIX = "[run_compare "
SIBLING = "dump-module-mapping-value-compare"
ENTRY = Path("scripts") / "run_compare.py"
# The sibling owns the charts of report.html; this skill loads that one file by path (it imports
# nothing of the sibling's package) and adds its verdict to the page.
HTML_MODULE = Path("dumpcompare") / "htmlreport.py"


class SiblingError(Exception):
    """The sibling skill is missing or could not produce its outputs (exit 2)."""


def locate(skill_root: Path) -> Path:
    """Path of the sibling's run_compare.py next to this skill's folder."""
    script = skill_root.parent / SIBLING / ENTRY
    if not script.is_file():
        raise SiblingError(f"{script}: sibling skill '{SIBLING}' not found next to {skill_root.name}/ "
                           f"(both folders must sit in the same skills directory)")
    return script


def run(script: Path, argv: list[str], progress: bool = False) -> None:
    """Run the compare skill; on failure raise SiblingError with its one-line message.

    With ``progress`` the compare step's progress lines (stderr, long runs only) are passed
    through as they come; its summary on stdout is not wanted here either way.
    """
    cmd = [sys.executable, str(script), *argv] + ([] if progress else ["--quiet"])
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                errors="backslashreplace", shell=False)
    except OSError as exc:
        raise SiblingError(f"{script}: cannot run ({exc.strerror})") from None
    others = []
    with proc:
        for line in proc.stderr:
            if line.startswith(PROGRESS_PREFIX):
                sys.stderr.write(line)
                sys.stderr.flush()
            elif line.strip():
                others.append(line.strip())
    if proc.returncode != 0:
        msg = others[-1] if others else f"exit code {proc.returncode}"
        raise SiblingError(f"compare step failed: {msg.removeprefix('error: ')}")


def load_html(script: Path):
    """The sibling's report.html module, loaded from its file next to ``script``."""
    path = script.parent / HTML_MODULE
    spec = importlib.util.spec_from_file_location("sibling_htmlreport", path)
    if spec is None or not path.is_file():
        raise SiblingError(f"{path}: the sibling skill has no report module (update both skills together)")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
