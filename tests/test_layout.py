"""The package's layout: no import cycles, no reaching into another package, small files.

Each module is parsed with `ast` (nothing is imported), so the checks see every import,
including those inside functions and under `TYPE_CHECKING`.

- No two modules import each other, directly or through a longer loop.
- No module takes a private module (`layerscope.<pkg>._x`) or a private name (`_x`) of another
  subpackage `<pkg>`: what a package offers others is its face, its `__init__`'s exports or a
  public module. The package root's few private modules (errors, optional imports, the
  version, and `watch()` with its configuration) are shared, but not their private names.
- The root holds only the public face; the stages are packages.
- No source file is over 400 lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "layerscope"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE
MAX_LINES = 400
# The root's modules: the public face and the basics every stage shares.
ROOT_MODULES = {
    "layerscope",
    "layerscope.__main__",
    "layerscope._config",
    "layerscope._errors",
    "layerscope._imports",
    "layerscope._lazy",
    "layerscope._limits",
    "layerscope._schedule",
    "layerscope._version",
    "layerscope._watch",
}


@dataclass(frozen=True, slots=True)
class Import:
    """One module taken by another: `importer` imports `module`, naming `names` from it."""

    importer: str
    module: str
    names: tuple[str, ...]
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _imports(modules: dict[str, Path]) -> Iterator[Import]:
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE):
                        yield Import(name, alias.name, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, is_package, node.level, node.module)
                if not target.startswith(PACKAGE):
                    continue
                plain: list[str] = []
                for alias in node.names:
                    # `from layerscope.pkg import _mod` takes a module, not a name.
                    if f"{target}.{alias.name}" in modules:
                        yield Import(name, f"{target}.{alias.name}", (), node.lineno)
                    else:
                        plain.append(alias.name)
                if plain:
                    yield Import(name, target, tuple(plain), node.lineno)


def _package_of(module: str) -> str:
    """The subpackage a module belongs to (`layerscope.store`), or the root (`layerscope`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or _is_subpackage(module) else PACKAGE


def _is_subpackage(module: str) -> bool:
    return (SOURCE / Path(*module.split(".")[1:]) / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for item in _imports(modules):
        if item.module in modules and item.module != item.importer:
            graph[item.importer].add(item.module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches_in(item: Import) -> str | None:
    """Why `item` reaches into another subpackage, or None when it does not."""
    owner = _package_of(item.module)
    if _package_of(item.importer) == owner:
        return None
    if owner == PACKAGE:  # the root's private modules are shared for now, not their _names
        private_root_names = [name for name in item.names if _is_private(name)]
        return f"private names {private_root_names}" if private_root_names else None
    inner = item.module.split(".")[2:]
    if any(_is_private(part) for part in inner):
        return f"private module {item.module}"
    private_names = [name for name in item.names if _is_private(name)]
    if private_names:
        return f"private names {private_names} of {item.module}"
    return None


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_no_module_reaches_into_another_package() -> None:
    found = [
        f"{item.importer}:{item.line} takes {why}"
        for item in _imports(_modules())
        if (why := _reaches_in(item)) is not None
    ]
    assert found == []


def test_the_root_holds_only_the_public_face() -> None:
    assert {name for name in _modules() if _package_of(name) == PACKAGE} == ROOT_MODULES


def test_no_source_file_is_over_400_lines() -> None:
    long_files = {
        name: lines
        for name, path in _modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long_files == {}


def test_the_checks_see_what_they_look_for() -> None:
    # A check that finds nothing proves little unless it can find something.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _reaches_in(Import("layerscope.cli._serve", "layerscope.ui._server", (), 1))
    assert _reaches_in(Import("layerscope._watch", "layerscope.store", ("_private",), 1))
    assert _reaches_in(Import("layerscope.store._x", "layerscope.store._y", ("_z",), 1)) is None
    assert _reaches_in(Import("layerscope.store._x", "layerscope._errors", ("_z",), 1))
    assert _reaches_in(Import("layerscope.store._x", "layerscope._errors", ("Z",), 1)) is None
    assert len(_modules()) > 50
