"""Read the folders SGLang's own dumper (``sglang/srt/debug_utils/dumper.py``) writes.

The dumper saves one ``.pt`` file per dumped value, named by its tags joined with ``___``
(``step=0___rank=0___dump_index=7___name=...___layer_id=3.pt``), all steps and ranks of an
experiment in one folder. A file holds ``{"value": tensor, "meta": {...}}`` (before 0.5.9 the
bare value; before 0.5.10 ``forward_pass_id`` instead of ``step``). The files of one (folder,
step, rank) make one :class:`Dump`, the counterpart of one msprobe ``dump.json``, so that
naming, mapping and comparison run unchanged. What the names mean and which versions are followed is in
references/input_formats.md ("SGLang dumper folders").
"""
from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..compare.sources import BLOCK_BYTES
from ..dtypes import dtype_key, is_int_dtype
from ..errors import InputError
from ..records import BACKWARD, FORWARD, PARAM_GRAD, Dump, Entry, Leaf
from ..tensorio import TensorInfo, TensorReadError, load_pt_tree, open_tensor, widen_bf16
from . import dims as D
from .discovery import files_below

FORMAT = "sglang"
SEP = "___"
_NON_INTRUSIVE = "non_intrusive__"
_PARAM = "param__"
_GRAD = "grad__"
# Names the dumper's non-intrusive mode writes bare, whatever module received them (the union of
# its SGLang and Megatron plugins' core fields): batch metadata, not one module's tensor.
CORE_FIELDS = frozenset({"input_ids", "positions", "seq_lens", "req_pool_indices", "rids",
                         "position_ids", "cu_seqlens_q", "cu_seqlens_kv", "qkv_format"})
_STEP_TAGS = ("step", "forward_pass_id")
_MAX_DEPTH = 4
_INT_RE = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class DumperFile:
    """One dumper file and the tags its name carries."""
    path: Path
    step: str
    rank: str
    index: int
    name: str


@dataclass(frozen=True)
class DumperPart:
    """The files of one step of one rank in one dumper folder: what one dump.json is for msprobe."""
    folder: Path
    step: str
    rank: str
    files: tuple[DumperFile, ...]

    @property
    def nbytes(self) -> int:
        """Bytes on disk, for progress messages and the choice of worker processes."""
        total = 0
        for f in self.files:
            try:
                total += f.path.stat().st_size
            except OSError:
                pass
        return total

    def __str__(self) -> str:
        return f"{self.folder} (step {self.step}, rank {self.rank})"


def parse_name(path: Path) -> DumperFile | None:
    """The tags of a dumper file name, or None when the name is not one the dumper writes."""
    if path.suffix != ".pt":
        return None
    tags = {}
    for part in path.stem.split(SEP):
        key, eq, value = part.partition("=")
        if not eq:
            return None
        tags[key] = value
    step = next((tags[t] for t in _STEP_TAGS if t in tags), None)
    if step is None or "name" not in tags or not _INT_RE.match(tags.get("rank", "")) \
            or not _INT_RE.match(tags.get("dump_index", "")):
        return None
    return DumperFile(path, step, tags["rank"], int(tags["dump_index"]), tags["name"])


def _dumper_files(root: Path):
    """The dumper files below ``root``, a few levels deep, level by level (a link among them
    that leads out of ``root`` is refused: discovery.files_below)."""
    for p in files_below(root, lambda name: parse_name(Path(name)) is not None, _MAX_DEPTH):
        yield parse_name(p)


def looks_like_dumper(path: Path) -> bool:
    """True for a folder holding (a few levels down) a file named as the SGLang dumper names them."""
    return path.is_dir() and next(_dumper_files(path), None) is not None


def find_parts(root: Path) -> list[DumperPart]:
    """Every (folder, step, rank) of dumper files below ``root``, in folder, step, rank order."""
    groups: dict[tuple, list[DumperFile]] = {}
    for f in _dumper_files(root):
        groups.setdefault((f.path.parent, f.step, f.rank), []).append(f)
    return [DumperPart(folder, step, rank, tuple(sorted(fs, key=lambda f: f.index)))
            for (folder, step, rank), fs in sorted(groups.items(), key=lambda kv: (
                str(kv[0][0]), _natural(kv[0][1]), _natural(kv[0][2])))]


