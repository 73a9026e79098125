"""The safetensors reader (dumpcompare/checkpoint.py): a tiny checkpoint written here with numpy."""
from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from dumpcompare import checkpoint
from dumpcompare.errors import InputError
from dumpcompare.tensorio import bfloat16_bits
from refcheck.realcases import COMPARE, CORPUS

_CODES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


def write_safetensors(path, tensors: dict, header_patch=None):
    """``tensors``: name -> (safetensors dtype, float array). bf16 is stored as rounded bits."""
    header, blobs, off = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = (bfloat16_bits(arr) if dtype == "BF16" else np.asarray(arr)).astype(_CODES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(np.shape(arr)), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if header_patch:
        header_patch(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_reads_f32_f16_and_bf16_exactly(tmp_path):
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3))
    write_safetensors(tmp_path / "model.safetensors", {"a": ("F32", a), "b": ("F16", b), "c": ("BF16", c)})
    (tmp_path / "config.json").write_text(json.dumps({"rms_norm_eps": 1e-5}))
    ck = checkpoint.load(tmp_path)
    assert ck.config["rms_norm_eps"] == 1e-5
    assert np.array_equal(ck.read("a"), a)
    assert np.array_equal(ck.read("b"), b.astype(np.float16))
    # bf16 widened exactly: equal to the float32 values rounded to nearest even
    want = (bfloat16_bits(c).astype(np.uint32) << 16).view(np.float32)
    assert ck.read("c").dtype == np.float32 and np.array_equal(ck.read("c"), want)
    assert not np.array_equal(want, c)                    # the rounding did happen
    assert ck.dtype_name("c") == "bfloat16"


def test_sharded_with_index(tmp_path):
    x, y = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"x": ("F32", x)})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"y": ("F32", y)})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}))
    ck = checkpoint.load(tmp_path)
    assert [f.name for f in ck.files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert np.array_equal(ck.read("x"), x) and np.array_equal(ck.read("y"), y)


def _big_offsets(h):
    h["w"]["data_offsets"] = [0, 10 ** 9]


def _overlap(h):
    h["v"]["data_offsets"] = [h["w"]["data_offsets"][0] + 4, h["w"]["data_offsets"][1] + 4]


@pytest.mark.parametrize("patch, words", [(_big_offsets, "do not fit"), (_overlap, "overlap")])
def test_bad_headers_are_refused(tmp_path, patch, words):
    write_safetensors(tmp_path / "model.safetensors",
                      {"w": ("F32", np.zeros(4, np.float32)), "v": ("F32", np.zeros(4, np.float32))}, patch)
    with pytest.raises(InputError, match=words):
        checkpoint.load(tmp_path)


def test_header_length_outside_the_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(InputError, match="points outside the file"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("name", ["../model.safetensors", "sub/model.safetensors", "..\\x.safetensors"])
def test_index_never_leaves_the_folder(tmp_path, name):
    (tmp_path / "m").mkdir()
    write_safetensors(tmp_path / "model.safetensors", {"w": ("F32", np.zeros(2, np.float32))})
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
    with pytest.raises(InputError, match="not a plain file name"):
        checkpoint.load(tmp_path / "m")


def test_cli_bad_model_is_exit_2_one_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    case = CORPUS / "llama_tp1_fp32_clean"
    proc = subprocess.run([sys.executable, str(COMPARE), "--train", str(case / "train"), "--rollout",
                           str(case / "rollout"), "--out-dir", str(tmp_path / "out"), "--model", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "model.safetensors" in proc.stderr and "outside the file" in proc.stderr
    assert not (tmp_path / "out").exists()
