"""A Hugging Face model folder read without torch: ``config.json`` and ``*.safetensors``.

The safetensors format is an 8-byte little-endian header length, a JSON header giving each
tensor's dtype, shape and byte range, then the raw little-endian data. It is read here by hand,
memory-mapped and one tensor at a time, because ``safetensors.numpy`` hands tensors to numpy,
which has no bfloat16: bf16 tensors are read as their uint16 bits and widened to float32
(exactly; every bf16 value is a float32).
"""
from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import modelconfig
from .containment import kind
from .errors import InputError
from .tensorio import widen_bf16

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "U8": np.dtype("u1"), "I8": np.dtype("i1"),
           "BOOL": np.dtype("?")}
# Side dtype names (dumpcompare.tolerances.dtype_key) of each safetensors dtype.
DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
_MAX_HEADER = 100 << 20
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lives: its file, safetensors dtype, shape and byte range in that file."""
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass
class Checkpoint:
    """The tensors and config of one model folder; tensors are read on demand."""
    folder: Path
    files: list[Path]
    tensors: dict[str, StoredTensor]
    config: dict = field(default_factory=dict)
    _maps: dict = field(default_factory=dict, repr=False)

    def _raw(self, name: str) -> np.ndarray:
        """The stored tensor as a read-only view of the memory map (no bytes read yet)."""
        info = self.tensors[name]
        mm = self._maps.get(info.file)
        if mm is None:
            with open(info.file, "rb") as fh:
                mm = self._maps[info.file] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return np.frombuffer(mm, dtype=_DTYPES[info.dtype], count=(info.end - info.start) // _DTYPES[info.dtype].itemsize,
                             offset=info.start).reshape(info.shape)

    @staticmethod
    def _own(raw: np.ndarray, dtype: str) -> np.ndarray:
        if dtype == "BF16":
            return widen_bf16(raw)
        return raw.astype(raw.dtype.newbyteorder("="), copy=True)

    def _release(self, name: str) -> None:
        """Hand the file pages of ``name`` back: a copy was taken, and a mapped page once read
        stays in the process's resident memory until unmapped (the page cache still keeps it),
        so reading a whole model tensor by tensor would otherwise hold all of it."""
        info = self.tensors[name]
        if hasattr(mmap, "MADV_DONTNEED"):
            start = info.start - info.start % mmap.PAGESIZE
            self._maps[info.file].madvise(mmap.MADV_DONTNEED, start, info.end - start)

    def read(self, name: str) -> np.ndarray:
        """The tensor ``name`` as a numpy array (bf16 widened to float32; a fresh copy)."""
        out = self._own(self._raw(name), self.tensors[name].dtype)
        self._release(name)
        return out

    def rows(self, name: str, index) -> np.ndarray:
        """Part of tensor ``name`` along its first axis (an int, slice or integer array), reading
        only those bytes of the file (bf16 widened to float32; a fresh copy): an embedding's rows
        for a few tokens, one expert of a stacked tensor, a block of a large head."""
        out = self._own(self._raw(name)[index], self.tensors[name].dtype)
        self._release(name)
        return out

    def dtype_name(self, name: str) -> str:
        """The stored dtype of ``name`` as a side dtype name (bfloat16, float32, ...)."""
        d = self.tensors[name].dtype
        return DTYPE_NAMES.get(d, d.lower())


def _header(path: Path) -> dict[str, StoredTensor]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise InputError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        n = struct.unpack("<Q", head)[0]
        if n > min(_MAX_HEADER, size - 8):
            raise InputError(f"{path}: safetensors header length {n} points outside the file ({size} bytes)")
        try:
            meta = json.loads(fh.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: safetensors header is not JSON ({exc})") from None
        except RecursionError:
            raise InputError(f"{path}: safetensors header is nested too deeply to be one") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: safetensors header is not a JSON object")
    base, out, spans = 8 + n, {}, []
    for name, d in meta.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = d["dtype"], tuple(int(x) for x in d["shape"]), d["data_offsets"]
            a, b = int(a), int(b)
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: tensor {name!r} has no valid dtype/shape/data_offsets") from None
        if dtype not in _DTYPES:
            raise InputError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        want = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
        if a < 0 or b < a or base + b > size or b - a != want:
            raise InputError(f"{path}: tensor {name!r} data_offsets [{a}, {b}] do not fit the file or its shape")
        out[name] = StoredTensor(path, dtype, shape, base + a, base + b)
        spans.append((a, b, name))
    spans.sort()
    for (a0, b0, n0), (a1, _b1, n1) in zip(spans, spans[1:]):
        if a1 < b0:
            raise InputError(f"{path}: tensors {n0!r} and {n1!r} overlap in the file")
    return out


def _inside(folder: Path, name: str, where: Path) -> Path:
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise InputError(f"{where}: file name {name!r} is not a plain file name in the model folder")
    return folder / name


def load(folder: str | Path) -> Checkpoint:
    """Read the headers of a model folder (single ``*.safetensors`` or sharded with an index)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: --model must be a Hugging Face model folder")
    index = root / INDEX
    _check_readable(index)
    if index.is_file():
        try:
            wmap = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, RecursionError):
            raise InputError(f"{index}: not a safetensors index (no weight_map)") from None
        if not isinstance(wmap, dict):
            raise InputError(f"{index}: weight_map is not an object")
        files = sorted({_inside(root, f, index) for f in wmap.values()})
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise InputError(f"{root}: no *.safetensors files in the model folder")
    tensors: dict[str, StoredTensor] = {}
    for f in files:
        what = kind(f)
        if what == "missing":
            raise InputError(f"{f}: listed in {INDEX} but missing" if index.is_file() else
                             f"{f}: a link to nothing (the file it names is missing)")
        if what != "file":
            raise InputError(f"{f}: a {what}, not a safetensors file")
        tensors.update(_header(f))
    config = _fitted(read_config(root / "config.json"), tensors, root / "config.json")
    return Checkpoint(root, files, tensors, config)


def read_config(path: str | Path) -> dict:
    """A config.json as a dict (empty when absent); a text config that is not JSON is an error."""
    p = Path(path)
    _check_readable(p)
    if not p.is_file():
        return {}
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{p}: not a JSON config ({exc.__class__.__name__})") from None
    except RecursionError:
        raise InputError(f"{p}: not a JSON config (nested too deeply)") from None
    except ValueError:      # Python's integer-digit limit on a number literal
        raise InputError(f"{p}: not a JSON config (a number too long to read)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{p}: config is not a JSON object")
    return modelconfig.validate(doc, str(p))


def side_config(ckpt: Checkpoint, path: str | Path) -> dict:
    """An engine config laid over ``ckpt`` (``--train-config``/``--rollout-config``), read and
    validated as config.json is, its layer count held to the layers the checkpoint's tensors hold."""
    return _fitted(read_config(path), ckpt.tensors, path)


def _fitted(config: dict, tensors: dict[str, StoredTensor], path: str | Path) -> dict:
    """A config read from ``path`` held to what ``tensors`` tell: the layer count to the layers
    they hold, and the head counts checked against the q/k/v shapes (modelconfig.check_heads)."""
    modelconfig.check_heads(config, {n: t.shape for n, t in tensors.items()}, str(path))
    return modelconfig.trust_layers(config, modelconfig.layers_present(tensors))


def _check_readable(path: Path) -> None:
    """Links in a model folder are normal (a Hugging Face cache snapshot links every file into
    ``../../blobs``), but one to a device or FIFO would block or never end when read."""
    what = kind(path)
    if what not in ("file", "missing"):
        raise InputError(f"{path}: a {what}, not a JSON file")
