"""Test set-up: make the skills' script packages and the synthetic dump generator importable."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for sub in ("dump-module-mapping-value-compare/scripts", "rl-consistency-analysis/scripts",
            "ml-debug/scripts", "tests"):
    p = str(ROOT / sub)
    if p not in sys.path:
        sys.path.insert(0, p)


# -- one summary line per area (top-level folder of tests/) ---------------------------------------
# Printed before pytest's own closing "N passed ..." line, which CI reads and which stays as is.

_OUTCOME: dict[str, str] = {}       # test id -> failed | skipped | passed (worst phase wins)
_SECONDS: dict[str, float] = {}     # area -> time in setup, call and teardown
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def _area(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    return parts[0] if len(parts) > 1 else "top level"


def pytest_runtest_logreport(report):
    area = _area(report.nodeid)
    _SECONDS[area] = _SECONDS.get(area, 0.0) + report.duration
    outcome = report.outcome if (report.when == "call" or not report.passed) else None
    if outcome and _RANK[outcome] >= _RANK[_OUTCOME.get(report.nodeid, "passed")]:
        _OUTCOME[report.nodeid] = outcome


def pytest_terminal_summary(terminalreporter):
    if not _OUTCOME:
        return
    counts: dict[str, dict[str, int]] = {}
    for nodeid, outcome in _OUTCOME.items():
        c = counts.setdefault(_area(nodeid), {"passed": 0, "failed": 0, "skipped": 0})
        c[outcome] += 1
    terminalreporter.section("by area", sep="-")
    width = max(len(a) for a in counts)
    for area, c in sorted(counts.items()):
        terminalreporter.write_line(f"{area:<{width}}  {c['passed']:4d} passed  {c['failed']:3d} failed  "
                                    f"{c['skipped']:3d} skipped  {_SECONDS.get(area, 0.0):7.1f} s")
