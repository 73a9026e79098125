"""Issue 14: no code under the skills' ``scripts/`` that only tests use (test-only code lives in
tests/ or tools/). Every top-level function and class of a skill must be referenced by code of
that skill (a call, an attribute, a decorator...), not only by tests, docstrings or ``__all__``."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKILLS = ("dump-module-mapping-value-compare", "rl-consistency-analysis", "ml-debug")
# Entry points the interpreter calls by name.
ENTRY_POINTS = {"main"}
# The root-cause skill loads a few of the compare skill's modules by file path (rootcause/sibling.py):
# what it calls there is used by the bundle even where the compare skill itself does not call it.
LOADED_BY = {"dump-module-mapping-value-compare": "rl-consistency-analysis"}


def _definitions_and_uses(skill: str):
    defined, used = [], set()
    for path in sorted((ROOT / skill / "scripts").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined += [(path.relative_to(ROOT), node.name) for node in tree.body
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    return defined, used


@pytest.mark.parametrize("skill", SKILLS)
def test_every_runtime_function_is_used_by_the_skill_itself(skill):
    defined, used = _definitions_and_uses(skill)
    if skill in LOADED_BY:
        used |= _definitions_and_uses(LOADED_BY[skill])[1]
    unused = [f"{path}: {name}" for path, name in defined if name not in used and name not in ENTRY_POINTS]
    assert not unused, "defined under scripts/ but never used there (move to tests/ or tools/, or delete):\n" + \
        "\n".join(unused)
