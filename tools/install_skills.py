#!/usr/bin/env python3
"""Install the three skill folders side by side into an agent's skills directory (make install-skills).

Links by default, so that the installed skills follow this checkout; ``--copy`` copies instead
(for a skills directory on another machine or in a container). The root-cause skill finds its
sibling next to itself, which is why the three always go into the same DEST.

Nothing is overwritten: an existing entry of the same name is accepted only when it already is
this install (a link to the same folder, or with ``--copy`` a folder with the same files);
anything else stops the whole install before any change, with one line and exit code 2.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKILLS = ("dump-module-mapping-value-compare", "rl-consistency-analysis", "ml-debug")
CACHES = ("__pycache__", ".pytest_cache")


def _same_tree(a: Path, b: Path) -> bool:
    """True when ``b`` holds the same files with the same contents as ``a`` (caches ignored)."""
    cmp = filecmp.dircmp(a, b, ignore=list(CACHES))
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return False
    return all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def _state(src: Path, dst: Path, copy: bool) -> str:
    """'missing', 'installed' (already this install) or 'conflict'."""
    if dst.is_symlink():
        if not copy and dst.resolve() == src.resolve():
            return "installed"
        return "conflict"
    if not dst.exists():
        return "missing"
    if copy and dst.is_dir() and _same_tree(src, dst):
        return "installed"
    return "conflict"


def install(dest: Path, copy: bool) -> list[str]:
    """Install every skill into ``dest``; returns one line per skill. Raises ValueError on a conflict."""
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest}: DEST exists and is not a folder")
    plan = [(ROOT / name, dest / name) for name in SKILLS]
    for src, _ in plan:
        if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
            raise ValueError(f"{dest}: DEST is inside the skill folder {src}; choose a skills directory "
                             f"outside the three skill folders")
    for src, dst in plan:
        if _state(src, dst, copy) == "conflict":
            what = (f"a link to {os.readlink(dst)}" if dst.is_symlink() else
                    "a folder with other contents" if dst.is_dir() else "a file")
            want = f"a copy of {src}" if copy else f"a link to {src}"
            raise ValueError(f"{dst}: already exists and is {what}, not {want}; remove it or choose another "
                             f"DEST (nothing was installed)")
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for src, dst in plan:
        if _state(src, dst, copy) == "installed":
            lines.append(f"{dst}: already installed")
        elif copy:
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*CACHES, "*.pyc"))
            lines.append(f"{dst}: copied from {src}")
        else:
            os.symlink(src, dst, target_is_directory=True)
            lines.append(f"{dst} -> {src}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 installed, 2 usage error or conflict)."""
    ap = argparse.ArgumentParser(
        description="Link (or copy) the three skill folders side by side into an agent's skills directory.",
        epilog="Exit codes: 0 installed (or already installed); 2 bad usage, or DEST already holds a "
               "different folder of the same name (nothing is changed then).")
    ap.add_argument("--dest", required=True, help="skills directory, e.g. ~/.claude/skills (created if missing)")
    ap.add_argument("--copy", action="store_true", help="copy the folders instead of linking them")
    args = ap.parse_args(argv)
    try:
        lines = install(Path(args.dest).expanduser().absolute(), args.copy)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
