"""The docs name code and tests (`openclaw/gateway/gateway.py:Gateway.handle`,
`tests/sandbox/test_runner.py::test_...`): each name must still be there, so a move or a rename
that forgets the docs fails here instead of misleading the next reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `path.py:Name.attr` and `path.py::test_name`, as the docs write them (in backticks or links).
REFERENCE = re.compile(r"\b((?:[\w-]+/)*[\w-]+\.py)(::?)([A-Za-z_][\w.]*)")


def references() -> list[tuple[str, str, str, str]]:
    found = []
    for doc in DOCS:
        for match in REFERENCE.finditer(doc.read_text()):
            found.append((doc.name, *match.groups()))
    return found


def defined_names(path: Path) -> set[str]:
    """Every top-level name of a module and every attribute of its classes, as "Class.attr"
    (nested classes too)."""
    names: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(prefix + t.id for t in targets if isinstance(t, ast.Name))

    walk(ast.parse(path.read_text()).body, "")
    return names


def test_the_docs_name_code_that_exists():
    missing = []
    for doc, file, sep, name in references():
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{doc}: {file} (no such file)")
        elif name not in defined_names(path):
            missing.append(f"{doc}: {file}{sep}{name} (not defined there)")
    assert not missing, "\n".join(missing)


def test_the_docs_name_code_at_all():
    """The check above must have something to check: the README's message flow and
    security.md's tests are written as references."""
    docs = {doc for doc, *_ in references()}
    assert {"README.md", "security.md", "architecture.md"} <= docs
