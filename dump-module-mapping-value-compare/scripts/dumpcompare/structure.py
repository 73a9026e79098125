"""Where each pair sits among the others: its containers and the one-sided modules between two
aligned pairs.

These relations, with the previous aligned pair that analysis.py tracks, are stated once, here and
in output_4 (``previous_aligned``, ``containers``, ``one_sided_between``); the root-cause skill
reads them and never works them out again (output_schemas.md, output_4 ``Verdict``).
"""
from __future__ import annotations

import bisect

from .plan import OneSided, Pair
from .naming import ModuleRecord

# One-sided modules that stand for the whole model or a wrapper around it: they enclose every
# pair, so they are never a module "between" two of them.
_ENCLOSING_ROLES = ("wrapper", "model", "root")


def containers(pairs: list[Pair], train: list[ModuleRecord]) -> dict[str, list[str]]:
    """pid -> pids of the pairs whose single train module holds every train module of the pair
    (by path, so wrappers do not matter), innermost first.

    A module called several times (calls kept apart, ``--no-fold-calls``) has one pair per call;
    the call holding a pair is the first one written after it, since a module's entry is written
    when its forward returns, after its children's (the last one before it when none follows)."""
    calls: dict[str, tuple[list[int], list[str]]] = {}      # path -> (train indices, pids), in order
    for p in pairs:
        if len(p.train) == 1:
            idx, pids = calls.setdefault(train[p.train[0]].path, ([], []))
            idx.append(p.train[0])
            pids.append(p.pid)
    out = {}
    for p in pairs:
        paths = [train[i].path for i in p.train]
        parts = paths[0].split(".")
        found = []
        for n in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:n])
            if prefix in calls and all(x.startswith(prefix + ".") for x in paths):
                idx, pids = calls[prefix]
                found.append(pids[min(bisect.bisect_right(idx, max(p.train)), len(pids) - 1)])
        out[p.pid] = found
    return out


def first_children(pairs: list[Pair], held_by: dict[str, list[str]]) -> dict[str, str]:
    """container pid -> the first pair in execution order that it holds."""
    out: dict[str, str] = {}
    for p in pairs:
        for c in held_by[p.pid]:
            out.setdefault(c, p.pid)
    return out


class OneSidedWindows:
    """The one-sided modules between two aligned pairs, found per layer by the positions (in
    pair order) of the pairs each one-sided module sits between."""

    def __init__(self, one_sided: list[OneSided], recs: dict[str, list[ModuleRecord]], pairs: list[Pair]):
        self.pos = {p.pid: i for i, p in enumerate(pairs)}
        self.recs = recs
        end = len(pairs)
        self.by_layer: dict[int | None, list[tuple[int, int, OneSided]]] = {}
        for o in one_sided:
            r = recs[o.side][o.rec]
            if r.role in _ENCLOSING_ROLES:
                continue
            before = self.pos.get(o.before_pair, -1) if o.before_pair else -1
            after = self.pos.get(o.after_pair, end) if o.after_pair else end
            self.by_layer.setdefault(r.layer, []).append((before, after, o))

    def between(self, start: str | None, end: Pair, end_is_container: bool) -> list[dict]:
        """References ``{side, key, module}`` to the one-sided modules of ``end``'s layer that run
        after the aligned pair ``start`` (None: from the beginning) and before ``end``.

        A non-container's own children run after it received its inputs, so they cannot explain
        inputs that already differ and are left out."""
        lo = self.pos[start] if start is not None else -1
        hi = self.pos[end.pid]
        inside = () if end_is_container else tuple(
            self.recs[s][i].path + "." for s, idx in (("train", end.train), ("rollout", end.rollout)) for i in idx)
        out = []
        for before, after, o in self.by_layer.get(end.layer, ()):
            r = self.recs[o.side][o.rec]
            if before >= lo and after <= hi and not r.path.startswith(inside):
                out.append({"side": o.side, "key": r.key, "module": r.path})
        return out
