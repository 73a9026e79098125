"""Read the tensor files of msprobe dumps without torch.

msprobe stores every dumped tensor with ``torch.save``: a zip archive holding a pickle
(``<archive>/data.pkl``) that describes the tensor and one raw byte member per storage
(``<archive>/data/<key>``). Dumps come from other people's machines, so nothing here may run code
from a file: the pickle is replayed by an unpickler that knows only the few globals a saved tensor
refers to, each mapped to a local stand-in, and every size the pickle declares is checked against
the bytes really present before anything is read. ``.npy`` files are read with pickles disabled.
"""
from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from .containment import LeadsOutside, resolve_within

__all__ = ["TensorReadError", "TensorInfo", "resolve_data_file", "load_pt_tree", "load_tensor", "load_pt_dict",
           "open_tensor", "widen_bf16", "bfloat16_bits"]

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
# A tensor may repeat storage elements through zero strides (expand()); cap how far that can
# inflate memory so that a tiny hostile file cannot demand gigabytes.
_MAX_INFLATED_BYTES = 1 << 30
_MAX_MESSAGE = 400


class TensorReadError(Exception):
    """A tensor file could not be located or read safely.

    The message is a single line, ``"<file>: <problem>"``; ``file`` and ``problem`` are also kept
    as attributes.
    """

    def __init__(self, file, problem: str):
        self.file = _one_line(str(file))
        self.problem = _one_line(str(problem))
        super().__init__(f"{self.file}: {self.problem}")


class _FormatError(Exception):
    """Something in a file's content is malformed or not allowed; _read_guarded adds the file name."""


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# ----------------------------------------------------------------------------------------------
# dtypes


@dataclass(frozen=True, slots=True)
class _DType:
    """A torch dtype as stored on disk."""

    name: str  # torch's short name, e.g. "bfloat16"
    code: str  # numpy type code of one stored element, byte order left out
    storage_class: str | None  # torch's typed-storage class; None: torch saves it untyped (v3)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.code).itemsize


# numpy has no bfloat16: its raw bits travel as uint16 and are widened to float32 on load.
_DTYPES = {d.name: d for d in (
    _DType("float64", "f8", "DoubleStorage"),
    _DType("float32", "f4", "FloatStorage"),
    _DType("float16", "f2", "HalfStorage"),
    _DType("bfloat16", "u2", "BFloat16Storage"),
    _DType("complex128", "c16", "ComplexDoubleStorage"),
    _DType("complex64", "c8", "ComplexFloatStorage"),
    _DType("int64", "i8", "LongStorage"),
    _DType("int32", "i4", "IntStorage"),
    _DType("int16", "i2", "ShortStorage"),
    _DType("int8", "i1", "CharStorage"),
    _DType("uint8", "u1", "ByteStorage"),
    _DType("bool", "?", "BoolStorage"),
    _DType("uint16", "u2", None),
    _DType("uint32", "u4", None),
    _DType("uint64", "u8", None),
)}


# ----------------------------------------------------------------------------------------------
# Stand-ins the restricted unpickler hands out instead of torch objects. Frozen with slots, so a
# hostile pickle cannot alter them with BUILD after they were checked.


@dataclass(frozen=True, slots=True)
class _StorageType:
    """Stands for a storage class global such as ``torch.FloatStorage``."""

    dtype: _DType | None  # None: torch.UntypedStorage, plain bytes


@dataclass(frozen=True, slots=True)
class _DTypeTag:
    """Stands for a dtype global such as ``torch.uint16`` (passed to _rebuild_tensor_v3)."""

    dtype: _DType


@dataclass(frozen=True, slots=True)
class _StorageRef:
    """A storage the pickle refers to; its bytes stay in the zip until a tensor needs them."""

    key: str
    dtype: _DType | None
    nbytes: int


@dataclass(frozen=True, slots=True)
class _TensorRef:
    """A tensor as the pickle describes it: a checked window onto one storage."""

    storage: _StorageRef
    offset: int
    size: tuple
    stride: tuple
    dtype: _DType


def _is_count(value) -> bool:
    return type(value) is int and value >= 0  # bool is an int subclass but never a valid count


def _is_shape(value) -> bool:
    return isinstance(value, tuple) and all(_is_count(v) for v in value)


