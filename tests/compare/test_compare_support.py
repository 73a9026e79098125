"""Shared helpers of the test_compare_* files: run the compare CLI and read its four outputs.

Imported by the sibling test files as ``compare.test_compare_support`` (``tests/`` is on
sys.path, see tests/conftest.py); it holds no tests itself. Synthetic scenarios are generated
and compared once per session and cached.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import synth
from dumpcompare.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
SAMPLES = ROOT / "tests" / "data" / "msprobe"
OUTPUT_JSON = ("output_1_key_mapping.json", "output_2_mapping.json",
               "output_3_value_compare.json", "output_4_module_analysis.json")
OUTPUT_FILES = OUTPUT_JSON + ("output_1_key_mapping.csv", "output_2_mapping.csv",
                              "output_3_value_compare.csv", "output_4_module_analysis.md")


class Outputs:
    """The four JSON outputs of one run, with look-ups the tests need."""

    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir)
        self.d1, self.d2, self.d3, self.d4 = (
            json.loads((self.dir / name).read_text(encoding="utf-8")) for name in OUTPUT_JSON)

    @property
    def first(self) -> dict:
        return self.d4["first_divergence"]

    @property
    def summary(self) -> dict:
        return self.d2["summary"]

    def verdict(self, train=None, rollout=None) -> dict:
        """The output_4 record whose train (and/or rollout) module list is exactly the one given."""
        hits = [m for m in self.d4["modules"]
                if (train is None or m["train_modules"] == list(train))
                and (rollout is None or m["rollout_modules"] == list(rollout))]
        assert len(hits) == 1, f"{len(hits)} verdicts for train={train} rollout={rollout}"
        return hits[0]

    def pair(self, pid: str) -> dict:
        return next(p for p in self.d2["pairs"] if p["pair_id"] == pid)

    def ranked(self, best: int = 2) -> list[dict]:
        """Verdicts with module_priority_rank <= best, in output order."""
        return [m for m in self.d4["modules"] if m["module_priority_rank"] <= best]

    def results(self, point: str, pair=None) -> list[dict]:
        return [r for r in self.d3["results"] if r["point"] == point and r["pair"] == pair]

    def result(self, point: str, pair=None) -> dict:
        hits = self.results(point, pair)
        assert len(hits) == 1, f"{len(hits)} results for {point} (pair {pair})"
        return hits[0]

    def one_sided(self, side: str, module: str) -> dict:
        return next(o for o in self.d2["one_sided"] if o["side"] == side and o["module"] == module)


def run_cli(train, rollout, out_dir, *extra) -> Outputs:
    """Run the CLI in this process (quiet) and return its outputs; fails on a non-zero exit."""
    rc = cli_main(["--train", str(train), "--rollout", str(rollout), "--out-dir", str(out_dir),
                   "--quiet", *map(str, extra)])
    assert rc == 0
    return Outputs(out_dir)


_CACHE: dict[str, tuple[Outputs, Path, Path]] = {}


def synth_pair(base: Path, *, train="hf", rollout="vllm", faults=(), task="statistics",
               tensor_format="npy", layers=2, config=None, extra=(), **gen_kw) -> tuple[Outputs, Path, Path]:
    """Generate a synthetic pair (cached per arguments), compare it; returns (outputs, train, rollout).

    ``config`` holds further ``synth.Config`` fields, ``extra`` further CLI arguments, ``gen_kw``
    further ``synth.generate_pair`` arguments (layout options).
    """
    config = dict(config or {})
    key = repr((train, rollout, faults, task, tensor_format, layers, sorted(config.items()), extra,
                sorted(gen_kw.items())))
    if key not in _CACHE:
        root = Path(base) / f"s{len(_CACHE)}"
        tdir, rdir = synth.generate_pair(root / "dumps", synth.Config(layers=layers, **config),
                                         train_layout=train, rollout_layout=rollout, faults=faults,
                                         task=task, tensor_format=tensor_format, **gen_kw)
        _CACHE[key] = (run_cli(tdir, rdir, root / "out", *extra), tdir, rdir)
    return _CACHE[key]


@pytest.fixture(scope="session")
def synth_run(tmp_path_factory):
    """``synth_run(**kw)`` -> Outputs of a cached synthetic scenario (see ``synth_pair``)."""
    base = tmp_path_factory.mktemp("synth_pairs")
    return lambda **kw: synth_pair(base, **kw)[0]


@pytest.fixture(scope="session")
def synth_dirs(tmp_path_factory):
    """``synth_dirs(**kw)`` -> (Outputs, train dump folder, rollout dump folder)."""
    base = tmp_path_factory.mktemp("synth_dirs")
    return lambda **kw: synth_pair(base, **kw)

