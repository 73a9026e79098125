"""Tests for dumpcompare.tensorio: torch-free and safe reading of msprobe tensor files.

torch is never needed: real torch.save output is checked through the committed fixtures in
tests/data/pt (made by tools/make_pt_fixtures.py) and the real msprobe sample in tests/data/msprobe.
The one test that cross-checks save_pt against torch.load skips when torch is absent.
"""
import json
import math
import os
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dumpcompare.tensorio import TensorReadError, open_tensor, resolve_data_file, widen_bf16
from synth.ptfile import load_tensor, save_pt, source_dtype

DATA = Path(__file__).resolve().parent.parent / "data"
PT_DIR = DATA / "pt"
EXPECTED = json.loads((PT_DIR / "expected.json").read_text())
SAMPLE_DIR = DATA / "msprobe" / "llama_L0_tensor" / "step0" / "proc0"

ALL_DTYPES = ["float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64",
              "int32", "int16", "int8", "uint8", "bool", "uint16", "uint32", "uint64"]
SHAPES = [(2, 3), (), (0, 3), (5,), (2, 0, 4)]


def host_dtype(stored: str) -> str:
    return "float32" if stored == "bfloat16" else stored


def expected_array(entry: dict) -> np.ndarray:
    values = entry["values"]
    if entry["dtype"].startswith("complex"):
        values = [complex(re, im) for re, im in values]
    return np.array(values, dtype=host_dtype(entry["dtype"])).reshape(entry["shape"])


def assert_bitwise_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert actual.tobytes() == expected.tobytes()  # also tells -0.0 from 0.0 and compares NaNs


