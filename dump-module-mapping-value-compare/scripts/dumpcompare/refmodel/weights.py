"""The checkpoint's tensors as one forward needs them: named, split, injected and rounded.

A weight is read from the memory map when its module runs and dropped after, so a forward holds
about one layer. Names are the checkpoint's own with the text model's prefix written ``model.``
(a multimodal Gemma 3 stores ``language_model.model.`` or ``model.language_model.``). Fused and
split projections are interchangeable: Phi-3's ``qkv_proj`` / ``gate_up_proj`` are split on read,
and an Injection may name either form whatever the checkpoint stores (the fused form is the
concatenation ``[q; k; v]`` / ``[gate; up]``, transformers' order).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..checkpoint import Checkpoint
from .ops import Round
from .spec import Spec, UnsupportedModel

PREFIXES = ("model.", "model.language_model.", "language_model.model.")
# Rows of a large head read at once: bounds the head's memory to this many rows of float32.
HEAD_BLOCK = 4096


class Weights:
    """Tensor reader of one checkpoint for one forward (weights rounded by ``rnd``)."""

    def __init__(self, ckpt: Checkpoint, spec: Spec, inject_weights: dict, from_layer: int, rnd: Round):
        self.ckpt, self.spec, self.rnd = ckpt, spec, rnd
        self.inject, self.from_layer = dict(inject_weights), from_layer
        self.prefix = next((p for p in PREFIXES if p + "embed_tokens.weight" in ckpt.tensors), None)
        if self.prefix is None:
            raise UnsupportedModel(f"{ckpt.folder}: no embed_tokens.weight under {', '.join(PREFIXES)}")

    # -- names ---------------------------------------------------------------------------------
    def _stored(self, name: str) -> str:
        """The checkpoint's name of a ``model.``-prefixed name."""
        return self.prefix + name[len("model."):] if name.startswith("model.") else name

    def has(self, name: str) -> bool:
        """Whether the checkpoint stores ``name`` (``model.``-prefixed)."""
        return self._stored(name) in self.ckpt.tensors

    def _fn(self, name: str, layer: int | None) -> Callable | None:
        if layer is not None and layer < self.from_layer:
            return None
        return self.inject.get(name)

    # -- reads ---------------------------------------------------------------------------------
    def _load(self, stored: str, index=None) -> np.ndarray:
        """float32 values of a stored tensor (or of its rows ``index``), unrounded."""
        a = self.ckpt.read(stored) if index is None else self.ckpt.rows(stored, index)
        return a.astype(np.float32, copy=False)

    def _round(self, a: np.ndarray, stored: str, changed: bool) -> np.ndarray:
        # Values read from a bf16 file are on the bf16 grid already; rounding them again would
        # only cost the memory of a second copy.
        return a if not changed and self.ckpt.tensors[stored].dtype == "BF16" else self.rnd(a)

    def get(self, name: str, layer: int | None = None) -> np.ndarray | None:
        """Tensor ``name`` injected and rounded to the forward's dtype (None when not stored)."""
        if not self.has(name):
            return None
        stored = self._stored(name)
        a, fn = self._load(stored), self._fn(name, layer)
        return self._round(np.asarray(fn(a), dtype=np.float32) if fn else a, stored, fn is not None)

    def need(self, name: str, layer: int | None = None) -> np.ndarray:
        """Tensor ``name`` as ``get`` reads it; a checkpoint without it is not this family's."""
        a = self.get(name, layer)
        if a is None:
            raise UnsupportedModel(f"{self.ckpt.folder}: {self._stored(name)} is not in the checkpoint")
        return a

    def parts(self, base: str, split: tuple[str, ...], fused: str, sizes: tuple[int, ...] | None, layer: int,
              kind: str = "weight") -> list[np.ndarray | None]:
        """The split projections ``split`` under ``base`` (q/k/v or gate/up), read as stored
        (split, or fused and cut into ``sizes`` rows, equal parts when None), injected by the
        fused name then the split names, rounded. A missing bias gives None."""
        names = [f"{base}.{s}.{kind}" for s in split]
        fused_name = f"{base}.{fused}.{kind}"
        cuts = np.cumsum(sizes)[:-1] if sizes else len(split)
        if all(self.has(n) for n in names):
            stored = [self._stored(n) for n in names]
            arrays = [self._load(n) for n in stored]
        elif self.has(fused_name):
            stored = [self._stored(fused_name)] * len(split)
            arrays = np.split(self._load(stored[0]), cuts, axis=0)
        elif kind == "bias":
            return [None] * len(split)
        else:
            raise UnsupportedModel(f"{self.ckpt.folder}: neither {names[0]} nor {fused_name} is stored")
        fn = self._fn(fused_name, layer)
        if fn:
            arrays = np.split(np.asarray(fn(np.concatenate(arrays, axis=0)), dtype=np.float32), cuts, axis=0)
        out = []
        for n, st, a in zip(names, stored, arrays):
            part_fn = self._fn(n, layer)
            out.append(self._round(np.asarray(part_fn(a), dtype=np.float32) if part_fn else a, st,
                                   bool(fn or part_fn)))
        return out

    def embedding(self, ids: np.ndarray) -> np.ndarray:
        """Embedding rows of ``ids`` [T, hidden], reading only those rows unless an injection
        needs the whole table."""
        name = "model.embed_tokens.weight"
        if name in self.inject:
            return self.get(name)[ids]
        uniq, back = np.unique(ids, return_inverse=True)
        stored = self._stored(name)
        rows = self.ckpt.tensors[stored].shape[0]
        if uniq[0] < 0 or uniq[-1] >= rows:
            raise ValueError(f"token ids must lie in 0..{rows - 1} (the embedding's rows), not {uniq[0]}..{uniq[-1]}")
        return self._round(self._load(stored, uniq), stored, False)[back]

    def head_stored(self) -> str:
        """The stored tensor the head multiplies by: lm_head.weight, or the embedding when tied
        (or when no head is stored)."""
        if not self.spec.tied:
            for name in ("lm_head.weight", "language_model.lm_head.weight"):
                if name in self.ckpt.tensors:
                    return name
        return self._stored("model.embed_tokens.weight")

    def head(self, x: np.ndarray) -> np.ndarray:
        """Logits x @ head.T, the head read in blocks of rows (a large vocabulary is never whole
        in float32); an injection on ``lm_head.weight`` (or, tied, on the embedding) gets the
        whole tensor."""
        stored = self.head_stored()
        fn = self.inject.get("lm_head.weight")
        if fn is None and stored == self._stored("model.embed_tokens.weight"):
            fn = self.inject.get("model.embed_tokens.weight")
        if fn:
            w = self.rnd(np.asarray(fn(self._load(stored)), dtype=np.float32))
            return self.rnd(x @ w.T, inplace=True)
        rows = self.ckpt.tensors[stored].shape[0]
        out = np.empty((x.shape[0], rows), dtype=np.float32)
        for start in range(0, rows, HEAD_BLOCK):
            w = self._round(self._load(stored, slice(start, start + HEAD_BLOCK)), stored, False)
            out[:, start:start + w.shape[0]] = x @ w.T
        return self.rnd(out, inplace=True)

    def expert(self, layer: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """gate, up, down weights of expert ``e``: per-expert tensors (Qwen3-MoE names, Mixtral's
        w1/w3/w2) or one row of the stacked ``experts.gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I]."""
        for base, (g, u, d) in ((f"model.layers.{layer}.mlp.experts.{e}", ("gate_proj", "up_proj", "down_proj")),
                                (f"model.layers.{layer}.block_sparse_moe.experts.{e}", ("w1", "w3", "w2"))):
            if self.has(f"{base}.{g}.weight"):
                return tuple(self.need(f"{base}.{n}.weight", layer) for n in (g, u, d))
        base = f"model.layers.{layer}.mlp.experts"
        if not self.has(f"{base}.gate_up_proj"):
            raise UnsupportedModel(f"{self.ckpt.folder}: no weights for expert {e} of layer {layer}")
        gate_up, down = (self._stacked(f"{base}.{n}", e, layer) for n in ("gate_up_proj", "down_proj"))
        gate, up = np.split(gate_up, 2, axis=0)
        return gate, up, down

    def _stacked(self, name: str, e: int, layer: int) -> np.ndarray:
        fn, stored = self._fn(name, layer), self._stored(name)
        if fn:
            return self.rnd(np.asarray(fn(self._load(stored)), dtype=np.float32)[e])
        return self._round(self._load(stored, e), stored, False)

    def router(self, layer: int) -> np.ndarray:
        """The router weight [E, hidden] of a mixture-of-experts layer."""
        for name in (f"model.layers.{layer}.mlp.gate.weight", f"model.layers.{layer}.block_sparse_moe.gate.weight"):
            if self.has(name):
                return self.get(name, layer)
        raise UnsupportedModel(f"{self.ckpt.folder}: no router weight for layer {layer}")
