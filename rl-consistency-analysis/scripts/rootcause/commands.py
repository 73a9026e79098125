"""The command that runs a next check: an argument list beside the prose, or None when the check is
reading code or a config (nothing to run).

The checks are this skill's own sentences (hypotheses.py, sides.py); the phrases matched here are
the ones those sentences use for a rerun with the checkpoint, a tensor-mode or wider dump, a naming
profile or the token ids. Placeholders in capitals (CHECKPOINT_DIR, DUMP_DIR, NAMING_YAML) are the
parts only the user knows.
"""
from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]
ROOT_CAUSE = SCRIPTS / "run_root_cause_analysis.py"
DUMP_CONFIG = SCRIPTS / "make_dump_config.py"
CHECKPOINT = "CHECKPOINT_DIR"
# Options of the run that a rerun leaves out: it must compare again and print its answer.
_NOT_RERUN = ("--reuse-outputs", "--quiet")


def rerun(argv: list[str], *extra: str) -> list[str]:
    """This run's command line again, with ``extra`` options added."""
    kept = [a for a in argv if a not in _NOT_RERUN]
    return ["python3", str(ROOT_CAUSE), *kept, *extra]


def with_model(argv: list[str]) -> list[str] | None:
    """The rerun that holds both sides against the checkpoint; None when --model was already given."""
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return None
    return rerun(argv, "--model", CHECKPOINT)


def _dump_config(*options: str) -> list[str]:
    return ["python3", str(DUMP_CONFIG), "--out", "config.json", "--dump-path", "DUMP_DIR", *options]


def for_check(text: str, argv: list[str]) -> list[str] | None:
    """The command that runs the check ``text`` of a run started with ``argv`` (None: nothing to run)."""
    low = text.lower()
    if "--naming" in low:
        return rerun(argv, "--naming", "NAMING_YAML")
    if "tensor mode" in low:
        return _dump_config("--task", "tensor")
    if "re-dump with msprobe" in low:
        return _dump_config()
    if "token ids both engines received" in low:
        return _dump_config("--summary-mode", "md5", "--layers", "0")
    if "--model" in low or "with the checkpoint" in low:
        return with_model(argv)
    return None


def checks(texts: list[str], argv: list[str]) -> list[dict]:
    """Next checks as output_5 gives them: the prose and the command beside it."""
    return [{"check": t, "command": for_check(t, argv)} for t in texts]
