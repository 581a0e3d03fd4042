"""The package's layout, checked: no function-level import of the package's own modules outside the places that
need one, and no runtime module past 700 lines. (The layers themselves: `lint-imports`, run by CI, with the
contract in pyproject.toml.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torch_lwlrap"

#: Where a function-level import of the package's own modules is wanted: the public names loaded on first use, and
#: the command line and the doctor, which import torch late (``--help`` must not pay for it).
LATE_IMPORTS_ALLOWED = ("__init__.py", "cli/", "doctor.py")

MODULES = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py"))


def _late_imports(tree: ast.AST):
    """``(line, module)`` of every import of ``torch_lwlrap`` inside a function body."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch_lwlrap":
                found.append((node.lineno, node.module))
            elif isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "torch_lwlrap"]
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if not m.startswith(LATE_IMPORTS_ALLOWED)])
def test_no_function_level_import_of_the_package(module):
    found = _late_imports(ast.parse((PACKAGE / module).read_text()))
    assert not found, f"{module} imports the package inside functions at {found}: import at the top (layers point down)"


def test_the_check_finds_a_function_level_import():
    tree = ast.parse("def f():\n    from torch_lwlrap import _ranking\n    import torch_lwlrap.plot\n")
    assert _late_imports(tree) == [(2, "torch_lwlrap"), (3, "torch_lwlrap.plot")]


@pytest.mark.parametrize("module", MODULES)
def test_no_runtime_module_past_700_lines(module):
    lines = len((PACKAGE / module).read_text().splitlines())
    assert lines <= 700, f"{module} has {lines} lines: split it by audience"
