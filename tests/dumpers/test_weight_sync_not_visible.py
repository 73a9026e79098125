"""check_weight_sync.py's not-visible path, without vLLM or torch: a weight the engine keeps only
in a kernel format that the probe cannot recover is reported ``not_visible`` (exit 1, listed in
weight_sync.md), never counted as equal.

The probe's side is exercised with stand-in modules and a stand-in ``torch`` (``_weight`` takes the
torch module as an argument); the report side with probe rows built here, shaped like those
``weight_probe.compare_rank`` returns."""
import contextlib
import importlib
import json
import sys
import types
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "rl-consistency-analysis" / "scripts"
sys.path.insert(0, str(SCRIPTS))

check = importlib.import_module("check_weight_sync")
weight_probe = importlib.import_module("dumping.weight_probe")


class _Empty:
    """A prepacked parameter: the engine left an empty ``[0]`` tensor behind."""
    dtype = "float32"

    def numel(self):
        return 0

    def is_floating_point(self):
        return True


_TORCH = types.SimpleNamespace(float32="float32", no_grad=contextlib.nullcontext,
                               eye=lambda n, dtype=None: ("eye", n))


def _linear(method=None, n_in=4):
    return types.SimpleNamespace(weight=_Empty(), quant_method=method, input_size_per_partition=n_in)


def test_prepacked_weight_without_a_kernel_is_not_visible():
    weight, why = weight_probe._weight(types.SimpleNamespace(weight=_Empty()), _TORCH)
    assert weight is None and "no visible weight" in why


def test_a_kernel_that_refuses_the_probe_leaves_the_weight_unseen():
    class Refuses:
        def apply(self, module, x, bias=None):
            raise RuntimeError("prepacked kernel needs a packed input")

    weight, why = weight_probe._weight(_linear(Refuses()), _TORCH)
    assert weight is None and why.startswith("probe failed: RuntimeError")


def test_a_probe_of_the_wrong_shape_is_not_taken_for_the_weight():
    class Flat:
        def apply(self, module, x, bias=None):
            return types.SimpleNamespace(ndim=1, shape=(7,))

    weight, why = weight_probe._weight(_linear(Flat()), _TORCH)
    assert weight is None and "probe returned shape [7]" in why


def _rows():
    base = {"rank": 0, "engine_module": "model.layers.0.self_attn.o_proj"}
    return [
        {**base, "tensor": "model.layers.0.input_layernorm.weight", "engine_module": "model.layers.0.input_layernorm",
         "how": "parameter", "status": "equal", "max_abs_diff": 0.0, "ref_norm": 2.0, "slice": None},
        {**base, "tensor": "model.layers.0.self_attn.o_proj.weight", "how": "no visible weight and no kernel to probe",
         "status": "not_visible", "ref_norm": 3.5},
    ]


def test_not_visible_is_reported_and_fails_the_check(tmp_path, capsys):
    code = check.write_report(tmp_path / "ws", _rows(), reference="ref", engine_model="eng", tp=1)
    assert code == 1
    doc = json.loads((tmp_path / "ws" / "weight_sync.json").read_text())
    assert doc["schema_version"] == check.SCHEMA_VERSION
    assert doc["counts"] == {"equal": 1, "not_visible": 1}
    unseen = [r for r in doc["rows"] if r["tensor"].endswith("o_proj.weight")]
    assert [r["status"] for r in unseen] == ["not_visible"] and "max_abs_diff" not in unseen[0]
    md = (tmp_path / "ws" / "weight_sync.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| 0 |")]
    assert len(table) == 1 and "o_proj.weight" in table[0] and "| not_visible |" in table[0]
    assert "input_layernorm" not in md.split("counts:")[0]  # equal rows are not listed
    assert "not_visible 1" in md
    out = capsys.readouterr().out
    assert "1 not equal" in out and "(not_visible)" in out


@pytest.mark.parametrize("rows", [[], [dict(_rows()[1], status="not_visible")] * 2])
def test_nothing_seen_is_never_all_equal(tmp_path, rows):
    assert check.write_report(tmp_path / "ws", rows, reference="r", engine_model="e", tp=1) == 1
    assert "all equal" not in (tmp_path / "ws" / "weight_sync.md").read_text()


def test_all_equal_passes(tmp_path):
    assert check.write_report(tmp_path / "ws", _rows()[:1], reference="r", engine_model="e", tp=1) == 0
