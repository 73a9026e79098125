"""Fixtures for the ml-debug checker tests: paths to the skill, and a runner for its scripts."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

# The checkers are imported from ml-debug/scripts; keep the tree free of bytecode caches.
sys.dont_write_bytecode = True

SKILL = Path(__file__).resolve().parents[2] / "ml-debug"


@pytest.fixture(scope="session")
def skill():
    """Paths of the skill folder and its scripts, assets and examples."""
    return SimpleNamespace(root=SKILL, scripts=SKILL / "scripts", assets=SKILL / "assets",
                           examples=SKILL / "examples", references=SKILL / "references")


@pytest.fixture
def cli(tmp_path):
    """Run a checker as a user would; returns (exit code, stdout, stderr, parsed JSON or None)."""

    def run(script, *args):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.run([sys.executable, str(SKILL / "scripts" / f"{script}.py"), *map(str, args)],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
        data = json.loads(proc.stdout) if "--json" in args and proc.returncode != 2 else None
        return SimpleNamespace(code=proc.returncode, out=proc.stdout, err=proc.stderr, json=data)

    return run


@pytest.fixture
def write(tmp_path):
    """Write text to a file under tmp_path and return its path."""

    def _write(name, text):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write
