"""Whole-tensor reads and a torch-compatible ``.pt`` writer, for tests and tools (never torch).

The skills only stream tensors (``dumpcompare.tensorio.open_tensor``); tests and tools also need to
read a file whole (``load_tensor``), to ask its stored dtype (``source_dtype``) and to write
``.pt`` files as ``torch.save`` does (``save_pt``, used by the synthetic dumps and the fuzzer).
They reuse the reader's guarded decoding and dtype table.
"""
from __future__ import annotations

import io
import math
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

# Outside pytest (the tools, ``python -m synth``) the compare skill's scripts are not on sys.path yet.
_SCRIPTS = str(Path(__file__).resolve().parents[2] / "dump-module-mapping-value-compare" / "scripts")
if _SCRIPTS not in sys.path:
    sys.path.append(_SCRIPTS)

from dumpcompare.tensorio import (_DTYPES, _DType, _load_npy, _read_guarded,  # noqa: E402,F401
                                  bfloat16_bits, load_tensor)

# torch aligns each member's data to 64 bytes so storages can be memory-mapped in place.
_ALIGNMENT = 64


def source_dtype(path: Path) -> str:
    """The dtype name stored in a tensor file (``"bfloat16"``, ``"float32"``, ``"bool"``, ...).

    Tells callers that a tensor load_tensor returned as float32 was stored as bfloat16. Reads only
    the pickle (or .npy header), not the tensor data. Raises TensorReadError like load_tensor.
    """
    return _read_guarded(path, lambda p: _load_npy(p, mmap=True).dtype.name,
                         lambda archive, ref: ref.dtype.name)


# ----------------------------------------------------------------------------------------------
# Writing. The pickle is emitted opcode by opcode because the globals it must name (torch.*)
# do not exist without torch, so the pickle module cannot produce them.


def _op_global(module: str, name: str) -> bytes:
    return b"c" + f"{module}\n{name}\n".encode()


def _op_str(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _op_int(value: int) -> bytes:
    if 0 <= value < 1 << 8:
        return b"K" + struct.pack("<B", value)
    if 0 <= value < 1 << 16:
        return b"M" + struct.pack("<H", value)
    if -(1 << 31) <= value < 1 << 31:
        return b"J" + struct.pack("<i", value)
    body = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + struct.pack("<B", len(body)) + body


def _op_tuple(items) -> bytes:
    return b"(" + b"".join(items) + b"t"


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)  # torch keeps strides meaningful past zero-length dimensions
    return tuple(reversed(strides))


def _tensor_pickle(shape: tuple, dtype: _DType) -> bytes:
    """data.pkl for one contiguous tensor on storage key "0", as torch.save writes it."""
    count = math.prod(shape)
    if dtype.storage_class:
        rebuild, storage_global, numel = "_rebuild_tensor_v2", ("torch", dtype.storage_class), count
    else:
        rebuild, storage_global = "_rebuild_tensor_v3", ("torch.storage", "UntypedStorage")
        numel = count * dtype.itemsize
    storage = _op_tuple([_op_str("storage"), _op_global(*storage_global), _op_str("0"),
                         _op_str("cpu"), _op_int(numel)]) + b"Q"  # BINPERSID
    empty_hooks = _op_global("collections", "OrderedDict") + b")R"  # OrderedDict()
    requires_grad = b"\x89"  # NEWFALSE
    args = [storage, _op_int(0), _op_tuple(map(_op_int, shape)),
            _op_tuple(map(_op_int, _contiguous_strides(shape))), requires_grad, empty_hooks]
    if rebuild == "_rebuild_tensor_v3":
        args.append(_op_global("torch", dtype.name))
    return b"\x80\x02" + _op_global("torch._utils", rebuild) + _op_tuple(args) + b"R."




def _storage_bytes(array: np.ndarray, dtype: _DType) -> bytes:
    if dtype.name == "bfloat16":
        return bfloat16_bits(array).astype("<u2").tobytes()
    return np.array(array, dtype=np.dtype(dtype.code).newbyteorder("<"), order="C").tobytes()


def _member_padding(offset: int, filename: str) -> bytes:
    """A zip extra field that makes the member's data start on a 64-byte boundary, like torch."""
    header_end = offset + 30 + len(filename.encode()) + 4  # local header, name, extra field header
    pad = -header_end % _ALIGNMENT
    return b"FB" + struct.pack("<H", pad) + b"Z" * pad


def _archive_bytes(archive: str, pickle_bytes: bytes, storage: bytes) -> bytes:
    members = (("data.pkl", pickle_bytes), (".format_version", b"1"), (".storage_alignment", b"64"),
               ("byteorder", b"little"), ("data/0", storage), ("version", b"3\n"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for member, data in members:
            info = zipfile.ZipInfo(f"{archive}/{member}", date_time=(1980, 1, 1, 0, 0, 0))
            info.extra = _member_padding(buf.tell(), info.filename)
            zf.writestr(info, data)
    return buf.getvalue()


def save_pt(path: Path, array: np.ndarray, dtype: str = None) -> None:
    """Write ``array`` as a torch.save-compatible ``.pt`` file, without torch.

    ``dtype`` is a torch short name (``"float32"``, ``"bfloat16"``, ``"int64"``, ``"bool"``, ...,
    any of those load_tensor reads); by default the array's own dtype. Values are converted with
    numpy's casting rules; bfloat16 rounds float32 to nearest even (NaN stays NaN). The file
    mirrors torch's layout (archive folder named after the file stem, protocol-2 data.pkl,
    little-endian storage "data/0", 64-byte aligned members), and
    ``torch.load(path, weights_only=True)`` returns the same tensor.
    """
    array = np.asarray(array)
    name = dtype or array.dtype.name
    if name not in _DTYPES:
        raise ValueError(f"save_pt: unsupported dtype {name!r} (supported: {', '.join(_DTYPES)})")
    target = _DTYPES[name]
    path = Path(path)
    data = _archive_bytes(path.stem or "archive", _tensor_pickle(array.shape, target),
                          _storage_bytes(array, target))
    path.write_bytes(data)
