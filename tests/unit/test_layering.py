"""DESIGN §2 as a test: ``core`` is pure and imports nothing of ours outside core; the
controller, the client SDK, the recommender and the broker depend on core (and on the shared
wire edges), never on each other."""

from __future__ import annotations

import ast
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

ALLOWED: dict[str, set[str]] = {
    "scalable_topics.core": {"scalable_topics.core"},
    "scalable_topics.controller": {"scalable_topics.core", "scalable_topics.controller"},
    "scalable_topics.client": {"scalable_topics.core", "scalable_topics.client"},
    "scalable_topics.recommender": {"scalable_topics.core", "scalable_topics.recommender"},
    "segment_broker": {"scalable_topics.core", "segment_broker"},
}
IO_MODULES = {"asyncio", "aiohttp", "socket", "subprocess", "kubernetes", "kubernetes_asyncio"}


def _module_name(path: Path) -> str:
    for package, root in PACKAGES.items():
        if path.is_relative_to(root):
            parts = path.relative_to(root).with_suffix("").parts
            return ".".join((package, *(p for p in parts if p != "__init__")))
    raise ValueError(path)


def _imports(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Absolute names of every module ``source`` (the text of ``module``) imports, relative
    imports resolved."""
    package = module if is_package else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def _imports_of(path: Path) -> set[str]:
    return _imports(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _layer(module: str) -> str | None:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


SOURCES = sorted(p for root in PACKAGES.values() for p in root.rglob("*.py"))


def _violations(module: str, imports: set[str]) -> list[str]:
    layer = _layer(module)
    if layer is None:
        return []
    allowed = ALLOWED[layer] | (set() if layer == "scalable_topics.core" else SHARED_EDGES)
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
