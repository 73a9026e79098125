"""The sibling compare skill: run it as a subprocess (argument list, never a shell), and load its
safe-text module.

Both skills must escape dump names for their views with one implementation. This skill imports
nothing from the sibling's package (the two share only files), so the one module it needs,
``dumpcompare/safetext.py`` (standard library only), is loaded by file path from the sibling folder
found next to this skill, the same folder whose ``run_compare.py`` it runs. A missing sibling is the
same one-line error (exit 2) either way.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

# This skill's folder; the sibling sits next to it.
SKILL_ROOT = Path(__file__).resolve().parents[2]
PROGRESS_PREFIX = "[run_compare "
SIBLING = "dump-module-mapping-value-compare"
ENTRY = Path("scripts") / "run_compare.py"
SAFETEXT = Path("scripts") / "dumpcompare" / "safetext.py"
HTML_MODULE = Path("scripts") / "dumpcompare" / "htmlreport.py"
TENSORIO = Path("scripts") / "dumpcompare" / "tensorio.py"
ATOMIC_FILE = Path("scripts") / "dumpcompare" / "atomicfile.py"
DTYPES = Path("scripts") / "dumpcompare" / "dtypes.py"


class SiblingError(Exception):
    """The sibling skill is missing or could not produce its outputs (exit 2)."""


def _sibling_file(skill_root: Path, entry: Path) -> Path:
    path = skill_root.parent / SIBLING / entry
    if not path.is_file():
        raise SiblingError(f"{path}: sibling skill '{SIBLING}' not found next to {skill_root.name}/ "
                           f"(both folders must sit in the same skills directory)")
    return path


def locate(skill_root: Path) -> Path:
    """Path of the sibling's run_compare.py next to this skill's folder."""
    return _sibling_file(skill_root, ENTRY)


_PACKAGE = "rootcause_sibling"


def _load(skill_root: Path, entry: Path, what: str) -> ModuleType:
    """One of the sibling's standalone modules, loaded by file path (this skill imports nothing of
    the sibling's package). The module is placed in a stand-in package over the sibling's folder,
    so that its own relative imports of other standalone modules (tensorio -> containment) resolve
    there without running the sibling package's code."""
    path = _sibling_file(skill_root, entry)
    package = sys.modules.get(_PACKAGE)
    if package is None or list(package.__path__) != [str(path.parent)]:
        for stale in [m for m in sys.modules if m.startswith(_PACKAGE + ".")]:
            del sys.modules[stale]          # modules of another sibling folder
        package = ModuleType(_PACKAGE)
        package.__path__ = [str(path.parent)]
        sys.modules[_PACKAGE] = package
    name = f"{_PACKAGE}.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except (OSError, SyntaxError, ImportError) as exc:
        del sys.modules[spec.name]
        raise SiblingError(f"{path}: cannot load the sibling's {what} module ({exc})") from None
    return module


def load_safetext(skill_root: Path) -> ModuleType:
    """The sibling's safetext module (escaping of dump names per view)."""
    return _load(skill_root, SAFETEXT, "safe-text")


def load_tensorio(skill_root: Path) -> ModuleType:
    """The sibling's safe tensor reader (torch.save files read without unpickling code)."""
    return _load(skill_root, TENSORIO, "tensor reader")


def load_atomicfile(skill_root: Path) -> ModuleType:
    """The sibling's atomicfile module (the one atomic file writer of both skills)."""
    return _load(skill_root, ATOMIC_FILE, "atomic-file")


def load_dtypes(skill_root: Path) -> ModuleType:
    """The sibling's dtypes module (the one spelling of a dtype and the integer-dtype test)."""
    return _load(skill_root, DTYPES, "dtypes")


def load_html(skill_root: Path) -> ModuleType:
    """The sibling's report.html module: it owns the charts; this skill adds its verdict to the page."""
    return _load(skill_root, HTML_MODULE, "report")


def run(script: Path, argv: list[str], progress: bool = False) -> None:
    """Run the compare skill; on failure raise SiblingError with its one-line message.

    With ``progress`` the compare step's progress lines (stderr, long runs only) are passed
    through as they come; its summary on stdout is not wanted here either way.
    """
    # Imported here: the log-prob triage loads this module for its file writer and never runs the
    # compare step, and subprocess is a fiftieth of a second of its start-up.
    import subprocess

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
