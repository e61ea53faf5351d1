"""DESIGN §2 as a test: ``core`` is pure and imports nothing of ours outside core; the
controller, the client SDK, the recommender and the broker depend on core (and on the shared
wire edges), never on each other; the CLI and the local cluster have rules of their own, and
every module of both packages falls under one rule. No two modules import each other, directly
or round a longer cycle, counting imports made only for the type checker and inside functions:
such a cycle is a dependency in both directions all the same."""

from __future__ import annotations

import ast
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "scalable_topics": ROOT / "operator" / "scalable_topics",
    "segment_broker": ROOT / "broker-image" / "segment_broker",
}
SHARED_EDGES = {
    "scalable_topics.brokeradmin",
    "scalable_topics.transferadmin",
    "scalable_topics.kubeapi",
    "scalable_topics.kubeauth",
    "scalable_topics.credentials",
}
"""Wire clients every edge may use: the broker's admin HTTP API (its transfer routes too) and
the Kubernetes connection."""

CORE = "scalable_topics.core"
ROOT_PACKAGE = "scalable_topics"
"""The package's own ``__init__``; a rule for it alone, not for everything below it."""

ALLOWED: dict[str, set[str]] = {
    CORE: {CORE},
    # The shared wire edges: small clients, each of what it needs only.
    "scalable_topics.kubeapi": set(),
    "scalable_topics.credentials": set(),
    "scalable_topics.kubeauth": {CORE, "scalable_topics.kubeapi"},
    "scalable_topics.brokeradmin": {CORE, "scalable_topics.credentials"},
    "scalable_topics.transferadmin": {
        CORE,
        "scalable_topics.brokeradmin",
        "scalable_topics.credentials",
    },
    # The four edges: core and the shared wire clients, never each other.
    "scalable_topics.controller": {CORE, "scalable_topics.controller", *SHARED_EDGES},
    "scalable_topics.client": {CORE, "scalable_topics.client", *SHARED_EDGES},
    "scalable_topics.recommender": {CORE, "scalable_topics.recommender", *SHARED_EDGES},
    "segment_broker": {CORE, "segment_broker", *SHARED_EDGES},
    # The local control plane runs Kubernetes, not our components: core's names only.
    "scalable_topics.localcluster": {CORE, "scalable_topics.localcluster"},
    # The CLI drives the SDK, the API and the local cluster; it is no part of the operator.
    "scalable_topics.cli": {
        CORE,
        "scalable_topics.cli",
        "scalable_topics.client",
        "scalable_topics.localcluster",
        *SHARED_EDGES,
    },
    ROOT_PACKAGE: set(),
}
EXCEPTIONS: dict[str, set[str]] = {
    # The demo's progress line reads Segment.status.load exactly as the operator's autoscaler
    # does, rather than keep a second reading of it.
    "scalable_topics.cli.demo_progress": {"scalable_topics.controller.autoscale"},
}
"""Single modules allowed one more dependency than their layer, each with its reason."""
IO_MODULES = {"asyncio", "aiohttp", "socket", "subprocess", "kubernetes", "kubernetes_asyncio"}


def _module_name(path: Path) -> str:
    for package, root in PACKAGES.items():
        if path.is_relative_to(root):
            parts = path.relative_to(root).with_suffix("").parts
            return ".".join((package, *(p for p in parts if p != "__init__")))
    raise ValueError(path)


def _from_name(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of ``from X import ...`` written in ``package``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Absolute names of every module ``source`` (the text of ``module``) imports, relative
    imports resolved."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _from_name(node, package)
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _imports_of(path: Path) -> set[str]:
    return _imports(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _layer(module: str) -> str | None:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or (layer != ROOT_PACKAGE and module.startswith(layer + ".")):
            return layer
    return None


SOURCES = sorted(p for root in PACKAGES.values() for p in root.rglob("*.py"))


def _violations(module: str, imports: set[str]) -> list[str]:
    layer = _layer(module)
    if layer is None:
        return [f"no rule for {module}"]
    allowed = ALLOWED[layer] | EXCEPTIONS.get(module, set())
    return sorted(
        name
        for name in imports
        if _ours(name)
        and name not in PACKAGES
        and not any(name == a or name.startswith(a + ".") for a in allowed)
        # ``from scalable_topics.core import wire`` also names the package itself
        and not any(a.startswith(name + ".") for a in allowed)
    )


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_layers_import_only_what_design_allows(path: Path) -> None:
    module = _module_name(path)
    wrong = _violations(module, _imports_of(path))
    assert not wrong, f"{module} imports {wrong}"


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGES["scalable_topics"] / "core").rglob("*.py")),
    ids=lambda p: p.name,
)
def test_core_does_no_io(path: Path) -> None:
    io = sorted(n for n in _imports_of(path) if n.split(".")[0] in IO_MODULES)
    assert not io, f"core module {path.name} imports {io}"


def test_the_check_sees_violations_behind_relative_imports() -> None:
    client = "scalable_topics.client.consumers"
    imports = _imports("from ..controller import app\nfrom . import dag\n", client)
    assert "scalable_topics.controller.app" in imports
    assert _violations(client, imports) == [
        "scalable_topics.controller",
        "scalable_topics.controller.app",
    ]
    core = "scalable_topics.core.layout"
    assert _violations(core, _imports("from ..brokeradmin import AdminError\n", core))
    broker = "segment_broker.server"
    assert _violations(broker, _imports("from scalable_topics.client import segment\n", broker))
    assert not _violations(broker, _imports("from scalable_topics.core import wire\n", broker))


# -- import cycles -------------------------------------------------------------------------------

MODULES = {_module_name(p): p for p in SOURCES}


def _module_edges(
    source: str, module: str, modules: Collection[str], *, is_package: bool
) -> set[str]:
    """The modules of ours ``source`` (the text of ``module``) imports, wherever the import
    stands (top level, a function, ``if TYPE_CHECKING:``): ``from pkg import sub`` is an edge to
    ``pkg.sub`` when that is a module, else to ``pkg``; ``import a.b.c`` to the longest of
    ``a.b.c``, ``a.b``, ``a`` that is one."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name:
                    found.add(name)
        elif isinstance(node, ast.ImportFrom):
            name = _from_name(node, package)
            for alias in node.names:
                if f"{name}.{alias.name}" in modules:
                    found.add(f"{name}.{alias.name}")
                elif name in modules:
                    found.add(name)
    found.discard(module)
    return found


def _cycles(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_no_import_cycles() -> None:
    graph = {
        module: _module_edges(
            path.read_text(), module, MODULES, is_package=path.name == "__init__.py"
        )
        for module, path in MODULES.items()
    }
    cycles = _cycles(graph)
    assert not cycles, f"modules importing each other (break with a small types module): {cycles}"


def test_the_cycle_check_sees_type_checking_and_deferred_imports() -> None:
    modules = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    sources = {
        "pkg.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "pkg.b": "from . import a\nfrom pkg.c import C\n",
        "pkg.c": "def late() -> None:\n    from pkg import d\n",
        "pkg.d": "import pkg.c\n",
    }
    graph = {m: _module_edges(s, m, modules, is_package=False) for m, s in sources.items()}
    assert graph == {
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a", "pkg.c"},
        "pkg.c": {"pkg.d"},
        "pkg.d": {"pkg.c"},
    }
    assert _cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    del graph["pkg.d"]
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_every_module_falls_under_a_rule() -> None:
    assert not [m for m in MODULES if _layer(m) is None]
    assert _layer("scalable_topics.newpackage.module") is None
    assert _violations("scalable_topics.newpackage", set()) == [
        "no rule for scalable_topics.newpackage"
    ]