def zip_members(path: Path) -> dict:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def write_zip(path: Path, members: dict, compression=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def rewrite_members(src: Path, dst: Path, changes: dict) -> Path:
    """Copy a .pt zip, replacing members named by their path after the archive folder.

    A value of None drops the member.
    """
    members = {}
    for name, data in zip_members(src).items():
        data = changes.get(name.split("/", 1)[1], data)
        if data is not None:
            members[name] = data
    return write_zip(dst, members)


def pickled_pt(path: Path, obj, protocol: int = 2) -> Path:
    """A .pt-shaped zip whose data.pkl is ``pickle.dumps(obj)``."""
    return write_zip(path, {"archive/data.pkl": pickle.dumps(obj, protocol=protocol),
                            "archive/byteorder": b"little", "archive/version": b"3\n",
                            "archive/data/0": b"\0" * 16})


# ----------------------------------------------------------------------------------------------
# Real torch.save fixtures


@pytest.mark.parametrize("name", sorted(EXPECTED["files"]))
def test_fixture_reads_back_exactly(name):
    entry = EXPECTED["files"][name]
    array = load_tensor(PT_DIR / name)
    assert_bitwise_equal(array, expected_array(entry))
    assert array.flags.c_contiguous and array.flags.writeable
    assert source_dtype(PT_DIR / name) == entry["dtype"]


def _mapped(array) -> bool:
    while array is not None and not hasattr(array, "_mmap"):
        array = getattr(array, "base", None)
    return array is not None


@pytest.mark.parametrize("name", sorted(EXPECTED["files"]))
def test_open_tensor_maps_real_torch_files_and_reads_the_same_values(name):
    array, raw_bf16 = open_tensor(PT_DIR / name)
    values = widen_bf16(array) if raw_bf16 else np.asarray(array)
    assert_bitwise_equal(values, load_tensor(PT_DIR / name))
    entry = EXPECTED["files"][name]
    if entry["dtype"] != "bool" and 0 not in entry["shape"]:    # empty storages are not mapped
        assert raw_bf16 == (entry["dtype"] == "bfloat16")
        assert _mapped(array) and not array.flags.writeable


def test_open_tensor_reads_a_compressed_member_into_memory(tmp_path):
    src = PT_DIR / "dtype_float32.pt"
    dst = write_zip(tmp_path / "c.pt", zip_members(src), compression=zipfile.ZIP_DEFLATED)
    array, raw = open_tensor(dst)
    assert not raw and not _mapped(array)
    assert_bitwise_equal(array, load_tensor(src))


def test_open_tensor_refuses_a_storage_shorter_than_the_pickle_says(tmp_path):
    src = PT_DIR / "dtype_float32.pt"
    short = rewrite_members(src, tmp_path / "s.pt", {"data/0": zip_members(src)[
        next(n for n in zip_members(src) if n.endswith("/data/0"))][:4]})
    with pytest.raises(TensorReadError, match="the pickle declares"):
        open_tensor(short)


def test_fixtures_cover_every_dtype_and_odd_shape():
    entries = EXPECTED["files"].values()
    assert {e["dtype"] for e in entries} == set(ALL_DTYPES)
    assert any(e["shape"] == [] for e in entries)
    assert any(0 in e["shape"] for e in entries)


@pytest.mark.parametrize("name", sorted(EXPECTED["refused"]))
def test_unsupported_torch_dtype_is_refused_by_name(name):
    with pytest.raises(TensorReadError, match=EXPECTED["refused"][name]):
        load_tensor(PT_DIR / name)


def test_bfloat16_fixture_is_widened_to_float32():
    assert source_dtype(PT_DIR / "dtype_bfloat16.pt") == "bfloat16"
    assert load_tensor(PT_DIR / "dtype_bfloat16.pt").dtype == np.float32


# ----------------------------------------------------------------------------------------------
# Real msprobe dump


def tensor_leaves(node):
    """Every dump.json leaf that names a tensor file."""
    if isinstance(node, dict):
        if "data_name" in node:
            yield node
        for value in node.values():
            yield from tensor_leaves(value)
    elif isinstance(node, list):
        for value in node:
            yield from tensor_leaves(value)


def sample_leaves():
    dump = json.loads((SAMPLE_DIR / "dump.json").read_text())
    present = {p.name for p in (SAMPLE_DIR / "dump_tensor_data").glob("*.pt")}
    leaves = {leaf["data_name"]: leaf for leaf in tensor_leaves(dump["data"])
              if leaf["data_name"] in present}
    return dump["dump_data_dir"], leaves


def test_msprobe_sample_has_three_tensor_files():
    _, leaves = sample_leaves()
    assert len(leaves) == 3


@pytest.mark.parametrize("data_name", sorted(sample_leaves()[1]))
def test_msprobe_sample_matches_recorded_statistics(data_name):
    dump_data_dir, leaves = sample_leaves()
    leaf = leaves[data_name]
    path = resolve_data_file(SAMPLE_DIR, data_name, dump_data_dir)
    array = load_tensor(path)
    assert "torch." + source_dtype(path) == leaf["dtype"]
    assert list(array.shape) == leaf["shape"]
    wide = array.astype(np.float64)
    assert float(array.max()) == leaf["Max"]
    assert float(array.min()) == leaf["Min"]
    # msprobe computes Mean and Norm in float32 on the torch side.
    assert wide.mean() == pytest.approx(leaf["Mean"], rel=1e-5, abs=1e-12)
    assert float(np.linalg.norm(wide)) == pytest.approx(leaf["Norm"], rel=1e-5)


# ----------------------------------------------------------------------------------------------
# save_pt


def sample_values(dtype: str, shape: tuple) -> np.ndarray:
    """Values every dtype holds exactly (bf16 included), with negatives where the dtype has them."""
    count = math.prod(shape)
    ramp = np.arange(count, dtype=np.float64) - count // 2
    if dtype == "bool":
        return (ramp.reshape(shape) % 3) == 0
    if dtype.startswith("uint"):
        ramp = ramp - ramp.min() if count else ramp
    values = ramp.reshape(shape).astype(host_dtype(dtype))
    if dtype.startswith(("float", "bfloat", "complex")):
        values = values * 0.5
    if dtype.startswith("complex"):
        values = values + 1j * values[::-1] if values.ndim else values + 1j
    return values


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_save_pt_round_trips(tmp_path, dtype, shape):
    values = sample_values(dtype, shape)
    path = tmp_path / "t.pt"
    save_pt(path, values, dtype)
    assert_bitwise_equal(load_tensor(path), values.astype(host_dtype(dtype)))
    assert source_dtype(path) == dtype


def test_save_pt_takes_dtype_from_array(tmp_path):
    save_pt(tmp_path / "i.pt", np.array([[1, -2]], dtype=np.int16))
    assert source_dtype(tmp_path / "i.pt") == "int16"
    assert_bitwise_equal(load_tensor(tmp_path / "i.pt"), np.array([[1, -2]], dtype=np.int16))


def test_save_pt_rejects_unknown_dtype(tmp_path):
    with pytest.raises(ValueError, match="unsupported dtype"):
        save_pt(tmp_path / "x.pt", np.zeros(2), "float8_e4m3fn")
    with pytest.raises(ValueError, match="unsupported dtype"):
        save_pt(tmp_path / "x.pt", np.array(["a"]))


def test_save_pt_mirrors_torch_layout(tmp_path):
    path = tmp_path / "Module.a.Linear.forward.0.output.0.pt"
    save_pt(path, np.ones((2, 3), dtype=np.float32))
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert {n.split("/", 1)[0] for n in names} == {"Module.a.Linear.forward.0.output.0"}
        short = {n.split("/", 1)[1]: zf.read(n) for n in names}
        assert short["byteorder"] == b"little" and short["version"] == b"3\n"
        assert len(short["data/0"]) == 24
        assert all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())
    raw = path.read_bytes()
    for info in zipfile.ZipFile(path).infolist():
        start = info.header_offset
        name_len, extra_len = struct.unpack("<HH", raw[start + 26:start + 30])
        assert (start + 30 + name_len + extra_len) % 64 == 0, info.filename
    assert pickle_globals(short["data.pkl"]) == {"torch._utils _rebuild_tensor_v2",
                                                 "torch FloatStorage", "collections OrderedDict"}


