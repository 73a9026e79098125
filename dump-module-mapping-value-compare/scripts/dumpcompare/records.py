"""Plain records that flow through the pipeline: load -> name -> map -> compare -> analyse."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORWARD, BACKWARD, PARAM_GRAD = "forward", "backward", "parameters_grad"


@dataclass
class Salvage:
    """Where and why reading a damaged dump stopped; absent when the file was whole."""
    byte_offset: int
    last_complete_key: str | None
    entries_recovered: int
    reason: str


@dataclass(slots=True)
class Leaf:
    """One tensor (or scalar) inside an entry, named by where it sits.

    ``name`` is a dotted path: ``input_args.0``, ``input_kwargs.position_ids``,
    ``output.0.last_hidden_state``, ``parameters.weight``.
    """
    name: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    max: float | None = None
    min: float | None = None
    mean: float | None = None
    norm: float | None = None
    requires_grad: bool | None = None
    checksum: str | None = None
    data_name: str | None = None
    value: Any = None          # for non-tensor items ({"type": "int", "value": 3})
    is_tensor: bool = True
    # Set when tensor-parallel ranks were merged: how ("concat:<dim>", "sum", "replicated")
    # and, for tensor files, one (dump_dir, data_name, dump_data_dir) per rank.
    merge: str | None = None
    shards: tuple | None = None
    # Set when repeated calls of one module were folded into this leaf (see loaders/folding.py):
    # float64 [calls, 4] of Max, Min, Mean, Norm per call, NaN where a statistic is absent.
    # The scalar fields above always hold call 0.
    per_call: Any = None
    # How the tensor-parallel ranks' copies join, when the dump says so (an SGLang dumper ``dims``
    # annotation, loaders/dims.py): used by unshard.py instead of a guess.
    shard_hint: str | None = None

    @property
    def numel(self) -> int | None:
        if self.shape is None:
            return None
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


@dataclass(slots=True)
class Entry:
    """One dump.json entry, parsed from its key, with its flattened leaves."""
    key: str
    order: int                 # position in the file (execution order of completion)
    kind: str                  # "module" or "api"
    raw_path: str              # module path as dumped (wrappers included); api name for APIs
    cls: str                   # module class, or API type (Tensor, Functional, ...)
    direction: str             # forward | backward | parameters_grad
    call: int
    leaves: list[Leaf] = field(default_factory=list)
    n_args: int = 0            # positional inputs, which some engines vary per call
    n_calls: int = 1           # calls folded into this entry (its leaves' ``per_call`` rows)


@dataclass
class Dump:
    """Everything read from one side's dump file."""
    path: Path                 # the dump.json (or generic JSON) that was read
    dump_dir: Path             # folder holding it; tensor files are resolved inside it
    fmt: str                   # "msprobe", "generic" or "sglang"
    task: str | None
    level: str | None
    framework: str | None
    dump_data_dir: str | None
    entries: list[Entry]
    salvage: Salvage | None = None
    notes: list[str] = field(default_factory=list)
    skipped_keys: list[str] = field(default_factory=list)
    folded: bool = False       # repeated calls were folded into one entry per module
    family: str | None = None  # engine family the dump itself records (SGLang dumper meta), if any
    layout: str | None = None  # token layout its annotations declare: "t", "bs" or "sb" (loaders/dims.py)
