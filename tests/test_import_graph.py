"""No import circle in either skill's package: the graph is built from the source with ``ast``,
every import counted (module level, inside functions, under ``TYPE_CHECKING``), so a circle hidden
behind a late import fails here too."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"dumpcompare": REPO / "dump-module-mapping-value-compare" / "scripts" / "dumpcompare",
            "rootcause": REPO / "rl-consistency-analysis" / "scripts" / "rootcause"}


def _modules() -> dict[str, tuple[Path, bool]]:
    """dotted module name -> (file, is a package's __init__)."""
    out = {}
    for pkg, root in PACKAGES.items():
        for f in sorted(root.rglob("*.py")):
            parts = [pkg, *f.relative_to(root).with_suffix("").parts]
            init = parts[-1] == "__init__"
            out[".".join(parts[:-1] if init else parts)] = (f, init)
    return out


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _targets(name: str, f: Path, init: bool, modules: dict) -> set[str]:
    """The package modules ``name`` imports; importing ``a.b.c`` also runs ``a.b``'s __init__."""
    here = name if init else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".")[:len(here.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            subs = [f"{mod}.{a.name}" for a in node.names]
            # ``from pkg import sub`` loads the submodule; ``from pkg import name`` runs pkg itself.
            found |= {s for s in subs if s in modules}
            if not all(s in modules for s in subs):
                found.add(mod)
    deps = set()
    for t in found:
        if t.split(".")[0] in PACKAGES:
            deps |= ({t} | _ancestors(t)) & set(modules)
    # A module's own packages are already being imported when it runs: no edge to them.
    return deps - {name} - _ancestors(name)


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, for both skills."""
    modules = _modules()
    return {name: _targets(name, f, init, modules) for name, (f, init) in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_graph_sees_both_packages_and_late_imports():
    graph = import_graph()
    assert "dumpcompare.refforward" in graph and "rootcause.cli" in graph
    # refforward imports the numpy engine inside run(): that edge must be in the graph.
    assert "dumpcompare.refmodel" in graph["dumpcompare.refforward"]


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    assert circles(import_graph()) == []
