"""Issue 5, mutation fuzzing: tools/fuzz_dumps.py over 150 cases finds no contract violation.

The fuzzer runs with --skip-known, which leaves out the mutation variants of the crashes already
reported (each has a strict xfail reproduction in test_fuzz_crash_repros.py) and does not count
their signatures, so this test guards against new crashes. ``make fuzz`` runs many more cases
and counts everything. The other tests check that the fuzzer's own checks would catch a
violation and that every mutation kind applies cleanly to every base.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from fuzz.fuzz_support import FUZZER, SAMPLES, fuzz_dumps

F = fuzz_dumps


@pytest.mark.slow
def test_fuzz_150_cases_without_violation(tmp_path):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, str(FUZZER), "--cases", "150", "--seed", "0", "--skip-known",
                           "--rootcause-every", "6", "--out", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900, env=env)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0 and last == "150 cases, 0 tracebacks, 0 contract violations", \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    # Passing cases leave nothing behind but the shared bases and bytecode cache.
    assert not list((tmp_path / "work" / "cases").iterdir())


def test_help_and_mutation_list():
    for flag in ("--help", "--list-mutations"):
        proc = subprocess.run([sys.executable, str(FUZZER), flag], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout
    assert "truncate" in proc.stdout and "tensor_file" in proc.stdout


# ---------------------------------------------------------------------------------------------
# The fuzzer's own machinery


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    where = tmp_path_factory.mktemp("fuzz_bases") / "bases"
    return where, F.build_bases(where)


@pytest.mark.slow
def test_every_mutation_applies_to_every_base(bases, tmp_path):
    base_dir, described = bases
    i = 0
    for name in sorted(described):
        for mutation, (_, needs, _) in F.MUTATIONS.items():
            for side in ("train", "rollout"):
                i += 1
                case = F.prepare_case(i, 0, described, base_dir, tmp_path, False, name, [(mutation, side)])
                assert case.mutations and "fuzzer" not in case.mutations[0]
                if needs == "tensor" and described[name].tensors and mutation == "data_name_escape":
                    assert case.must_not_read, case.mutations
    assert i == 2 * len(described) * len(F.MUTATIONS)


def test_scan_points_finds_every_kind_of_cut_in_a_real_dump():
    text = (SAMPLES / "llama_L0_tensor" / "step0" / "proc0" / "dump.json").read_text()
    pts = F.scan_points(text)
    assert set(pts) == set(F.TRUNC_KINDS) - {"after_data"} | ({"after_data"} if "after_data" in pts else set())
    data_open = text.index("{", text.index('"data"'))
    assert pts["data_opened"] == [data_open + 1]
    assert all(text[p - 1] in "0123456789.eE+-" for p in pts["number"])
    assert all(p <= text.index('"data"') for p in pts["before_data"])
    # A cut between entries leaves whole entries only.
    cut = text[:pts["between_entries"][3]].rstrip(",\n ")
    assert cut.endswith("}")


def test_json_writer_keeps_duplicates_nan_and_raw_tokens():
    doc = F.Obj([["a", 1], ["a", float("nan")], ["b", [F.Raw("1e400"), -float("inf")]]])
    text = F.emit(doc, None)
    assert text == '{"a":1,"a":NaN,"b":[1e400,-Infinity]}'
    assert json.loads(text) == {"a": pytest.approx(float("nan"), nan_ok=True), "b": [float("inf"), -float("inf")]}


def test_hostile_payloads_are_live_under_plain_pickle(tmp_path):
    import random
    import zipfile
    import io
    for seed in range(12):
        marker = tmp_path / f"m{seed}"
        kind, blob = F.hostile_pt(random.Random(seed), marker)
        pkl = zipfile.ZipFile(io.BytesIO(blob)).read("archive/data.pkl")
        obj = pickle.loads(pkl)  # what torch.load without weights_only would do
        for v in (obj, *(obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ())):
            if hasattr(v, "close"):
                v.close()
        assert marker.exists(), kind


def test_snapshot_sees_created_changed_deleted_and_relinked(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_text("2")
    (tmp_path / "link").symlink_to("a")
    (tmp_path / "out").mkdir()
    before = F.snapshot(tmp_path, [tmp_path / "out"])
    (tmp_path / "out" / "x").write_text("inside out-dir is fine")
    assert F.diff_snapshots(before, F.snapshot(tmp_path, [tmp_path / "out"])) == []
    (tmp_path / "a").write_text("11")
    (tmp_path / "d" / "b").unlink()
    (tmp_path / "c").write_text("new")
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to("c")
    diff = F.diff_snapshots(before, F.snapshot(tmp_path, [tmp_path / "out"]))
    assert {"changed a", "deleted d/b", "created c", "changed link"} <= set(diff)


def _case(tmp_path):
    base = F.Base("x", {s: F.Side(s, f"{s}/dump.json") for s in ("train", "rollout")}, False)
    return F.Case(0, base, tmp_path, None, False)


def _run(rc, err="", out=""):
    return F.Run(F.COMPARE.name, [], rc, out, err, 0.1)


@pytest.mark.parametrize("rc, err, words", [
    (1, "internal error: ValueError: x\n", "exit 1"),
    (None, "", "hang"),
    (2, "Traceback (most recent call last):\n  File x\nValueError\n", "traceback"),
    (2, "error: one\nerror: two\n", "2 stderr lines"),
    (2, "\n", "1 stderr lines"),
    (-9, "", "exit -9"),
    (2, "error: something is wrong\n", "names no file"),
])
def test_check_run_flags_each_kind_of_violation(tmp_path, rc, err, words):
    out = tmp_path / "out"
    v = F.check_run(_run(rc, err), _case(tmp_path), out, F.COMPARE_OUTPUTS, {}, {}, {})
    assert any(words in x for x in v), v


def test_check_run_flags_stray_writes_and_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".output_1_key_mapping.json.abc.tmp").write_text("")
    (out / "output_1_key_mapping.json").write_text("{}")
    before = {"train/dump.json": ("file", 10, 1, None)}
    after = {"train/dump.json": ("file", 10, 2, None), "stray.txt": ("file", 1, 1, None)}
    v = F.check_run(_run(2, "error: x\n"), _case(tmp_path), out, F.COMPARE_OUTPUTS, before, after, {})
    text = "\n".join(v)
    assert "unexpected file in --out-dir: .output_1_key_mapping.json.abc.tmp" in text
    assert "changed train/dump.json" in text and "created stray.txt" in text
    assert "exit 2 but wrote" in text
    v = F.check_run(_run(0), _case(tmp_path), out, F.COMPARE_OUTPUTS, {}, {}, {})
    assert any("missing outputs" in x for x in v)


def test_check_outputs_flags_a_leaf_read_beyond_the_dump_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    sources = {"train": {"salvage": None}, "rollout": {"salvage": None}}
    res = {"mode": "tensor", "train": {"keys": ["K"], "leaves": ["output.0"]},
           "rollout": {"keys": ["R"], "leaves": ["output.0"]}}
    docs = {"output_1_key_mapping.json": {"partial": False, "sources": sources},
            "output_2_mapping.json": {"partial": False},
            "output_3_value_compare.json": {"partial": False, "results": [res]},
            "output_4_module_analysis.json": {"partial": False}}
    for n, d in docs.items():
        (out / n).write_text(json.dumps(d))
    case = _case(tmp_path)
    assert F.check_outputs(F.COMPARE.name, out, case) == []
    case.must_not_read.append(("rollout", "R", "output.0"))
    assert any("read in tensor mode" in v for v in F.check_outputs(F.COMPARE.name, out, case))
    sources["rollout"]["salvage"] = {"entries_recovered": 1, "last_complete_key": "K", "byte_offset": 3}
    (out / "output_1_key_mapping.json").write_text(json.dumps({"partial": False, "sources": sources}))
    assert any("partial" in v for v in F.check_outputs(F.COMPARE.name, out, case))


def test_check_views_flags_formulas_control_characters_and_broken_tables(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "output_1_key_mapping.csv").write_text("side,path,n\ntrain,'=HYPERLINK(1),-1.5\n")
    (out / "output_4_module_analysis.md").write_text("| a | b |\n|---|---|\n| x\\|y | z |\n")
    assert F.check_views(F.COMPARE.name, out, "first divergence: \\x1b[31mred\n") == []
    (out / "output_1_key_mapping.csv").write_text("side,path\ntrain,@SUM(1+1)\n")
    (out / "output_4_module_analysis.md").write_text("| a | b |\n|---|---|\n| x|y | \u202ez |\n")
    text = "\n".join(F.check_views(F.COMPARE.name, out, "first divergence: \x1b[31mred\n"))
    assert "control character '\\x1b' on stdout" in text
    assert "output_1_key_mapping.csv cell starts like a formula: '@SUM(1+1)'" in text
    assert "control character '\\u202e' in output_4_module_analysis.md" in text
    assert "table rows of [2, 3] columns" in text
    v = F.check_run(_run(2, "error: Module.\x1b[2J: bad\n"), _case(tmp_path), out, F.COMPARE_OUTPUTS, {}, {}, {})
    assert any("control character '\\x1b' on stderr" in x for x in v)
