"""The README's example outputs are real: the `make demo` block is the Makefile's demo recipe and
what it prints, and every `$ python3 rl-consistency-analysis/...` block prints what the README
shows, line for line (paths under this checkout shown relative to it)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _demo_block() -> list[str]:
    block = re.search(r"```\n\$ make demo\n(.*?)```", README, re.S)
    assert block, "README has no '$ make demo' block"
    return block.group(1).splitlines()


def _printed(argv: list[str], out_arg: str, tmp_path: Path) -> list[str]:
    """Run the script with --out-dir moved under ``tmp_path``; its output as the README shows it."""
    out = tmp_path / out_arg
    argv = list(argv)
    argv[argv.index("--out-dir") + 1] = str(out)
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout.replace(str(out), out_arg).replace(f"{ROOT}/", "").splitlines()


def test_readme_demo_block_is_the_makefile_recipe_and_its_real_output(tmp_path):
    lines = _demo_block()
    recipe = [ln for ln in lines if ln.startswith((".venv/", "    --"))]
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", make, re.M).group(1)
    expected = [ln.strip().replace("$(PY)", ".venv/bin/python").replace("$(OUT)", "out/demo")
                for ln in demo.splitlines()]
    assert [ln.strip() for ln in recipe] == expected
    argv = " ".join(ln.strip().rstrip("\\") for ln in recipe).split()[1:]
    assert lines[len(recipe):] == _printed(argv, "out/demo", tmp_path)


EXAMPLES = re.findall(r"```\n\$ (python3 rl-consistency-analysis/scripts/run_root_cause_analysis.py .*?)```", README,
                      re.S)


def test_readme_has_a_root_cause_example_with_the_checkpoint():
    assert any("--model" in block for block in EXAMPLES)


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: b.split("--out-dir")[1].split()[0])
def test_readme_root_cause_example_prints_what_the_readme_shows(tmp_path, block):
    lines = block.splitlines()
    n = next(i for i, ln in enumerate(lines) if not ln.rstrip().endswith("\\")) + 1
    argv = shlex.split(" ".join(ln.strip().rstrip("\\") for ln in lines[:n]))[1:]
    printed = _printed(argv, argv[argv.index("--out-dir") + 1], tmp_path)
    shown = lines[n:]
    if "..." not in shown:
        assert shown == printed
        return
    # an excerpt: the lines shown appear in the output, in this order
    rest = iter(printed)
    missing = [ln for ln in shown if ln != "..." and ln not in rest]
    assert not missing, printed