def parts_of(arg: str, side: str) -> list[DumperPart]:
    """Every part of one dumper folder (the input plan chooses steps and ranks among them)."""
    root = Path(arg)
    if not root.is_dir():
        raise InputError(f"{arg}: an SGLang dumper dump is a folder of .pt files; --{side} is not a folder")
    parts = find_parts(root)
    if not parts:
        raise InputError(f"{arg}: no SGLang dumper file found (names like step=0___rank=0___dump_index=1___"
                         f"name=x.pt, looked {_MAX_DEPTH} levels deep)")
    folders = {p.folder for p in parts}
    if len(folders) > 1:
        raise InputError(f"{arg}: holds SGLang dumper files in {len(folders)} folders "
                         f"({', '.join(sorted(str(f) for f in folders)[:4])}); pass the folder you mean")
    return parts


# ----------------------------------------------------------------------------------------------
# Reading one part


@dataclass
class _Call:
    leaves: dict[str, Leaf]
    last: int                 # dump_index of its last file: entries sort by completion
    has_output: bool = False


def _leaf_name(sub: str) -> str | None:
    """``inputs.0`` / ``inputs.hidden_states`` / ``output`` (+ ``.<key>``) as a msprobe leaf name."""
    segs = sub.split(".")
    if segs[0] == "output":
        return ".".join(["output", *(segs[1:] or ["0"])])
    if segs[0] == "inputs" and len(segs) >= 2:
        kind = "input_args" if segs[1].isdigit() else "input_kwargs"
        return ".".join([kind, *segs[1:]])
    return None


def split_non_intrusive(name: str) -> tuple[str, str] | None:
    """``model.layers.0.mlp.inputs.0`` -> (``model.layers.0.mlp``, ``input_args.0``), or None.

    The dumper joins the module path, ``inputs.<i|kwarg>`` or ``output``, and an optional key of a
    tuple/dict value; reading from the end finds the split even when a module is named ``output``.
    """
    segs = name.split(".")
    for cut in range(len(segs) - 1, max(len(segs) - 4, -1), -1):
        if segs[cut] in ("inputs", "output"):
            leaf = _leaf_name(".".join(segs[cut:]))
            rest = len(segs) - cut
            fits = rest <= 2 if segs[cut] == "output" else 2 <= rest <= 3
            if leaf and fits:
                return ".".join(segs[:cut]), leaf
    return None


def _tensor_leaf(name: str, path: Path, info: TensorInfo) -> Leaf:
    lf = Leaf(name, dtype=f"torch.{info.dtype}", shape=info.shape, data_name=path.name)
    lf.max, lf.min, lf.mean, lf.norm = _statistics(path, info.dtype)
    return lf


