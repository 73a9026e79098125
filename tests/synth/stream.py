"""msprobe statistics dumps written from entries as they finish (``Recorder``'s ``sink``).

A generation's engine dump holds every module once per forward call, a prefill and then one call
per decoded token. ``synth.decode`` makes it from one forward over all the tokens by copying
every entry once per call, which holds the model's activations several times over and computes
the statistics of every parameter once per call; on a real model's width that is over 10 GB and
10 minutes. Here each entry, as its module finishes, is cut into its calls along the tokens
(a leaf whose first dimension is the token count holds each call's rows; any other leaf, a
parameter, is the same in every call and its statistics are computed once), its statistics are
kept as dump.json text per call and its arrays dropped: memory holds the weights, one module's
activations and the text. The files are those ``write_dump`` writes for the same entries.
"""
import json
import os
from pathlib import Path

from .record import Leaf
from .writer import leaf_json


class CallDump:
    """One dump folder made of the calls of one forward over ``tokens`` tokens: call ``n`` holds
    the rows ``spans[n]`` of every token-indexed leaf; ``rename(key, n)`` gives call ``n``'s key of an
    entry keyed ``key`` in the forward (its ``...forward.0``)."""

    def __init__(self, folder, tokens: int, spans: list, rename):
        self.folder = Path(folder)
        self.tokens = tokens
        self.spans = spans
        self.rename = rename
        self._text: list = [[] for _ in spans]
        self._tree: list = []

    def add(self, entry) -> None:
        """Keep ``entry``'s statistics in every call; nothing of its arrays."""
        same: dict = {}          # id of a leaf the calls share -> its statistics (computed once)
        for n, (lo, hi) in enumerate(self.spans):
            key = self.rename(entry.key, n)
            value = {"input_args": [self._json(v, lo, hi, same) for v in entry.input_args],
                     "input_kwargs": {k: self._json(v, lo, hi, same) for k, v in entry.input_kwargs.items()},
                     "output": [self._json(v, lo, hi, same) for v in entry.output],
                     "parameters": {k: self._json(v, lo, hi, same) for k, v in entry.parameters.items()}}
            self._text[n].append(_member(key, value))
        self._tree.append((entry.start, entry.key, entry.parent))

    @property
    def modules(self) -> int:
        """Entries per call."""
        return len(self._tree)

    def _json(self, item, lo: int, hi: int, same: dict):
        if isinstance(item, Leaf):
            if item.data.ndim and item.data.shape[0] == self.tokens:
                return leaf_json(Leaf(item.data[lo:hi], item.dtype, item.requires_grad), None)
            if id(item) not in same:
                same[id(item)] = leaf_json(item, None)
            return same[id(item)]
        if isinstance(item, list):
            return [self._json(v, lo, hi, same) for v in item]
        if isinstance(item, dict):
            return {k: self._json(v, lo, hi, same) for k, v in item.items()}
        return item

    def write(self) -> Path:
        """dump.json (entries call by call, each call's in the order they finished) and
        construct.json (call by call, each call's modules in start order)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        head = json.dumps({"task": "statistics", "level": "L0", "framework": "pytorch", "dump_data_dir": None},
                          indent=1)[:-2]
        members = (m for call in self._text for m in call)
        _write(self.folder / "dump.json", head + ',\n "data": {\n' + ",\n".join(members) + "\n }\n}")
        tree = sorted(self._tree, key=lambda t: t[0])
        construct = {self.rename(key, n): self.rename(parent, n) if parent else None
                     for n in range(len(self.spans)) for _start, key, parent in tree}
        _write(self.folder / "construct.json", json.dumps(construct, indent=1))
        return self.folder


def _member(key: str, value: dict) -> str:
    """``"key": value`` as ``json.dump(..., indent=1)`` writes it inside ``"data"`` (two levels in)."""
    text = json.dumps({key: value}, indent=1)[2:-2]
    return " " + text.replace("\n", "\n ")


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
