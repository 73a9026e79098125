"""Reading the two sides in worker processes gives the same outputs; progress goes to stderr."""
import json

import pytest

from dumpcompare import cli
from dumpcompare.cli import main as cli_main
from synth import CorruptWeight

from compare.test_compare_support import synth_dirs  # noqa: F401  (fixture)


def _doc(out, n):
    doc = json.loads((out / f"output_{n}.json").read_text())
    doc.pop("sources", None)
    return doc


def test_two_worker_processes_give_the_same_outputs(tmp_path, synth_dirs):  # noqa: F811
    _, tdir, rdir = synth_dirs(faults=(CorruptWeight("rollout", "up", 1),))
    for jobs in ("1", "2"):
        assert cli_main(["--train", str(tdir), "--rollout", str(rdir), "--out-dir", str(tmp_path / jobs),
                         "--quiet", "--jobs", jobs]) == 0
    for n in ("2_mapping", "3_value_compare", "4_module_analysis"):
        assert _doc(tmp_path / "1", n) == _doc(tmp_path / "2", n)


def test_a_bad_file_read_by_a_worker_is_a_one_line_input_error(tmp_path, synth_dirs, capsys):  # noqa: F811
    _, tdir, _ = synth_dirs(faults=(CorruptWeight("rollout", "up", 1),))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert cli_main(["--train", str(tdir), "--rollout", str(bad), "--out-dir", str(tmp_path / "o"),
                     "--jobs", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("quiet", [False, True])
def test_progress_lines_on_stderr_unless_quiet(tmp_path, synth_dirs, capsys, monkeypatch, quiet):  # noqa: F811
    _, tdir, rdir = synth_dirs(faults=(CorruptWeight("rollout", "up", 1),))
    monkeypatch.setattr(cli, "PROGRESS_MIN_BYTES", 0)
    assert cli_main(["--train", str(tdir), "--rollout", str(rdir), "--out-dir", str(tmp_path / "o")]
                    + (["--quiet"] if quiet else [])) == 0
    err = capsys.readouterr().err.splitlines()
    if quiet:
        assert err == []
    else:
        assert err and all(line.startswith("[run_compare ") for line in err)
        assert "reading 2 dump file(s)" in err[0] and err[-1].endswith("done")


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--train", "a", "--rollout", "b", "--out-dir", str(tmp_path), "--jobs", "0"])
    assert exc.value.code == 2