def _statistics(path: Path, dtype: str) -> tuple:
    """Max, Min, Mean, Norm of the file's tensor, read block by block, computed as msprobe
    computes them so that a mixed pair compares like with like: sums of float tensors of up to 32
    bits accumulate in float32 (an attention mask of -3.4e38 has Mean -inf and Norm inf in both);
    Mean and Norm are None for integer and boolean tensors."""
    arr, raw_bf16 = open_tensor(path)
    acc = np.float64 if dtype in ("float64", "complex128") else np.float32
    mx = mn = None
    total = squares = acc(0)
    if arr.ndim == 0:
        blocks = [arr]
    else:
        row = max(1, arr[0].size if arr.shape[0] else 1) * 8
        step = max(1, BLOCK_BYTES // row)
        blocks = (arr[lo:lo + step] for lo in range(0, arr.shape[0], step))
    with np.errstate(over="ignore", invalid="ignore"):
        for b in blocks:
            b = np.asarray(widen_bf16(b) if raw_bf16 else b)
            if not b.size:
                continue
            if b.dtype.kind == "c":
                b = np.abs(b)   # complex values are ordered by magnitude
            bmax, bmin = float(b.max()), float(b.min())
            # np.maximum keeps a NaN, as torch.max does
            mx = bmax if mx is None else float(np.maximum(mx, bmax))
            mn = bmin if mn is None else float(np.minimum(mn, bmin))
            v = b.astype(acc)
            total = acc(total + np.sum(v, dtype=acc))
            squares = acc(squares + np.sum(v * v, dtype=acc))
        size = arr.size
        if not size:
            return None, None, None, None
        if is_int_dtype(dtype):
            return mx, mn, None, None
        return mx, mn, float(total / acc(size)), float(np.sqrt(squares))


def _value_leaves(prefix: str, value: Any, path: Path | None, out: list[Leaf]) -> None:
    """Leaves of a dumped value: a tensor (read for statistics), plain values, or nests of them.

    Only a tensor that is the whole value can be read (tensorio reads a record's ``value``); one
    nested in a tuple or dict keeps its dtype and shape, without statistics."""
    if isinstance(value, TensorInfo):
        if path is not None:
            out.append(_tensor_leaf(prefix, path, value))
        else:
            out.append(Leaf(prefix, dtype=f"torch.{value.dtype}", shape=value.shape))
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _value_leaves(f"{prefix}.{k}", v, None, out)
        return
    if isinstance(value, (list, tuple)):
        if value and all(not isinstance(v, (dict, list, tuple, TensorInfo)) for v in value):
            out.append(Leaf(prefix, value=list(value), is_tensor=False, dtype="list"))
            return
        for i, v in enumerate(value):
            _value_leaves(f"{prefix}.{i}", v, None, out)
        return
    if isinstance(value, (int, float, str, bool)) or value is None:
        out.append(Leaf(prefix, value=value, is_tensor=False, dtype=type(value).__name__))


def unfinished(path: Path) -> bool:
    """True for an archive the dumper began but could not finish: when torch.save fails (a value
    that cannot be pickled) the dumper logs the error and leaves a zip holding no data.pkl."""
    try:
        with zipfile.ZipFile(path) as zf:
            return not any(n.endswith("/data.pkl") for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def _read_record(f: DumperFile) -> tuple[Any, dict]:
    """(value, meta) of one file; raises InputError for a file that is not a dumper record."""
    try:
        tree = load_pt_tree(f.path)
    except TensorReadError as exc:
        raise InputError(f"{exc.file}: not an SGLang dumper file: {exc.problem}") from None
    if isinstance(tree, dict) and set(tree) == {"value", "meta"}:
        meta = tree["meta"]
        if not isinstance(meta, dict):
            raise InputError(f"{f.path}: not an SGLang dumper file: 'meta' is a {type(meta).__name__}")
        return tree["value"], meta
    if isinstance(tree, TensorInfo):
        return tree, {}          # written before 0.5.9: the bare tensor, tags in the name only
    raise InputError(f"{f.path}: not an SGLang dumper file: holds a {type(tree).__name__}, not "
                     "{'value': ..., 'meta': {...}} or a tensor")


def _check_name(f: DumperFile, meta: dict) -> str:
    name = meta.get("name", f.name)
    if not isinstance(name, str) or not name:
        raise InputError(f"{f.path}: dumper name {name!r} is not a string")
    if any(c in name for c in "/\\\x00"):
        raise InputError(f"{f.path}: dumper name {name!r} contains a path separator or NUL")
    return name


class _Builder:
    """Collects the files of one part into entries, one per module call, in completion order."""

    def __init__(self) -> None:
        self.calls: dict[tuple, list[_Call]] = {}
        self.params: list[tuple[str, str, str, Leaf, int]] = []   # direction, module, pname, leaf, index
        self.notes: list[str] = []

    def add(self, kind: str, direction: str, path: str, leaf_name: str, leaves: list[Leaf], index: int) -> None:
        key = (kind, direction, path)
        calls = self.calls.setdefault(key, [])
        is_input = leaf_name.startswith("input")
        cur = calls[-1] if calls else None
        # A leaf seen again, or an input after the output, starts the module's next call.
        if cur is None or leaf_name in cur.leaves or any(lf.name in cur.leaves for lf in leaves) \
                or (is_input and cur.has_output):
            cur = _Call({}, index)
            calls.append(cur)
        for lf in leaves:
            cur.leaves[lf.name] = lf
        cur.last = index
        cur.has_output = cur.has_output or leaf_name.startswith("output")

    def entries(self) -> list[Entry]:
        made = []
        for (kind, direction, path), calls in self.calls.items():
            for n, c in enumerate(calls):
                cls = "Module" if kind == "module" else "Dumper"
                key = (f"Module.{path + '.' if path else ''}{cls}.{direction}.{n}" if kind == "module"
                       else f"{cls}.{path}.{n}.{direction}")
                e = Entry(key=key, order=c.last, kind=kind, raw_path=path, cls=cls, direction=direction,
                          call=n, leaves=list(c.leaves.values()))
                e.n_args = len({lf.name.split(".")[1] for lf in e.leaves if lf.name.startswith("input_args.")})
                made.append(e)
        self._attach_params(made)
        made.sort(key=lambda e: e.order)
        for i, e in enumerate(made):
            e.order = i
        return made

    def _attach_params(self, made: list[Entry]) -> None:
        """Parameters join call 0 of their module's forward entry (as msprobe records them);
        a parameter of a module that never ran stays a listed, uncompared entry."""
        first = {(e.raw_path, e.direction): e for e in reversed(made) if e.kind == "module"}
        loose = 0
        for direction, module, pname, lf, index in self.params:
            home = first.get((module, FORWARD))
            if direction == FORWARD and home is not None:
                home.leaves.append(replace(lf, name=f"parameters.{pname}"))
                continue
            if direction == PARAM_GRAD and (module, FORWARD) in first:
                made.append(Entry(key=f"Module.{module}.Module.parameters_grad.0", order=index, kind="module",
                                  raw_path=module, cls="Module", direction=PARAM_GRAD, call=0,
                                  leaves=[replace(lf, name=f"parameters_grad.{pname}")]))
                continue
            loose += 1
            made.append(Entry(key=f"Dumper.{_PARAM}{module}.{pname}.0.{direction}", order=index, kind="api",
                              raw_path=f"{_PARAM}{module}.{pname}", cls="Dumper", direction=FORWARD, call=0,
                              leaves=[lf]))
        if loose:
            self.notes.append(f"{loose} parameter dumps of modules without a forward dump kept as listed entries")


def recorded_family(meta: dict) -> str | None:
    """The engine a dump came from when the dumper recorded it: the plugin whose parallel state
    it could read (an ``*_error`` key means the framework was importable but not running)."""
    for key, family in (("sglang_parallel_info", "sglang"), ("megatron_parallel_info", "megatron")):
        info = meta.get(key)
        if isinstance(info, dict) and info and not any(str(k).endswith("_error") for k in info):
            return family
    return None


def load_part(part: DumperPart) -> Dump:
    """Read one (folder, step, rank) of dumper files into a :class:`Dump`.

    Non-intrusive dumps become module entries (inputs, output, and parameters from
    ``dump_model``); hand-named dumps become one entry per name, under ``layers.<layer_id>.`` when
    tagged with a layer, whose value is leaf ``output.0``; core fields (token ids, positions) and
    recompute passes are listed but not compared. Raises InputError for a file that is not a
    dumper record.
    """
    b = _Builder()
    recomputes = 0
    hints = set()
    unwritten = []
    layouts: set = set()
    for f in part.files:
        if unfinished(f.path):
            unwritten.append(f.name)
            continue
        value, meta = _read_record(f)
        name = _check_name(f, meta)
        hints.add(recorded_family(meta))
        if meta.get("recompute_status", "disabled") == "recompute":
            recomputes += 1
            continue
        direction = FORWARD
        if name.startswith(_GRAD):
            name, direction = name[len(_GRAD):], BACKWARD
        if name.startswith(_PARAM):
            module, _, pname = name[len(_PARAM):].rpartition(".")
            leaves: list[Leaf] = []
            _value_leaves("value", value, f.path, leaves)
            for lf in leaves:
                b.params.append((PARAM_GRAD if direction == BACKWARD else FORWARD, module, pname, lf, f.index))
            continue
        split = split_non_intrusive(name[len(_NON_INTRUSIVE):]) if name.startswith(_NON_INTRUSIVE) else None
        layer = meta.get("layer_id", _layer_tag(f))
        if split is not None:
            kind, path, leaf = "module", split[0], split[1]
        elif name in CORE_FIELDS or name.startswith(_NON_INTRUSIVE):
            kind, path, leaf = "api", name if layer is None else f"layers.{layer}.{name}", "output.0"
        else:
            kind, path, leaf = "module", name if layer is None else f"layers.{layer}.{name}", "output.0"
        leaves = []
        _value_leaves(leaf, value, f.path, leaves)
        annotation = meta.get("dims")   # a gradient's file carries its own (dims_grad) here
        if annotation is not None:
            layouts.add(D.layout(annotation) or "unknown")
            for lf in leaves:
                lf.shard_hint = D.shard_rule(annotation) if lf.is_tensor else None
        b.add(kind, direction, path, leaf, leaves, f.index)
    entries = b.entries()
    notes = [f"SGLang dumper folder, step {part.step}, rank {part.rank}: {len(part.files)} files"] + b.notes
    if unwritten:
        notes.append(f"{len(unwritten)} files the dumper could not finish writing (no data.pkl) skipped: "
                     f"{', '.join(unwritten[:3])}{' ...' if len(unwritten) > 3 else ''}")
    if recomputes:
        notes.append(f"{recomputes} dumps of recomputed forwards skipped: they repeat the original forward")
    hints.discard(None)
    layouts.discard("unknown")   # annotations without a token axis (weights) say nothing of it
    return Dump(path=part.folder, dump_dir=part.folder, fmt=FORMAT, task="tensor", level="L0",
                framework=None, dump_data_dir=None, entries=entries, notes=notes,
                family=hints.pop() if len(hints) == 1 else None,
                layout=layouts.pop() if len(layouts) == 1 else None)


_SCAN_FILES = 64


def token_signature(part: DumperPart) -> tuple | None:
    """(numel, max, min, first position) of the tokens a part saw, or None; the counterpart of
    loaders.inputs.token_signature for msprobe files.

    The tokens are the first integer tensor written as a module input or as ``input_ids``; the
    first position comes from a later integer input of the same size holding consecutive values.
    Only the first files are read.
    """
    ids = None
    for f in part.files[:_SCAN_FILES]:
        if unfinished(f.path):
            continue
        value, meta = _read_record(f)
        name = _check_name(f, meta)
        split = split_non_intrusive(name[len(_NON_INTRUSIVE):]) if name.startswith(_NON_INTRUSIVE) else None
        is_input = name in ("input_ids", "positions", "position_ids") or (split and split[1].startswith("input"))
        if not (is_input and isinstance(value, TensorInfo) and (is_int_dtype(value.dtype) and dtype_key(value.dtype) != "bool")):
            continue
        mx, mn, _, _ = _statistics(f.path, value.dtype)
        numel = int(np.prod(value.shape))
        if mx is None:
            continue
        if ids is None:
            ids = (numel, mx, mn)
        elif numel == ids[0] and mx - mn + 1 == numel:
            return (*ids, mn)
    return None if ids is None else (*ids, None)


def _layer_tag(f: DumperFile):
    for part in f.path.stem.split(SEP):
        key, _, value = part.partition("=")
        if key == "layer_id" and _INT_RE.match(value):
            return int(value)
    return None




def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]
