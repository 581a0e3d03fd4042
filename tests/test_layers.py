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


#: The names whose use decides which backend runs: only the dispatch calls them (each backend defines its own
#: ``unavailable_reason`` and may use the numba runtime's, and the doctor reports what the dispatch says).
DECIDING_NAMES = {"unavailable_reason", "is_available", "compiled_cpu_allowed", "handles_target"}
BACKENDS = {
    "_numba_kernel.py", "_numba_counts.py", "_numba_rules.py", "_bootstrap_kernel.py", "_triton_kernel.py",
    "_numba_runtime.py", "_engine_config.py", "_ltr_numba.py",
}


def _deciding_calls(tree: ast.AST):
    """``(line, name)`` of every call of a deciding name (``f(...)`` or ``module.f(...)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in DECIDING_NAMES:
                owner = func.value if isinstance(func, ast.Attribute) else None
                if isinstance(owner, ast.Attribute) and owner.attr in ("cuda", "distributed"):
                    continue  # torch.cuda.is_available(), torch.distributed.is_available()
                if isinstance(owner, ast.Name) and owner.id in ("dist",):
                    continue
                found.append((node.lineno, name))
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if m not in BACKENDS and m != "_dispatch.py"])
def test_only_the_dispatch_asks_the_backends_what_they_serve(module):
    found = _deciding_calls(ast.parse((PACKAGE / module).read_text()))
    assert not found, f"{module} asks a backend whether it runs at {found}: ask torch_lwlrap._dispatch instead"


def test_the_dispatch_check_finds_a_decision():
    tree = ast.parse("a = _numba_kernel.is_available(d)\nb = torch.cuda.is_available()\nc = compiled_cpu_allowed()\n")
    assert _deciding_calls(tree) == [(1, "is_available"), (3, "compiled_cpu_allowed")]


def test_forward_and_the_device_move_are_written_once_in_the_metric_base():
    import torch_lwlrap
    from torch_lwlrap.metrics._base import TaggedMetric

    classes = [getattr(torch_lwlrap, name) for name in torch_lwlrap.metrics.__all__]
    for cls in classes:
        assert issubclass(cls, TaggedMetric), cls
        for klass in cls.__mro__:
            if klass is TaggedMetric:
                break
            for method in ("forward", "_apply"):
                assert method not in vars(klass), f"{klass.__name__} defines {method}: the metric base owns it"
