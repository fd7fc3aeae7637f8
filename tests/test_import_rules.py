"""The layering of docs/architecture.md, checked on the source: which package may import which, no
private name crossing a module, no import cycle, no module over 600 lines. Every import counts,
also one inside a function or under TYPE_CHECKING: a lazy import is still a dependency."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("openclaw", "engine", "connectors", "skills", "sandbox")
MAX_LINES = 600
# The daemon's composition root: the only modules that may name a connector.
COMPOSITION_ROOT = ("openclaw.daemon", "openclaw.channels", "openclaw.cli")
CONTRACT = "openclaw.gateway.contract"


@dataclass(frozen=True)
class Import:
    importer: str  # the module that imports ("openclaw.gateway.gateway")
    target: str  # the module imported ("openclaw.store.store")
    names: tuple[str, ...]  # names taken from it by `from ... import`
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}" + (
            f" ({', '.join(self.names)})" if self.names else "")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(packages: tuple[str, ...] = PACKAGES) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


MODULES = {module_name(path) for path in source_files()}


def resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path) -> Iterator[Import]:
    importer = module_name(path)
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = resolve(importer, is_package, node)
            plain = []
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:  # `from pkg import module`
                    yield Import(importer, f"{base}.{alias.name}", (), node.lineno)
                else:
                    plain.append(alias.name)
            if plain:
                yield Import(importer, base, tuple(plain), node.lineno)


def ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


ALL_IMPORTS = [imp for path in source_files() for imp in imports_of(path) if ours(imp.target)]


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_engine_and_sandbox_import_nothing_else_of_ours():
    wrong = [str(i) for i in ALL_IMPORTS
             if within(i.importer, "engine") and not within(i.target, "engine")
             or within(i.importer, "sandbox") and not within(i.target, "sandbox")]
    assert not wrong, "\n".join(wrong)


def test_skills_import_only_skills_and_sandbox():
    wrong = [str(i) for i in ALL_IMPORTS
             if within(i.importer, "skills") and not within(i.target, "skills", "sandbox")]
    assert not wrong, "\n".join(wrong)


def test_connectors_import_only_the_gateway_contract_of_the_daemon():
    wrong = [str(i) for i in ALL_IMPORTS if within(i.importer, "connectors")
             and not within(i.target, "connectors") and i.target != CONTRACT]
    assert not wrong, "\n".join(wrong)


def test_only_the_composition_root_names_a_connector():
    wrong = [str(i) for i in ALL_IMPORTS if within(i.target, "connectors")
             and not within(i.importer, "connectors", *COMPOSITION_ROOT)]
    assert not wrong, "\n".join(wrong)


def test_a_builtin_skills_internals_stay_in_skills():
    """The daemon and the skill API reach built-in skills through the registry, which names
    them; never into one's modules."""
    wrong = [str(i) for i in ALL_IMPORTS if within(i.target, "skills.builtin")
             and not within(i.importer, "skills.builtin", "skills.registry")]
    assert not wrong, "\n".join(wrong)


def test_no_private_name_is_imported_from_another_module():
    files = list(source_files()) + list(source_files(("tests", "bench")))
    wrong = [str(i) for path in files for i in imports_of(path)
             if ours(i.target) and any(n.startswith("_") and not n.startswith("__") for n in i.names)]
    assert not wrong, "\n".join(wrong)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan's
    algorithm, iterative): each is a set of modules that import each other, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is None:
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
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return sorted(found)


def test_no_import_cycles_between_modules():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in ALL_IMPORTS:
        if i.target in MODULES and i.target != i.importer:
            graph[i.importer].add(i.target)
    found = cycles(graph)
    assert not found, "\n".join(" <-> ".join(c) for c in found)


def test_cycles_finds_each_cycle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}) == [
        ["a", "b"], ["c", "d"]]


def test_no_module_over_600_lines():
    files = list(source_files()) + [p for p in (ROOT / "tests").rglob("*.py")
                                    if not p.name.startswith("test_")]
    long = [f"{p.relative_to(ROOT)}: {n}" for p in files
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)
