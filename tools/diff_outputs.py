"""Run the root-cause pipeline on every committed pair and diff two such runs (refactor check).

``run`` executes ``<repo>/rl-consistency-analysis/scripts/run_root_cause_analysis.py`` (which
runs the compare step) on each pair under ``tests/data/real/`` and ``examples/`` of ``--data``
(default: this checkout), in two variants:

* ``default``: as a user runs it, no step, rank or model flag;
* ``model``: with the pair's checkpoint (``--model``, ranks merged as ``tests/refcheck`` does),
  so the reference, the replays and the reference forward run too; only pairs with a model.

Every file of each out-dir (output_1..5, their CSV/markdown views, report.html) is kept under
``<out>/<pair>/<variant>/`` with ``exit.json`` (exit code and stderr).  ``diff`` compares two
such runs file by file after putting placeholders for the run's own paths (its out root, the
checkout whose pairs it read and the repo it ran) and dropping timing fields; it exits 1 when anything differs.

    python3 tools/diff_outputs.py run --repo /tmp/basemain --out /tmp/outs_old
    python3 tools/diff_outputs.py run --out /tmp/outs_new
    python3 tools/diff_outputs.py diff /tmp/outs_old /tmp/outs_new
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path("rl-consistency-analysis") / "scripts" / "run_root_cause_analysis.py"
META = "run.json"
# Keys whose values depend on the clock, not on the code; none is written today, listed so a
# later timing field does not read as a behaviour change.
TIMING_KEY = re.compile(r"(^|_)(elapsed|seconds|duration|timing|wall|started|finished)(_|$)")


def pairs(data: Path) -> dict[str, dict]:
    """pair name -> {"train", "rollout", "model" (folder or None), "ranks" (extra flags)}."""
    found = {}
    corpus = data / "tests" / "data" / "real"
    for case_file in sorted(corpus.glob("*/case.json")):
        case = json.loads(case_file.read_text(encoding="utf-8"))
        folder = case_file.parent
        family = "megatron_llama" if case["train"]["engine"] == "megatron-core" else case["family"]
        model = corpus / "_models" / family
        ranks = ["--rollout-rank", "all"] if case["rollout"].get("tp", 1) > 1 else []
        if case["train"].get("layout", "").startswith("fsdp"):
            ranks += ["--train-rank", "0"]
        found[folder.name] = {"train": folder / "train", "rollout": folder / "rollout",
                              "model": model if (model / "config.json").is_file() else None, "ranks": ranks}
    for folder in sorted((data / "examples").iterdir()):
        if (folder / "train").is_dir() and (folder / "rollout").is_dir():
            found[f"examples.{folder.name}"] = {"train": folder / "train", "rollout": folder / "rollout",
                                                "model": None, "ranks": []}
    return found


def _jobs(found: dict[str, dict]) -> list[tuple[str, str, list[str]]]:
    jobs = []
    for name, pair in found.items():
        base = ["--train", str(pair["train"]), "--rollout", str(pair["rollout"])]
        jobs.append((name, "default", base))
        if pair["model"] is not None:
            jobs.append((name, "model", base + pair["ranks"] + ["--model", str(pair["model"])]))
    return jobs


def run(repo: Path, data: Path, out: Path, workers: int) -> int:
    """Run every pair and variant of ``data`` with ``repo``'s scripts into ``out``."""
    if out.exists():
        sys.exit(f"error: {out} exists; give a new folder")
    out.mkdir(parents=True)
    script = repo / SCRIPT

    def one(job):
        name, variant, argv = job
        dest = out / name / variant
        proc = subprocess.run([sys.executable, str(script), *argv, "--out-dir", str(dest), "--quiet"],
                              capture_output=True, text=True, timeout=600)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "exit.json").write_text(json.dumps({"code": proc.returncode, "stderr": proc.stderr}), encoding="utf-8")
        return proc.returncode

    jobs = _jobs(pairs(data))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        codes = list(pool.map(one, jobs))
    (out / META).write_text(json.dumps({"repo": str(repo), "data": str(data), "out": str(out)}), encoding="utf-8")
    print(f"{len(jobs)} runs of {len({j[0] for j in jobs})} pairs into {out}; "
          f"exit codes: {dict(sorted((c, codes.count(c)) for c in set(codes)))}")
    return 0


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if not TIMING_KEY.search(k)}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _normalised(path: Path, meta: dict):
    text = path.read_text(encoding="utf-8", errors="replace")
    # Longest first: the out root or the data checkout may sit inside the repo that ran.
    for key in sorted(("out", "data", "repo"), key=lambda k: -len(meta[k])):
        text = text.replace(meta[key], f"<{key.upper()}>")
    if path.suffix == ".json":
        return _without_timing(json.loads(text))
    return text


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name != META}


def diff(old: Path, new: Path, show: int) -> int:
    """Compare two runs; print the counts and the first ``show`` differing files."""
    metas = [json.loads((root / META).read_text(encoding="utf-8")) for root in (old, new)]
    a, b = _files(old), _files(new)
    only = sorted(a ^ b)
    differing = [rel for rel in sorted(a & b)
                 if _normalised(old / rel, metas[0]) != _normalised(new / rel, metas[1])]
    runs = {rel.parts[:2] for rel in a | b}
    print(f"{len(runs)} runs, {len(a & b)} files in both, {len(differing)} differ, {len(only)} in one run only")
    for rel in (only + differing)[:show]:
        print(f"  {'only in one run' if rel in only else 'differs'}: {rel}")
    return 1 if differing or only else 0


def main(argv=None) -> int:
    """Command line: ``run`` or ``diff``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run every committed pair into --out")
    r.add_argument("--repo", type=Path, default=REPO, help="checkout whose scripts run (default: this one)")
    r.add_argument("--data", type=Path, default=REPO, help="checkout whose pairs are read (default: this one)")
    r.add_argument("--out", type=Path, required=True, help="new folder for the outputs")
    r.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    d = sub.add_parser("diff", help="compare two runs; exit 1 when they differ")
    d.add_argument("old", type=Path)
    d.add_argument("new", type=Path)
    d.add_argument("--show", type=int, default=20, help="differing files listed (default 20)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args.repo.resolve(), args.data.resolve(), args.out.resolve(), args.jobs)
    return diff(args.old, args.new, args.show)


if __name__ == "__main__":
    sys.exit(main())
