"""The README's demo block is what `make demo` prints: its command is the Makefile's demo recipe and
its output the script's output on the bundled example, line for line."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _demo_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ make demo\n(.*?)```", text, re.S)
    assert block, "README has no '$ make demo' block"
    return block.group(1).splitlines()


def test_readme_demo_block_is_the_makefile_recipe_and_its_real_output(tmp_path):
    lines = _demo_block()
    recipe = [ln for ln in lines if ln.startswith((".venv/", "    --"))]
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", make, re.M).group(1)
    expected = [ln.strip().replace("$(PY)", ".venv/bin/python").replace("$(OUT)", "out/demo")
                for ln in demo.splitlines()]
    assert [ln.strip() for ln in recipe] == expected
    argv = " ".join(ln.strip().rstrip("\\") for ln in recipe).split()[1:]
    out = tmp_path / "out" / "demo"
    argv[argv.index("--out-dir") + 1] = str(out)
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    printed = res.stdout.replace(str(out), "out/demo").splitlines()
    assert lines[len(recipe):] == printed
