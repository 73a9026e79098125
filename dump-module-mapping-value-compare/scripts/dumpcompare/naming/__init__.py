"""Normalise module keys: strip wrappers, find layer and role, and say which point each leaf carries.

Everything engine-specific lives in ``profiles.yaml`` (data, overridable with ``--naming``);
this module only interprets it. The output is one :class:`ModuleRecord` per entry.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..dtypes import is_int_dtype
from ..records import FORWARD, Dump, Entry
from ..userconfig import builtin, check_regex, merge, read_user_yaml

_BUILTIN = Path(__file__).with_name("profiles.yaml")


@dataclass(slots=True)
class Port:
    """One leaf of a module and the logical tensor it carries."""
    leaf: str                  # leaf name inside the entry
    point: str                 # e.g. "L3.q", "L3.q+L3.k+L3.v", "M.logits"
    io: str                    # "in", "out" or "param"

    @property
    def parts(self) -> list[str]:
        return self.point.split("+")


@dataclass(slots=True)
class ModuleRecord:
    """A parsed, normalised entry (output_1 row)."""
    side: str
    index: int                 # position among this side's entries
    key: str
    kind: str                  # module | api
    direction: str
    path: str                  # wrappers stripped
    raw_path: str
    cls: str
    call: int
    layer: int | None
    local: str                 # path inside the layer (or the whole path outside layers)
    role: str | None           # None when no rule explains the key
    block: str
    family: str
    parts: tuple[str, ...] = ()     # a fused module's parts; the empty tuple shared by all others
    ports: list[Port] = field(default_factory=list)
    is_wrapper: bool = False
    calls: int = 1             # repeated calls folded into this entry

    @property
    def scope(self) -> str:
        return f"L{self.layer}" if self.layer is not None else "M"

    @property
    def canonical(self) -> str:
        """Identity used to pair modules across sides (role-based when a rule explains it)."""
        if self.role is not None and self.role not in ("dropout", "wrapper"):
            return f"{self.scope}.{self.role}"
        return f"path:{self.path}"


# Where a profile holds regular expressions ("*": every item or key), and the capturing groups
# each needs; checked when a user file is read so that a bad pattern is an input error.
_REGEX_KEYS = (
    (("layer_regex",), 1),
    (("roles", "*", "local", "*"), 0), (("roles", "*", "model", "*"), 0),
    (("ports", "*", "*", "*", "when", "class"), 0),
    (("aliases", "*", "*", "if_role_class", "*"), 0),
    (("by_design_differences", "*", "classes", "*"), 0),
    (("tensor_parallel", "overrides", "*", "module"), 0), (("tensor_parallel", "overrides", "*", "leaf"), 0),
)


def load_profiles(user_file: str | None = None) -> dict:
    """Built-in profiles merged with an optional user YAML file (read with a safe loader).

    The user file must have the shape of the built-in one and valid regular expressions;
    otherwise InputError names the file and the key.
    """
    prof = builtin(_BUILTIN)
    if not user_file:
        return prof
    user = read_user_yaml(user_file, "naming profile", like=prof)
    for keys, groups in _REGEX_KEYS:
        for where, pattern in _at_keys(user, keys, ""):
            check_regex(user_file, "naming profile", where, pattern, groups)
    return merge(prof, user)


def _at_keys(doc, keys: tuple, where: str):
    """(dotted key, value) for every value of ``doc`` found along ``keys``."""
    if not keys:
        yield where, doc
        return
    head, rest = keys[0], keys[1:]
    if head == "*":
        items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
        for k, v in items:
            yield from _at_keys(v, rest, f"{where}[{k}]" if isinstance(doc, list) else f"{where}.{k}")
    elif isinstance(doc, dict) and head in doc:
        yield from _at_keys(doc[head], rest, f"{where}.{head}" if where else head)


class Namer:
    """Applies one merged profile to the entries of one side."""

    def __init__(self, profiles: dict, model_layers: int | None = None):
        self.p = profiles
        # The checkpoint's layer count (--model), when known: the final norm follows the model's last
        # layer, which a dump of a layer range (msprobe's scope) does not reach.
        self.model_layers = model_layers
        w = profiles.get("wrappers", {})
        self.wrap_segments = set(w.get("segments", []))
        self.lead_segments = set(w.get("leading_segments", []))
        self.wrap_classes = set(w.get("classes", []))
        self.layer_re = re.compile(profiles["layer_regex"])
        self.roles = []
        for r in profiles.get("roles", []):
            for scope_key in ("local", "model"):
                for pat in r.get(scope_key, []) or []:
                    self.roles.append((scope_key, re.compile(f"^(?:{pat})$"), r))
        self.activation_like = {a.lower() for a in profiles.get("activation_like", [])}
        # A module's every call, and every layer's copy of a rule, asks the same questions again:
        # answers kept per path, family and point (a dump of many modules asks tens of thousands).
        self._stripped: dict[str, str] = {}
        self._classified: dict[str, tuple] = {}
        self._port_tables: dict[str, list[dict]] = {}
        self._expanded: tuple[dict | None, dict] = (None, {})

    # -- path normalisation -------------------------------------------------------------
    def strip_wrappers(self, raw: str) -> str:
        """Remove wrapper segments anywhere, and DDP/Float16Module ``module.`` at the start.

        A leading number is the index in Megatron-LM's list of model chunks (msprobe is started on
        the list): ``0.module.module.decoder...``. Several chunks (virtual pipeline) were split into
        stages before naming (loaders/joining.split_chunks), so one index is left at most.
        """
        got = self._stripped.get(raw)
        if got is None:
            got = self._stripped[raw] = self._strip(raw)
        return got

    def _strip(self, raw: str) -> str:
        segs = [s for s in raw.split(".") if s and s not in self.wrap_segments] if raw else []
        if len(segs) > 1 and segs[0].isdigit() and segs[1] in self.lead_segments:
            segs = segs[1:]
        while segs and segs[0] in self.lead_segments:
            segs = segs[1:]
        return ".".join(segs)

    def detect_family(self, entries: list[Entry]) -> str:
        """Guess the engine family of a side from its classes and paths."""
        classes = {e.cls for e in entries if e.kind == "module"}
        paths = [self.strip_wrappers(e.raw_path) for e in entries if e.kind == "module"]
        for fam in self.p.get("families", []):
            if classes & set(fam.get("classes", [])):
                return fam["name"]
            for marker in fam.get("path_markers", []) or []:
                if any(marker in p for p in paths):
                    return fam["name"]
        return "hf"

    def classify(self, path: str) -> tuple[int | None, str, dict | None]:
        """Return (layer, local path, role rule or None) for a normalised path."""
        got = self._classified.get(path)
        if got is None:
            got = self._classified[path] = self._classify(path)
        return got

    def _classify(self, path: str) -> tuple[int | None, str, dict | None]:
        m = None
        for m in self.layer_re.finditer(path):
            pass
        if m is not None:
            layer = int(m.group(1))
            local = path[m.end():]
            scope_key = "local"
        else:
            layer, local, scope_key = None, path, "model"
        for key, rx, rule in self.roles:
            if key == scope_key and rx.match(local):
                return layer, local, rule
        return layer, local, None

    def is_activation_like(self, rec: ModuleRecord) -> bool:
        """True for modules whose name or class says they compute an activation."""
        last = rec.local.split(".")[-1].lower() if rec.local else ""
        return rec.role == "act" or last in self.activation_like or rec.cls.lower() in self.activation_like

    # -- ports ----------------------------------------------------------------------------
    def family_ports(self, family: str) -> list[dict]:
        """Port tables to consult for a family, most specific first, ending with hf."""
        got = self._port_tables.get(family)
        if got is None:
            got = self._port_tables[family] = self._family_ports(family)
        return got

    def _family_ports(self, family: str) -> list[dict]:
        chain, fam = [], family
        while fam and fam not in [c for c, _ in chain]:
            table = self.p.get("ports", {}).get(fam, {}) or {}
            chain.append((fam, table))
            fam = table.get("inherit")
        if "hf" not in [c for c, _ in chain]:
            chain.append(("hf", self.p.get("ports", {}).get("hf", {})))
        return [t for _, t in chain]

    def ports_for(self, rec: ModuleRecord, entry: Entry, last_layer: int | None,
                  layer_roles: dict, made: dict[str, str] | None = None) -> list[Port]:
        """Assign points to the leaves of one forward entry.

        Points of a later call (``forward.1``, a decode step or a recompute) carry ``@<call>`` so
        that calls meet their own counterparts, or are stitched onto the first call. ``made``: such
        names already made (by value), whose copy is taken instead of a new one.
        """
        ports = self._ports(rec, entry, last_layer, layer_roles)
        if rec.call:
            for p in ports:
                point = "+".join(f"{part}@{rec.call}" for part in p.point.split("+"))
                p.point = point if made is None else made.setdefault(point, point)
        return ports

    def _ports(self, rec: ModuleRecord, entry: Entry, last_layer: int | None, layer_roles: dict) -> list[Port]:
        if rec.is_wrapper:
            return []
        if rec.role is None:
            # No rule explains the module: its leaves meet the same leaves of the same path.
            return [Port(lf.name, f"{rec.canonical}:{lf.name}", _leaf_io(lf.name))
                    for lf in entry.leaves if lf.is_tensor]
        alts = None
        for table in self.family_ports(rec.family):
            for alt in table.get(rec.role, []) or []:
                if self._when(alt.get("when"), rec, entry):
                    alts = alt
                    break
            if alts is not None:
                break
        if alts is None:
            return []
        ports = []
        leaf_names = {lf.name for lf in entry.leaves if lf.is_tensor}
        for leaf, tmpl in alts["map"].items():
            if leaf not in leaf_names:
                continue
            io, point = _split_io(tmpl, leaf)
            point = self._expand(point, rec, last_layer, layer_roles)
            if point is not None:
                ports.append(Port(leaf, point, io))
        mapped = {p.leaf for p in ports}
        for leaf in sorted(leaf_names - mapped):
            if leaf.startswith("parameters."):
                pname = leaf.split(".", 1)[1]
                ports.append(Port(leaf, self._param_point(rec, pname), "param"))
        return ports

    def _param_point(self, rec: ModuleRecord, pname: str) -> str:
        if rec.parts:
            return "+".join(f"{rec.scope}.{part}.{pname}" for part in rec.parts)
        return f"{rec.scope}.{rec.role}.{pname}"

    def _when(self, cond: dict | None, rec: ModuleRecord, entry: Entry) -> bool:
        if not cond:
            return True
        if "min_args" in cond and entry.n_args < int(cond["min_args"]):
            return False
        if "first_layer" in cond and (rec.layer == 0) != bool(cond["first_layer"]):
            return False
        if "class" in cond and not re.search(cond["class"], rec.cls):
            return False
        if "int_leaf" in cond:
            leaf = next((lf for lf in entry.leaves if lf.name == cond["int_leaf"]), None)
            if leaf is None or not is_int_dtype(leaf.dtype):
                return False
        return True

    def _expand(self, point: str, rec: ModuleRecord, last_layer: int | None, layer_roles: dict) -> str | None:
        # The expansion depends on the point, the record's layer and family, the last layer and the
        # layer roles; the memo is kept for one layer_roles (one side being named) and holds it, so
        # that no later table can take its identity.
        held, memo = self._expanded
        if held is not layer_roles:
            memo = {}
            self._expanded = (layer_roles, memo)
        key = (point, rec.layer, rec.family, last_layer)
        if key not in memo:
            memo[key] = self._expand_point(point, rec, last_layer, layer_roles)
        return memo[key]

    def _expand_point(self, point: str, rec: ModuleRecord, last_layer: int | None, layer_roles: dict) -> str | None:
        scope = rec.scope
        prev = f"L{rec.layer - 1}" if rec.layer else None
        if "{P}" in point and prev is None:
            return None
        if "{LAST}" in point and last_layer is None:
            return None
        last = f"L{last_layer}" if last_layer is not None else ""
        out = []
        for part in point.split("+"):
            part = self._alias(part, rec, layer_roles)
            part = part.replace("{L}", scope).replace("{P}", prev or "").replace("{LAST}", last)
            out.append(canonical_point(part))
        return "+".join(out)

    def _alias(self, part: str, rec: ModuleRecord, layer_roles: dict) -> str:
        aliases = self.p.get("aliases", {}) or {}
        rule = (aliases.get(rec.family, {}) or {}).get(part) or (aliases.get("all", {}) or {}).get(part)
        if not rule:
            return part
        role, cls = next(iter(rule["if_role_class"].items()))
        # A model-level module (layer None) asks whether any layer has the role: all layers of one
        # model are built alike.
        have = (layer_roles.get((rec.layer, role)) if rec.layer is not None
                else next((c for (_, r), c in layer_roles.items() if r == role), None))
        return rule["then"] if have is not None and re.search(cls, have) else rule["else"]


def _leaf_io(leaf: str) -> str:
    if leaf.startswith("parameters."):
        return "param"
    return "out" if leaf.startswith("output") else "in"


def _split_io(tmpl: str, leaf: str) -> tuple[str, str]:
    for pre in ("in:", "out:"):
        if tmpl.startswith(pre):
            return pre[:-1], tmpl[len(pre):]
    return _leaf_io(leaf), tmpl


def canonical_point(p: str) -> str:
    """Fold equal points to one name: a layer's input stream is the previous layer's output."""
    m = re.match(r"^L(\d+)\.resid_in$", p)
    if m and int(m.group(1)) > 0:
        return f"L{int(m.group(1)) - 1}.resid_out"
    return p


def name_side(dump: Dump, side: str, namer: Namer, family: str | None = None,
              made: dict[str, str] | None = None) -> tuple[str, list[ModuleRecord]]:
    """Parse every entry of one side into records; returns (family, records in dump order).

    The point names of later calls are made per port, and a producer's output and its consumer's
    input (and the other side's same port) name the same point: one copy of each is kept, from
    ``made`` when the caller shares it between the sides (over many modules, 56k names of 21k).
    """
    made = {} if made is None else made
    fam = family or namer.detect_family(dump.entries)
    recs: list[ModuleRecord] = []
    raw_paths = [e.raw_path for e in dump.entries if e.kind == "module"]
    wrapper_prefixes = _wrapper_prefixes(raw_paths, namer)
    for e in dump.entries:
        if e.kind == "api":
            recs.append(ModuleRecord(side, e.order, e.key, "api", e.direction, e.raw_path, e.raw_path,
                                     e.cls, e.call, None, e.raw_path, None, "api", fam))
            continue
        path = namer.strip_wrappers(e.raw_path)
        layer, local, rule = namer.classify(path)
        is_wrapper = e.cls in namer.wrap_classes or e.raw_path in wrapper_prefixes
        role = "wrapper" if is_wrapper else (rule["role"] if rule else None)
        block = "wrapper" if is_wrapper else (rule.get("block", "other") if rule else _guess_block(local))
        recs.append(ModuleRecord(side, e.order, e.key, "module", e.direction, path, e.raw_path, e.cls,
                                 e.call, layer, local, role, block, fam,
                                 parts=tuple(rule.get("parts", ())) if rule and not is_wrapper else (),
                                 is_wrapper=is_wrapper, calls=e.n_calls))
    layers = [r.layer for r in recs if r.layer is not None and r.kind == "module"]
    last_layer = max(layers) if layers else None
    if namer.model_layers and (last_layer is None or namer.model_layers - 1 > last_layer):
        last_layer = namer.model_layers - 1
    layer_roles = {(r.layer, r.role): r.cls for r in recs if r.direction == FORWARD and r.role}
    for r, e in zip(recs, dump.entries):
        if r.kind == "module" and r.direction == FORWARD:
            r.ports = namer.ports_for(r, e, last_layer, layer_roles, made)
    return fam, recs


def _wrapper_prefixes(raw_paths: list[str], namer: Namer) -> set[str]:
    """Raw paths of entries that wrap another entry (``X`` when ``X._fsdp_wrapped_module...`` exists)."""
    out = set()
    for p in raw_paths:
        segs = p.split(".") if p else []
        for i, s in enumerate(segs):
            if s in namer.wrap_segments:
                out.add(".".join(segs[:i]))
    return out


def _guess_block(local: str) -> str:
    low = local.lower()
    for word, block in (("attn", "attention"), ("attention", "attention"), ("mlp", "mlp"),
                        ("norm", "norm"), ("embed", "embedding"), ("head", "head")):
        if word in low:
            return block
    return "other"
