"""The outputs are a function of the inputs: no dependence on hash seeds or on how many processes read."""
import os
import subprocess
import sys

import pytest

from compare.test_compare_support import SCRIPT, synth_dirs  # noqa: F401  (fixture)
from synth import PermuteQKV


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_outputs_do_not_depend_on_the_hash_seed_or_the_jobs(tmp_path, synth_dirs, task):  # noqa: F811
    _, tdir, rdir = synth_dirs(train="megatron", faults=(PermuteQKV("rollout", 1),), task=task)
    for seed, jobs in (("1", "1"), ("2", "2")):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, str(SCRIPT), "--train", str(tdir), "--rollout", str(rdir),
                        "--out-dir", str(tmp_path / seed), "--quiet", "--jobs", jobs], env=env, check=True)
    for name in sorted(os.listdir(tmp_path / "1")):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name