def _tensor_ref(storage, offset, size, stride, dtype: _DType) -> _TensorRef:
    """Check a tensor's geometry against its storage, so that reading it stays in bounds."""
    if not isinstance(storage, _StorageRef):
        raise _FormatError("tensor rebuilt from something that is not a storage")
    geometry_ok = _is_count(offset) and _is_shape(size) and _is_shape(stride)
    if not geometry_ok or len(size) != len(stride):
        raise _FormatError(f"bad tensor geometry offset={offset!r} size={size!r} stride={stride!r}")
    if storage.nbytes % dtype.itemsize:
        raise _FormatError(f"storage of {storage.nbytes} bytes does not hold whole "
                           f"{dtype.name} elements")
    stored = storage.nbytes // dtype.itemsize
    count = math.prod(size)
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= stored:
            raise _FormatError(f"tensor reaches element {last} of a storage holding {stored}")
        if count > stored and count * dtype.itemsize > _MAX_INFLATED_BYTES:
            raise _FormatError(f"tensor of {count} elements repeats a storage of {stored}: "
                               "too large")
    return _TensorRef(storage, offset, size, stride, dtype)


# Signatures follow the calls torch.save records; gradient flags and hooks do not affect values.
def _rebuild_tensor(storage, storage_offset, size, stride):
    if not isinstance(storage, _StorageRef) or storage.dtype is None:
        raise _FormatError("tensor rebuilt from something that is not a typed storage")
    return _tensor_ref(storage, storage_offset, size, stride, storage.dtype)


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
    return _rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
    if not isinstance(dtype, _DTypeTag):
        raise _FormatError(f"tensor dtype is not a known torch dtype: {dtype!r}")
    return _tensor_ref(storage, storage_offset, size, stride, dtype.dtype)


def _rebuild_parameter(data, requires_grad, backward_hooks):
    if not isinstance(data, _TensorRef):
        raise _FormatError("parameter wraps something that is not a tensor")
    return data


def _allowed_globals() -> dict:
    table = {
        ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        # Holds the (empty) backward hooks and whole state dicts; building one runs no file code.
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "UntypedStorage"): _StorageType(None),
        ("torch.storage", "UntypedStorage"): _StorageType(None),
    }
    for dtype in _DTYPES.values():
        table[("torch", dtype.name)] = _DTypeTag(dtype)
        if dtype.storage_class:
            table[("torch", dtype.storage_class)] = _StorageType(dtype)
    return table


_ALLOWED_GLOBALS = _allowed_globals()


