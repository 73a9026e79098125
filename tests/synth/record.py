"""Capture module calls the way msprobe's L0 hooks see them.

A layout wraps every module forward in ``Recorder.module(...)``. Like msprobe, the recorder
captures the inputs when the forward starts (pre-hook, so later in-place ops cannot change them),
the outputs when it finishes, and appends the entry only when it finishes, so children precede
their parent (post-order). The parent map for construct.json is kept in start order (pre-order),
as msprobe writes it.
"""
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .kernels import Kernels

INT_DTYPES = {np.dtype(np.int64): "torch.int64", np.dtype(np.int32): "torch.int32",
              np.dtype(np.bool_): "torch.bool"}


@dataclass
class Leaf:
    """One dumped tensor: its values as stored (bf16 values kept exactly in float32) and metadata."""

    data: np.ndarray
    dtype: str
    requires_grad: bool = False

    @property
    def is_float(self) -> bool:
        return self.dtype not in INT_DTYPES.values()


@dataclass
class Entry:
    """One ``Module.{path}.{Class}.forward.{n}`` record of dump.json.

    ``input_args``/``input_kwargs``/``output``/``parameters`` hold Items: ``Leaf``, ``None``,
    scalar dicts such as ``{"type": "int", "value": 3}``, and lists/dicts of Items.
    ``parent`` is the key of the enclosing dumped module (None at top level) and ``start`` the
    position at which the forward began, which orders construct.json.
    """

    key: str
    parent: Optional[str]
    start: int
    input_args: list
    input_kwargs: dict
    parameters: dict
    output: list = field(default_factory=list)


class Call:
    """Handle of one running module forward; ``returns`` records the output and passes it on."""

    def __init__(self, recorder: "Recorder", entry: Optional[Entry]):
        self._recorder = recorder
        self.entry = entry

    def returns(self, value):
        """Record ``value`` as the forward's output (a tuple becomes the output list) and return it."""
        if self.entry is not None:
            items = value if isinstance(value, tuple) else (value,)
            self.entry.output = [self._recorder.item(v) for v in items]
        return value


class Recorder:
    """Collects the ``Entry`` list of one side's forward pass.

    ``grad`` says whether the side runs with autograd (training): then parameters and float
    activations have requires_grad true, while ids, positions and constant tables do not.
    ``sink``: called with each entry as it finishes instead of keeping it in ``entries``, so that a
    large model's activations need not all be held until the forward ends.
    """

    def __init__(self, kernels: Kernels, grad: bool, sink=None):
        self.kernels = kernels
        self.grad = grad
        self.entries: list = []
        self._sink = sink if sink is not None else self.entries.append
        self._stack: list = []
        self._counts: dict = {}
        self._started = 0

    @contextmanager
    def module(self, path: str, cls: str, args=(), kwargs=None, params=None, enabled: bool = True):
        """Record one module forward around the ``with`` body; ``enabled=False`` records nothing."""
        if not enabled:
            yield Call(self, None)
            return
        base = f"Module.{path}.{cls}.forward"
        n = self._counts.get(base, 0)
        self._counts[base] = n + 1
        entry = Entry(key=f"{base}.{n}", parent=self._stack[-1].key if self._stack else None,
                      start=self._started, input_args=[self.item(a) for a in args],
                      input_kwargs={k: self.item(v) for k, v in (kwargs or {}).items()},
                      parameters={k: self.param(v) for k, v in (params or {}).items()})
        self._started += 1
        self._stack.append(entry)
        try:
            yield Call(self, entry)
        finally:
            self._stack.pop()
        self._sink(entry)

    def const(self, x: np.ndarray) -> Leaf:
        """A tensor that never requires grad (masks, rotary tables), in the current dtype."""
        return Leaf(self.kernels.cast(x), self.kernels.dtype, False)

    def param(self, w) -> Leaf:
        """A parameter tensor as the module holds it in the current dtype."""
        if isinstance(w, Leaf):
            return w
        return Leaf(self.kernels.cast(w), self.kernels.dtype, self.grad)

    def item(self, v: Any):
        """Convert a Python value to an msprobe Item (see ``Entry``)."""
        if isinstance(v, Leaf) or v is None:
            return v
        if isinstance(v, np.ndarray):
            if v.dtype in INT_DTYPES:
                return Leaf(v, INT_DTYPES[v.dtype], False)
            return Leaf(self.kernels.cast(v), self.kernels.dtype, self.grad)
        if isinstance(v, (bool, int, float, str)):
            return {"type": type(v).__name__, "value": v}
        if isinstance(v, (list, tuple)):
            return [self.item(x) for x in v]
        if isinstance(v, dict):
            return {k: self.item(x) for k, x in v.items()}
        raise TypeError(f"cannot record {type(v).__name__}")
