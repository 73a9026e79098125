"""Fixtures for the rl-consistency-analysis tests.

``analyze`` generates a synthetic train/rollout pair (tests/synth), runs the root-cause CLI
in-process (``rootcause.cli.main``; the compare step still runs as its subprocess) and caches the
result per case for the whole session, so that several test modules can look at the same report
without paying for the run twice. ``script`` runs the skill's entry script as a user would.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from synth import Config, generate_pair

sys.dont_write_bytecode = True

REPO = Path(__file__).resolve().parents[2]
SKILL = REPO / "rl-consistency-analysis"
SIBLING = REPO / "dump-module-mapping-value-compare"
SCRIPT = SKILL / "scripts" / "run_root_cause_analysis.py"
REPORT = "output_5_root_cause_report.json"
SMALL = dict(layers=4, hidden=32)
SHARED_SAMPLES = Path("/work/shared/research/msprobe_samples")
SAMPLES = ("llama_L0_statistics", "llama_L0_statistics_perturbed", "consistent_check_fsdp_vs_vllm_synthetic")


def small(**kw) -> Config:
    """The small model every synthetic case uses (4 layers, hidden 32) unless told otherwise."""
    return Config(**{**SMALL, **kw})


def run_main(argv):
    """Run ``rootcause.cli.main`` in-process; returns (exit code, stdout, stderr)."""
    from rootcause import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def load_report(out_dir: Path) -> dict:
    return json.loads((Path(out_dir) / REPORT).read_text(encoding="utf-8"))


@pytest.fixture(scope="session", autouse=True)
def _no_bytecode():
    """The compare step runs as a subprocess of the in-process CLI: keep it from writing caches."""
    old = os.environ.get("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    yield
    if old is None:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        os.environ["PYTHONDONTWRITEBYTECODE"] = old


@pytest.fixture(scope="session")
def analyze(tmp_path_factory):
    """``analyze(faults, train_layout=, rollout_layout=, task=, tensor_format=, cfg=)`` -> result.

    The result has ``code`` (exit code), ``doc`` (output_5 JSON), ``stdout``, ``out`` (the
    --out-dir), ``train`` and ``rollout`` (the generated dump folders). Cached per case.
    """
    cache = {}

    def run(faults=(), train_layout="hf", rollout_layout="vllm", task="statistics", tensor_format="npy",
            cfg=None):
        cfg = cfg or small()
        faults = list(faults)
        key = repr((faults, train_layout, rollout_layout, task, tensor_format, cfg))
        if key not in cache:
            root = tmp_path_factory.mktemp("case")
            train, rollout = generate_pair(root / "pair", cfg, train_layout=train_layout,
                                           rollout_layout=rollout_layout, faults=faults, task=task,
                                           tensor_format=tensor_format)
            out = root / "out"
            code, stdout, stderr = run_main(["--train", train, "--rollout", rollout, "--out-dir", out])
            assert code == 0, f"analysis failed ({code}): {stderr}"
            cache[key] = SimpleNamespace(code=code, doc=load_report(out), stdout=stdout, out=out,
                                         train=train, rollout=rollout)
        return cache[key]

    return run


@pytest.fixture(scope="session")
def analyze_pair(tmp_path_factory):
    """``analyze_pair(train, rollout, *extra_args)`` on existing dumps -> result (as ``analyze``), cached."""
    cache = {}

    def run(train, rollout, *extra):
        key = (str(train), str(rollout), extra)
        if key not in cache:
            out = tmp_path_factory.mktemp("pair") / "out"
            code, stdout, stderr = run_main(["--train", train, "--rollout", rollout, "--out-dir", out, *extra])
            assert code == 0, f"analysis failed ({code}): {stderr}"
            cache[key] = SimpleNamespace(code=code, doc=load_report(out), stdout=stdout, out=out,
                                         train=train, rollout=rollout)
        return cache[key]

    return run


@pytest.fixture
def cli():
    """``cli(*argv)`` runs ``rootcause.cli.main`` in-process -> (exit code, stdout, stderr)."""
    return lambda *argv: run_main(list(argv))


@pytest.fixture(scope="session")
def msprobe_samples(tmp_path_factory) -> Path:
    """Folder holding the real msprobe acceptance samples.

    tests/data/msprobe when it has them (committed copies); otherwise a copy of the shared
    research samples in a temporary folder; skipped when neither exists.
    """
    local = REPO / "tests" / "data" / "msprobe"
    if all((local / s).is_dir() for s in SAMPLES):
        return local
    if not all((SHARED_SAMPLES / s).is_dir() for s in SAMPLES):
        pytest.skip("msprobe acceptance samples not available")
    dst = tmp_path_factory.mktemp("msprobe")
    for s in SAMPLES:
        shutil.copytree(SHARED_SAMPLES / s, dst / s)
    return dst


@pytest.fixture
def script(tmp_path):
    """Run an entry script as a subprocess from a scratch cwd; returns code, out, err."""

    def run(path, *args, cwd=None, env=None):
        full_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", **(env or {}))
        proc = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True,
                              cwd=cwd or tmp_path, env=full_env, timeout=120)
        return SimpleNamespace(code=proc.returncode, out=proc.stdout, err=proc.stderr)

    return run