class _RestrictedUnpickler(pickle.Unpickler):
    """Replays a torch ``data.pkl`` with stand-ins; refuses every global a tensor does not need."""

    def find_class(self, module, name):
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise _FormatError(f"refused pickle global {module}.{name}") from None

    def persistent_load(self, pid):
        # torch records a storage as ('storage', storage class, key, location, numel); the
        # location (cpu, cuda:0, npu:0) is irrelevant here since all data is read to host memory.
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _FormatError(f"unexpected persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        if not (isinstance(kind, _StorageType) and isinstance(key, str) and _is_count(numel)):
            raise _FormatError(f"malformed storage record {pid!r}")
        itemsize = kind.dtype.itemsize if kind.dtype else 1  # untyped storages count bytes
        return _StorageRef(key, kind.dtype, numel * itemsize)


# ----------------------------------------------------------------------------------------------
# Reading


class _PtArchive:
    """An open torch zip archive; every member's size is checked before the member is read."""

    def __init__(self, zf: zipfile.ZipFile, file_size: int):
        self._zf = zf
        self._file_size = file_size
        self._prefix = self._find_prefix()
        self._byte_order = self._read_byte_order()

    def _find_prefix(self) -> str:
        pickles = [n for n in self._zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise _FormatError("zip file is not a torch.save archive "
                               "(no single <archive>/data.pkl)")
        return pickles[0][: -len("data.pkl")]

    def _read(self, name: str, expected_size: int | None = None) -> bytes:
        try:
            info = self._zf.getinfo(name)
        except KeyError:
            raise _FormatError(f"missing zip member {name}") from None
        # Bounding by the file size also defeats compressed members that would inflate hugely.
        if info.file_size > self._file_size:
            raise _FormatError(f"zip member {name} claims {info.file_size} bytes, "
                               "more than the file")
        if expected_size is not None and info.file_size != expected_size:
            raise _FormatError(f"zip member {name} holds {info.file_size} bytes, "
                               f"the pickle declares {expected_size}")
        return self._zf.read(info)

    def _read_byte_order(self) -> str:
        name = self._prefix + "byteorder"
        if name not in self._zf.namelist():
            return "<"  # torch versions that did not record it only ran on little-endian hosts
        order = self._read(name).strip()
        if order in (b"little", b"big"):
            return "<" if order == b"little" else ">"
        raise _FormatError(f"unknown byteorder {order[:20]!r}")

    def top_object(self):
        """The unpickled content of data.pkl, tensors as _TensorRef."""
        return _RestrictedUnpickler(io.BytesIO(self._read(self._prefix + "data.pkl"))).load()

    def mapped(self, path: Path, ref: _TensorRef) -> np.ndarray | None:
        """A read-only memory map of a tensor's elements in the file (bf16 still raw), or None
        when the member is compressed, big-endian or bool (then read it with :meth:`values`)."""
        name = f"{self._prefix}data/{ref.storage.key}"
        try:
            info = self._zf.getinfo(name)
        except KeyError:
            raise _FormatError(f"missing zip member {name}") from None
        if info.compress_type != zipfile.ZIP_STORED or self._byte_order != "<" or ref.dtype.name == "bool":
            return None
        if info.file_size != ref.storage.nbytes:
            raise _FormatError(f"zip member {name} holds {info.file_size} bytes, "
                               f"the pickle declares {ref.storage.nbytes}")
        with open(path, "rb") as fh:
            fh.seek(info.header_offset)
            header = fh.read(30)
        if len(header) != 30 or header[:4] != _ZIP_MAGIC:
            raise _FormatError(f"zip member {name}: bad local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if start + info.file_size > self._file_size:
            raise _FormatError(f"zip member {name} runs past the end of the file")
        if not info.file_size:
            return None
        storage = np.memmap(path, dtype=np.dtype(ref.dtype.code), mode="r", offset=start,
                            shape=(info.file_size // ref.dtype.itemsize,))
        return np.lib.stride_tricks.as_strided(
            storage[ref.offset:], shape=ref.size,
            strides=tuple(x * storage.itemsize for x in ref.stride), writeable=False)

    def values(self, ref: _TensorRef) -> np.ndarray:
        """A tensor's elements as a new C-contiguous array in native byte order (bf16 still raw)."""
        raw = self._read(f"{self._prefix}data/{ref.storage.key}", ref.storage.nbytes)
        storage = np.frombuffer(raw, dtype=np.dtype(ref.dtype.code).newbyteorder(self._byte_order))
        view = np.lib.stride_tricks.as_strided(
            storage[ref.offset:], shape=ref.size,
            strides=tuple(s * storage.itemsize for s in ref.stride), writeable=False)
        return view.astype(storage.dtype.newbyteorder("="), order="C")


def _single_tensor(obj) -> _TensorRef:
    """The tensor a file holds: the object itself, the ``value`` of an SGLang dumper record
    (``{"value": tensor, "meta": {...}}``), or the first of a flat list/dict of tensors."""
    if isinstance(obj, _TensorRef):
        return obj
    if isinstance(obj, dict) and isinstance(obj.get("value"), _TensorRef) and isinstance(obj.get("meta"), dict):
        return obj["value"]
    items = list(obj.values()) if isinstance(obj, dict) else obj
    if isinstance(items, (list, tuple)) and items and all(isinstance(i, _TensorRef) for i in items):
        return items[0]
    raise _FormatError(f"holds a {type(obj).__name__}, not a tensor or a flat list/dict of tensors")


def _to_host_dtype(values: np.ndarray, dtype: _DType) -> np.ndarray:
    # In-place and astype operations keep 0-d arrays arrays; operators would make numpy scalars.
    if dtype.name == "bfloat16":
        return widen_bf16(values)
    if dtype.name == "bool":
        return values.view(np.uint8).astype(bool)  # any nonzero byte reads as True, as in torch
    return values


def _load_npy(path: Path, mmap: bool) -> np.ndarray:
    array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    if array.dtype.kind not in "biufc":
        raise _FormatError(f"unsupported .npy dtype {array.dtype}")
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _describe(exc: Exception) -> str:
    if isinstance(exc, _FormatError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot read: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


def _read_guarded(path, on_npy, on_pt, pick=_single_tensor):
    """Open ``path`` by its content, not its suffix, and turn any failure into TensorReadError.

    ``pick`` chooses what ``on_pt`` receives from the unpickled object (by default its tensor)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(_NPY_MAGIC))
        if magic == _NPY_MAGIC:
            return on_npy(path)
        if not magic.startswith(_ZIP_MAGIC):
            raise _FormatError("neither a torch zip archive nor .npy "
                               "(the legacy pre-1.6 torch.save format is not supported)")
        with zipfile.ZipFile(path) as zf:
            archive = _PtArchive(zf, path.stat().st_size)
            return on_pt(archive, pick(archive.top_object()))
    except Exception as exc:  # a corrupt or hostile file may fail anywhere; callers get one type
        raise TensorReadError(path, _describe(exc)) from exc


def open_tensor(path: Path) -> tuple[np.ndarray, bool]:
    """Open a tensor file (torch.save zip ``.pt`` or ``.npy``) for reading in blocks: ``(array, raw_bf16)``.

    The format is recognised from the content. ``.pt`` files are decoded without running any code
    from the file; a file holding a flat list or dict of tensors yields its first tensor. ``.npy``
    files are loaded with pickles disabled; only bool/int/uint/float/complex dtypes are accepted.
    ``.npy`` files and uncompressed ``.pt`` storages are memory-mapped, so only what is read is
    loaded; a bfloat16 tensor comes back as its raw uint16 bits with ``raw_bf16`` True (widen
    what you read with :func:`widen_bf16`). Other ``.pt`` tensors are read into memory in their
    stored dtype (bfloat16 widened exactly to float32).
    Raises TensorReadError (one line naming the file) for anything unreadable, corrupt or unsafe.
    """
    def on_pt(archive, ref):
        arr = archive.mapped(Path(path), ref)
        if arr is None:
            return _to_host_dtype(archive.values(ref), ref.dtype), False
        return arr, ref.dtype.name == "bfloat16"

    return _read_guarded(path, lambda p: (_load_npy(p, True), False), on_pt)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A tensor inside an object read by :func:`load_pt_tree`: its dtype and shape, not its data."""

    dtype: str  # torch short name, e.g. "bfloat16"
    shape: tuple[int, ...]


# Plain values a record may hold beside its tensors (the SGLang dumper's meta dictionary).
_PLAIN = (str, int, float, bool, type(None), bytes)
_MAX_TREE_ITEMS = 100_000


def _plain_tree(obj):
    """``obj`` with tensors as TensorInfo; refuses anything but dicts, lists, tuples and plain values."""
    seen = 0

    def walk(o, depth):
        nonlocal seen
        seen += 1
        if seen > _MAX_TREE_ITEMS or depth > 32:
            raise _FormatError("object too large or nested too deeply")
        if isinstance(o, _TensorRef):
            return TensorInfo(o.dtype.name, tuple(o.size))
        if type(o) in _PLAIN:
            return o
        if isinstance(o, dict):
            if not all(type(k) in _PLAIN for k in o):
                raise _FormatError("dictionary with a key that is not a plain value")
            return {k: walk(v, depth + 1) for k, v in o.items()}
        if type(o) in (list, tuple):
            return type(o)(walk(v, depth + 1) for v in o)
        raise _FormatError(f"holds a {type(o).__name__}, not tensors and plain values")

    return walk(obj, 0)


def load_pt_tree(path: Path):
    """The object a ``.pt`` file holds, with every tensor replaced by a :class:`TensorInfo`.

    Read by the same restricted unpickler as :func:`load_tensor` (no code from the file runs);
    the object may only be built of dicts, lists, tuples, strings, numbers, booleans, None and
    tensors, as the SGLang dumper's ``{"value": ..., "meta": {...}}`` records are. Tensor data is
    not read (use :func:`open_tensor`). Raises TensorReadError like load_tensor, also for a
    ``.npy`` file.
    """
    def on_npy(_path):
        raise _FormatError("a .npy array, not a torch.save object")

    return _read_guarded(path, on_npy, lambda _archive, tree: tree, pick=_plain_tree)


def widen_bf16(bits: np.ndarray) -> np.ndarray:
    """float32 values of raw bfloat16 bits (exact: bf16 is the upper half of a float32)."""
    wide = np.asarray(bits, dtype=np.uint32)
    wide <<= 16
    return wide.view(np.float32)


# ----------------------------------------------------------------------------------------------
# Locating a leaf's file


def _safe_relative_name(data_name) -> PurePosixPath:
    if not isinstance(data_name, str) or not data_name.strip():
        raise TensorReadError(repr(data_name), "data_name is not a file name")
    if "\x00" in data_name or "\\" in data_name:
        raise TensorReadError(repr(data_name), "data_name contains a NUL or backslash")
    name = PurePosixPath(data_name)
    if name.is_absolute():
        raise TensorReadError(data_name, "absolute data_name refused")
    if ".." in name.parts:
        raise TensorReadError(data_name, "data_name with '..' refused")
    return name


def _last_folder_name(dump_data_dir) -> str | None:
    # The recorded dir is a path on the dumping machine; only its final name says anything here.
    if not isinstance(dump_data_dir, str):
        return None
    last = dump_data_dir.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return None if last in ("", ".", "..") or "\x00" in last else last


def resolve_data_file(dump_dir: Path, data_name: str, dump_data_dir: str | None) -> Path:
    """Find the file of a dump leaf inside ``dump_dir`` (the folder holding dump.json).

    Looks, in order, in ``dump_dir/<last folder name of dump_data_dir>/``,
    ``dump_dir/dump_tensor_data/`` and ``dump_dir/`` itself; only the last folder name of the
    recorded ``dump_data_dir`` is used, whatever its prefix. Returns the resolved real path of the
    first candidate that is a file.

    Raises TensorReadError for a ``data_name`` that is absolute, has a ``..`` component, a
    backslash or NUL; for a candidate whose real path (symlinks followed) lies outside the
    resolved ``dump_dir``; and ("not found") when no candidate exists. Nothing outside
    ``dump_dir`` is opened.
    """
    name = _safe_relative_name(data_name)
    root = Path(dump_dir).resolve()
    recorded = _last_folder_name(dump_data_dir)
    folders = ([recorded] if recorded else []) + ["dump_tensor_data", ""]
    tried = []
    for folder in folders:
        candidate = root / folder / name
        if candidate in tried:
            continue
        tried.append(candidate)
        try:
            if not os.path.lexists(candidate):
                continue
            real = resolve_within(candidate, root)
        except LeadsOutside:
            raise TensorReadError(candidate, f"leads outside the dump folder {root}") from None
        except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop
            raise TensorReadError(candidate, _describe(exc)) from exc
        if real.is_file():
            return real
    raise TensorReadError(data_name, "not found (looked for " + ", ".join(map(str, tried)) + ")")


def load_tensor(path: Path, mmap: bool = False) -> np.ndarray:
    """Read one whole tensor file (torch.save zip ``.pt`` or ``.npy``) into a numpy array.

    For small tensors read whole (reference checks); bfloat16 is widened exactly to float32.
    ``mmap`` memory-maps ``.npy`` files. Raises TensorReadError (one line naming the file).
    """
    return _read_guarded(path, lambda p: _load_npy(p, mmap),
                         lambda archive, ref: _to_host_dtype(archive.values(ref), ref.dtype))


def load_pt_dict(path: Path) -> dict:
    """The tensors of a ``.pt`` file holding a dict (an RL batch saved with ``torch.save``), read whole.

    Values that are tensors come back as numpy arrays (bfloat16 widened to float32), lists or
    tuples of tensors as lists of arrays, plain values as they are. Read by the same restricted
    unpickler as :func:`load_tensor`. Raises TensorReadError (one line naming the file).
    """
    def pick(obj):
        if not isinstance(obj, dict):
            what = "one tensor" if isinstance(obj, _TensorRef) else f"a {type(obj).__name__}"
            raise _FormatError(f"holds {what}, not a dict of tensors")
        _plain_tree(obj)            # refuses anything but tensors and plain values, bounds the size
        return obj

    def on_pt(archive, obj):
        def value(v):
            if isinstance(v, _TensorRef):
                return _to_host_dtype(archive.values(v), v.dtype)
            if type(v) in (list, tuple):
                return [value(x) for x in v]
            return v
        return {k: value(v) for k, v in obj.items()}

    def on_npy(_path):
        raise _FormatError("a .npy array, not a torch.save dict")

    return _read_guarded(path, on_npy, on_pt, pick=pick)


def bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of ``array`` rounded to nearest even, as torch casts."""
    values = np.array(array, dtype=np.float32, order="C")
    bits = values.view(np.uint32).astype(np.uint64)  # wide enough that rounding cannot overflow
    # Round to nearest even on the 16 bits kept: add half an ulp, plus one if the kept part is odd.
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    # Rounding could carry a NaN into infinity: the canonical quiet NaN, as torch writes it.
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)
