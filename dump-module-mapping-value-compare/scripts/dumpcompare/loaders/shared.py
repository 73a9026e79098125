"""A module object shared by several numbered blocks, put back under the block that called it.

vLLM builds one rotary-embedding object per distinct rope setting and hands the same object to
every decoder layer (its rope cache), so the module tree holds it under each layer but msprobe
registers it once, under its first path (``model.layers.0.self_attn.rotary_emb``), and numbers its
calls across all layers: call = forward call x layers + layer. The layer that made a call is only
in ``construct.json``, which names each call's parent. A call whose parent is the same place in
another numbered block (``model.layers.1.self_attn`` for ``model.layers.0.self_attn``) is renamed
under that parent, with its call counted per new path, so the mapping sees one rotary module per
layer, as in an engine that does not share it. Any other parent that is not the path's own is left
alone: only a shared object reused at the same place in several blocks is moved.
Why: references/input_formats.md ("Shared modules").
"""
from __future__ import annotations

import re
from dataclasses import replace

from ..records import FORWARD, Entry
from .folding import select_calls
from .msprobe import parse_key

_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def _shape(path: str) -> str:
    return _NUMBER.sub("#", path)


class _Parents:
    """The module path of each parent construct.json names. A generation names a parent per call
    (thousands) among a few hundred modules: parsed once per key without its call number, which
    leaves the parse unchanged (a module key's path lies before the number; no other key ends in
    one)."""

    def __init__(self, construct: dict):
        self.construct = construct
        self.paths: dict[str, str | None] = {}

    def path(self, key: str) -> str | None:
        """The path of the module that made call ``key`` (None: no parent, or not a module)."""
        parent = self.construct.get(key)
        if not isinstance(parent, str):
            return None
        head, _, tail = parent.rpartition(".")
        if not tail.isdecimal():
            return _module_path(parent)
        if head not in self.paths:
            self.paths[head] = _module_path(parent)
        return self.paths[head]


def _module_path(key: str) -> str | None:
    parsed = parse_key(key)
    return parsed[1] if parsed is not None and parsed[0] == "module" else None


def _caller(key: str, raw_path: str, parents: _Parents) -> str | None:
    """The path of the block that made call ``key`` of module ``raw_path`` when it is not the
    module's own parent path but the same place in another numbered block; None otherwise."""
    path = parents.path(key)
    if path is None or "." not in raw_path:
        return None
    own = raw_path.rsplit(".", 1)[0]
    return path if path != own and _shape(path) == _shape(own) else None


def _counterpart(e: Entry | None, own: str, caller: str) -> str | None:
    """The key of the entry at ``e``'s place in block ``caller`` when ``e`` sits in block ``own``."""
    if e is None or e.kind != "module" or not e.raw_path.startswith(own + "."):
        return None
    return f"Module.{caller}{e.raw_path[len(own):]}.{e.cls}.{e.direction}.{e.call}"


def _parent_paths(entries: list[Entry], parents: _Parents) -> dict[str, set]:
    """Per module path, the paths of the modules its calls were made from."""
    out: dict[str, set] = {}
    for e in entries:
        if e.kind != "module" or e.direction != FORWARD:
            continue
        base = e.key.rsplit(".", 1)[0]
        for c in range(e.call, e.call + e.n_calls):
            path = parents.path(f"{base}.{c}")
            if path is not None:
                out.setdefault(e.raw_path, set()).add(path)
    return out


def attribute(entries: list[Entry], construct: dict | None) -> tuple[list[Entry], list[str]]:
    """(entries with each shared module's calls under their calling block, notes). A module counts
    as shared when its calls come from more than one block: a tree whose numbers were all shifted
    together (one parent each, named in another numbering) is not one object reused."""
    if not construct:
        return entries, []
    parents = _Parents(construct)
    shared = {p for p, made_by in _parent_paths(entries, parents).items() if len(made_by) > 1}
    if not shared:
        return entries, []
    seen: dict[tuple, int] = {}
    moved: dict[str, set] = {}
    out, placed = [], []        # placed: (moved entry, key it goes after, key of the parent it goes before)
    for e in entries:
        if not (e.kind == "module" and e.direction == FORWARD and e.raw_path in shared):
            out.append(e)
            continue
        base = e.key.rsplit(".", 1)[0]
        before = out[-1] if out else None
        # The entry's calls (a folded run holds several) grouped by the block that made each.
        by_caller: dict[str | None, list[int]] = {}
        for i in range(e.n_calls):
            by_caller.setdefault(_caller(f"{base}.{e.call + i}", e.raw_path, parents), []).append(i)
        for caller, picks in by_caller.items():
            sub = select_calls(e, picks)
            if caller is None:
                out.append(replace(sub, call=e.call + picks[0], key=f"{base}.{e.call + picks[0]}"))
                continue
            path = f"{caller}.{e.raw_path.rsplit('.', 1)[1]}"
            n = seen.get((path, e.cls), 0)
            seen[(path, e.cls)] = n + len(picks)
            moved.setdefault(e.raw_path, set()).add(caller)
            new = replace(sub, key=f"Module.{path}.{e.cls}.{e.direction}.{n}", raw_path=path, call=n)
            # Calls of a folded run that its first call's block did not make stand at the same place
            # in the block that made them: after the counterpart of the entry the run follows, else
            # right before that block (a module completes before its parent, as msprobe writes them).
            if picks[0] == 0:
                out.append(new)
            else:
                placed.append((new, _counterpart(before, e.raw_path.rsplit(".", 1)[0], caller),
                               construct[f"{base}.{e.call + picks[0]}"]))
    if not moved:
        return entries, []
    for new, after, parent in placed:
        at = next((i + 1 for i, x in enumerate(out) if x.key == after), None) if after else None
        if at is None:
            at = next((i for i, x in enumerate(out) if x.key == parent), len(out))
        out.insert(at, new)
    notes = [f"{src} is one module object shared by {len(dst)} other block(s) (msprobe names it once); its calls "
             f"were put under the block that made each, from construct.json" for src, dst in sorted(moved.items())]
    # The calls left at the shared path count up from 0 again.
    return _renumber(out, set(moved)), notes


def _renumber(entries: list[Entry], paths: set) -> list[Entry]:
    count: dict[tuple, int] = {}
    out = []
    for e in entries:
        if e.kind != "module" or e.raw_path not in paths:
            out.append(e)
            continue
        k = (e.raw_path, e.cls, e.direction)
        n = count.get(k, 0)
        count[k] = n + e.n_calls
        out.append(e if n == e.call else replace(e, key=f"{e.key.rsplit('.', 1)[0]}.{n}", call=n))
    return out