def pickle_globals(data: bytes) -> set:
    return {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


BF16_CASES = [  # float32 bits -> bfloat16 bits, round to nearest even
    (0x3F800000, 0x3F80),  # 1.0
    (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, kept part even, stays
    (0x3F818000, 0x3F82),  # 1 + 3*2^-8: a tie, kept part odd, rounds up
    (0x3F808001, 0x3F81),  # just above the tie
    (0x3F807FFF, 0x3F80),  # just below the tie
    (0x7F7FFFFF, 0x7F80),  # float32 max rounds to infinity, as in torch
    (0x80000000, 0x8000),  # -0.0
    (0xFF800000, 0xFF80),  # -inf
    (0x7FC00000, 0x7FC0),  # NaN
    (0x7FFFFFFF, 0x7FC0),  # NaN whose rounding would carry into the sign bit
    (0x00000001, 0x0000),  # smallest subnormal rounds to zero
]


def test_bfloat16_rounds_to_nearest_even(tmp_path):
    floats = np.array([c[0] for c in BF16_CASES], dtype=np.uint32).view(np.float32)
    save_pt(tmp_path / "b.pt", floats, "bfloat16")
    storage = next(v for k, v in zip_members(tmp_path / "b.pt").items() if k.endswith("/data/0"))
    assert np.frombuffer(storage, "<u2").tolist() == [c[1] for c in BF16_CASES]
    widened = load_tensor(tmp_path / "b.pt")
    assert widened.view(np.uint32).tolist() == [c[1] << 16 for c in BF16_CASES]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_save_pt_is_read_by_real_torch(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    for shape in SHAPES:
        values = sample_values(dtype, shape)
        save_pt(tmp_path / "t.pt", values, dtype)
        tensor = torch.load(tmp_path / "t.pt", weights_only=True)
        assert tensor.dtype == getattr(torch, dtype) and tuple(tensor.shape) == shape
        back = tensor.float().numpy() if dtype == "bfloat16" else tensor.numpy()
        assert_bitwise_equal(back, values.astype(host_dtype(dtype)))


def test_save_pt_bfloat16_matches_torch_rounding(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    floats = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    floats = floats[~np.isnan(floats)]  # torch's NaN bits depend on its code path
    save_pt(tmp_path / "b.pt", floats, "bfloat16")
    ours = torch.load(tmp_path / "b.pt", weights_only=True)
    theirs = torch.from_numpy(floats).to(torch.bfloat16)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


# ----------------------------------------------------------------------------------------------
# Hostile pickles


class OpenFile:
    """Pickles into 'call open(target, "w")': plain pickle.load would create the file."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return open, (self.target, "w")


class RunShell:
    """Pickles into 'call os.system("touch target")'."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {self.target}",)


def test_hostile_payload_really_creates_a_file_with_plain_pickle(tmp_path):
    target = tmp_path / "created_by_plain_pickle"
    pickle.loads(pickle.dumps(OpenFile(target), protocol=2)).close()
    assert target.exists()


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("payload, global_name",
                         [(OpenFile, "io.open"), (RunShell, "posix.system")])
@pytest.mark.parametrize("wrap", [lambda x: x, lambda x: {"weight": x}, lambda x: [1, (x,)]],
                         ids=["top", "in_dict", "nested"])
def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path, protocol, payload, global_name, wrap):
    target = tmp_path / "pwned"
    path = pickled_pt(tmp_path / "evil.pt", wrap(payload(target)), protocol)
    for read in (load_tensor, source_dtype):
        with pytest.raises(TensorReadError, match=f"refused pickle global {global_name}") as err:
            read(path)
        assert str(path) in str(err.value)
    assert not target.exists()


def test_hostile_object_npy_is_refused(tmp_path):
    target = tmp_path / "pwned"
    np.save(tmp_path / "evil.npy", np.array([OpenFile(target)], dtype=object), allow_pickle=True)
    for mmap in (False, True):
        with pytest.raises(TensorReadError, match="evil.npy"):
            load_tensor(tmp_path / "evil.npy", mmap=mmap)
    assert not target.exists()


def test_non_tensor_pickle_content_is_refused(tmp_path):
    for i, obj in enumerate([{"a": 1}, 42, [], {"nested": {"a": 1}}]):
        with pytest.raises(TensorReadError, match="not a tensor"):
            load_tensor(pickled_pt(tmp_path / f"p{i}.pt", obj))


# ----------------------------------------------------------------------------------------------
# Locating leaf files


@pytest.fixture
def dump_dir(tmp_path):
    """tmp/dump/ holding dump.json's neighbours, and tmp/outside/ with a secret beyond it."""
    dump = tmp_path / "dump"
    (dump / "dump_tensor_data").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.pt").write_bytes(b"secret")
    (tmp_path / "secret.pt").write_bytes(b"secret")
    return dump


def test_resolves_recorded_folder_then_dump_tensor_data_then_root(dump_dir):
    recorded = "./out/llama_L0_tensor/step0/proc8294/my_tensors"
    for folder in ("", "dump_tensor_data", "my_tensors"):
        (dump_dir / folder).mkdir(exist_ok=True)
        (dump_dir / folder / "a.pt").write_bytes(b"x")
        assert resolve_data_file(dump_dir, "a.pt", recorded) == dump_dir / folder / "a.pt"
    assert resolve_data_file(dump_dir, "a.pt", None) == (dump_dir / "dump_tensor_data" / "a.pt")


@pytest.mark.parametrize("recorded", ["C:\\dumps\\rank0\\my_tensors", "/abs/my_tensors/",
                                      "my_tensors"])
def test_only_last_folder_name_of_recorded_dir_is_used(dump_dir, recorded):
    (dump_dir / "my_tensors").mkdir()
    (dump_dir / "my_tensors" / "a.pt").write_bytes(b"x")
    assert resolve_data_file(dump_dir, "a.pt", recorded) == dump_dir / "my_tensors" / "a.pt"


def test_recorded_absolute_dir_never_leads_outside(dump_dir, tmp_path):
    # /etc/passwd exists on this machine, but only dump/etc/passwd may be used.
    with pytest.raises(TensorReadError, match="not found"):
        resolve_data_file(dump_dir, "passwd", "/etc")
    with pytest.raises(TensorReadError, match="not found"):
        resolve_data_file(dump_dir, "secret.pt", str(tmp_path / "outside"))
    (dump_dir / "etc").mkdir()
    (dump_dir / "etc" / "passwd").write_bytes(b"inside")
    assert resolve_data_file(dump_dir, "passwd", "/etc") == dump_dir / "etc" / "passwd"


@pytest.mark.parametrize("recorded", ["..", "/a/b/..", "/", ".", ""])
def test_recorded_dir_without_usable_name_is_ignored(dump_dir, recorded):
    (dump_dir / "dump_tensor_data" / "a.pt").write_bytes(b"x")
    (dump_dir.parent / "a.pt").write_bytes(b"outside")
    assert resolve_data_file(dump_dir, "a.pt", recorded) == dump_dir / "dump_tensor_data" / "a.pt"


@pytest.mark.parametrize("data_name", ["../secret.pt", "dump_tensor_data/../../secret.pt",
                                       "../outside/secret.pt", "a/../../secret.pt"])
def test_dotdot_data_name_is_refused(dump_dir, data_name):
    with pytest.raises(TensorReadError, match=r"'\.\.'"):
        resolve_data_file(dump_dir, data_name, None)


def test_absolute_and_odd_data_names_are_refused(dump_dir, tmp_path):
    with pytest.raises(TensorReadError, match="absolute"):
        resolve_data_file(dump_dir, str(tmp_path / "outside" / "secret.pt"), None)
    for bad in ("..\\secret.pt", "a\x00.pt", "", None):
        with pytest.raises(TensorReadError):
            resolve_data_file(dump_dir, bad, None)


def test_symlink_to_outside_is_refused(dump_dir, tmp_path):
    (dump_dir / "dump_tensor_data" / "leak.pt").symlink_to(tmp_path / "outside" / "secret.pt")
    with pytest.raises(TensorReadError, match="outside the dump folder"):
        resolve_data_file(dump_dir, "leak.pt", None)
    (dump_dir / "dangling.pt").symlink_to(tmp_path / "outside" / "missing.pt")
    with pytest.raises(TensorReadError, match="outside the dump folder"):
        resolve_data_file(dump_dir, "dangling.pt", None)


def test_symlinked_folder_to_outside_is_refused(dump_dir, tmp_path):
    (dump_dir / "linked").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(TensorReadError, match="outside the dump folder"):
        resolve_data_file(dump_dir, "secret.pt", "/x/linked")
    with pytest.raises(TensorReadError, match="outside the dump folder"):
        resolve_data_file(dump_dir, "linked/secret.pt", None)


def test_symlink_inside_dump_dir_is_followed(dump_dir):
    (dump_dir / "real.pt").write_bytes(b"x")
    (dump_dir / "dump_tensor_data" / "alias.pt").symlink_to(dump_dir / "real.pt")
    assert resolve_data_file(dump_dir, "alias.pt", None) == dump_dir / "real.pt"


def test_symlinked_dump_dir_itself_is_fine(dump_dir, tmp_path):
    (dump_dir / "dump_tensor_data" / "a.pt").write_bytes(b"x")
    (tmp_path / "alias").symlink_to(dump_dir, target_is_directory=True)
    found = resolve_data_file(tmp_path / "alias", "a.pt", None)
    assert found == dump_dir / "dump_tensor_data" / "a.pt"


def test_not_found_lists_where_it_looked(dump_dir):
    with pytest.raises(TensorReadError, match="not found") as err:
        resolve_data_file(dump_dir, "nope.pt", "/x/y/tensors")
    message = str(err.value)
    assert message.startswith("nope.pt: ") and "\n" not in message
    for folder in ("tensors", "dump_tensor_data"):
        assert str(dump_dir.resolve() / folder / "nope.pt") in message


def test_directory_is_not_a_tensor_file(dump_dir):
    (dump_dir / "dump_tensor_data" / "d.pt").mkdir()
    with pytest.raises(TensorReadError, match="not found"):
        resolve_data_file(dump_dir, "d.pt", None)


# ----------------------------------------------------------------------------------------------
# Corrupt, truncated and odd files


@pytest.fixture
def good_pt(tmp_path):
    path = tmp_path / "good.pt"
    save_pt(path, np.arange(100, dtype=np.float32).reshape(10, 10))
    return path


def assert_read_error(path, pattern=None):
    for read in (load_tensor, source_dtype):
        with pytest.raises(TensorReadError, match=pattern) as err:
            read(path)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and "\n" not in message


def test_truncated_pt_is_a_read_error_wherever_cut(good_pt, tmp_path):
    raw = good_pt.read_bytes()
    cut = tmp_path / "cut.pt"
    for size in list(range(0, len(raw), 29)) + [len(raw) // 2, len(raw) - 1]:
        cut.write_bytes(raw[:size])
        assert_read_error(cut)


def test_missing_storage_member(good_pt, tmp_path):
    path = rewrite_members(good_pt, tmp_path / "m.pt", {"data/0": None})
    with pytest.raises(TensorReadError, match="missing zip member .*data/0"):
        load_tensor(path)
    assert source_dtype(path) == "float32"  # it reads the pickle only


def test_storage_shorter_than_declared(good_pt, tmp_path):
    path = rewrite_members(good_pt, tmp_path / "short.pt", {"data/0": b"\0" * 200})
    with pytest.raises(TensorReadError, match="holds 200 bytes, the pickle declares 400"):
        load_tensor(path)


def test_corrupt_pickle(good_pt, tmp_path):
    members = zip_members(good_pt)
    pkl = next(k for k in members if k.endswith("data.pkl"))
    assert_read_error(rewrite_members(good_pt, tmp_path / "p.pt", {"data.pkl": members[pkl][:30]}))


@pytest.mark.parametrize("content", [b"", b"garbage bytes, not a tensor" * 10,
                                     b"PK\x03\x04" + bytes(range(256)) * 4,
                                     pickle.dumps(np.int64(3))],
                         ids=["empty", "text", "fake_zip", "bare_pickle"])
def test_garbage_files(tmp_path, content):
    path = tmp_path / "g.pt"
    path.write_bytes(content)
    assert_read_error(path)


def test_missing_file(tmp_path):
    assert_read_error(tmp_path / "absent.pt", "cannot read")


def test_zip_without_torch_layout(tmp_path):
    assert_read_error(write_zip(tmp_path / "z.pt", {"readme.txt": b"hi"}),
                      "not a torch.save archive")


def test_tensor_reaching_past_its_storage(good_pt, tmp_path):
    members = zip_members(good_pt)
    pkl_name = next(k for k in members if k.endswith("data.pkl"))
    stride_10_1 = b"(K\nK\x01t"
    assert members[pkl_name].count(stride_10_1) == 1
    bad = members[pkl_name].replace(stride_10_1, b"(K\x0bK\x01t")
    path = rewrite_members(good_pt, tmp_path / "far.pt", {"data.pkl": bad})
    with pytest.raises(TensorReadError, match="reaches element 108 of a storage holding 100"):
        load_tensor(path)


def test_tiny_file_cannot_demand_huge_memory(good_pt, tmp_path):
    members = zip_members(good_pt)
    pkl_name = next(k for k in members if k.endswith("data.pkl"))
    geometry = b"(K\nK\nt(K\nK\x01t"
    huge = b"(" + struct.pack("<ci", b"J", 100000) * 2 + b"t(K\x00K\x00t"
    assert members[pkl_name].count(geometry) == 1
    path = rewrite_members(good_pt, tmp_path / "huge.pt",
                           {"data.pkl": members[pkl_name].replace(geometry, huge)})
    with pytest.raises(TensorReadError, match="too large"):
        load_tensor(path)


def test_compressed_bomb_member_is_refused(tmp_path):
    big = tmp_path / "big.pt"
    save_pt(big, np.zeros(2_000_000, dtype=np.float32))
    bomb = write_zip(tmp_path / "bomb.pt", zip_members(big), zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(TensorReadError, match="more than the file"):
        load_tensor(bomb)


def test_big_endian_pt_is_byteswapped(tmp_path):
    for dtype, values in (("float32", np.array([1.5, -2.25, 3e38], dtype=np.float32)),
                          ("int64", np.array([-2**62, 1, 7], dtype=np.int64)),
                          ("bfloat16", np.array([1.5, -2.25, 0.0], dtype=np.float32))):
        little = tmp_path / f"{dtype}.pt"
        save_pt(little, values, dtype)
        storage = next(v for k, v in zip_members(little).items() if k.endswith("/data/0"))
        width = 2 if dtype == "bfloat16" else values.itemsize
        swapped = np.frombuffer(storage, f"<u{width}").byteswap().tobytes()
        big = rewrite_members(little, tmp_path / f"{dtype}_big.pt",
                              {"byteorder": b"big", "data/0": swapped})
        assert_bitwise_equal(load_tensor(big), values)


def test_missing_byteorder_means_little_endian(good_pt, tmp_path):
    path = rewrite_members(good_pt, tmp_path / "old.pt", {"byteorder": None})
    assert_bitwise_equal(load_tensor(path), load_tensor(good_pt))


def test_unknown_byteorder_is_refused(good_pt, tmp_path):
    assert_read_error(rewrite_members(good_pt, tmp_path / "o.pt", {"byteorder": b"middle"}),
                      "byteorder")


# ----------------------------------------------------------------------------------------------
# .npy


def test_npy_reads_by_content_with_optional_mmap(tmp_path):
    values = np.arange(12, dtype=np.float16).reshape(3, 4)
    np.save(tmp_path / "v.npy", values)
    assert_bitwise_equal(load_tensor(tmp_path / "v.npy"), values)
    mapped = load_tensor(tmp_path / "v.npy", mmap=True)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    assert_bitwise_equal(np.asarray(mapped), values)
    (tmp_path / "v.npy").rename(tmp_path / "named_like_torch.pt")
    assert_bitwise_equal(load_tensor(tmp_path / "named_like_torch.pt"), values)
    assert source_dtype(tmp_path / "named_like_torch.pt") == "float16"


def test_big_endian_npy_comes_back_native(tmp_path):
    values = np.array([1.25, -3.5], dtype=">f8")
    np.save(tmp_path / "be.npy", values)
    array = load_tensor(tmp_path / "be.npy")
    assert array.dtype == np.float64 and array.dtype.isnative
    assert array.tolist() == [1.25, -3.5]


def test_string_npy_is_refused(tmp_path):
    np.save(tmp_path / "s.npy", np.array(["abc", "d"]))
    assert_read_error(tmp_path / "s.npy", "unsupported .npy dtype")
