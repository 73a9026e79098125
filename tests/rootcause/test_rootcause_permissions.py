"""The report is an ordinary file, readable like the compare outputs next to it."""
import os
import stat

from rootcause import report


def test_report_file_mode_follows_the_umask(tmp_path):
    path = report.write(tmp_path, {"schema_version": "1.0", "verdict": "no_credible_divergence"})
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
