"""aotgrad must not use torch's own AOTAutograd: it replaces it."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aotgrad"
FORBIDDEN = (
    "torch._functorch.aot_autograd",
    "torch._functorch._aot_autograd",
    "torch._functorch.partitioners",
    "torch._dynamo.backends.common",
    "torch._dynamo.compiled_autograd",
    "functorch.compile",
)
SOURCES = sorted(PACKAGE.rglob("*.py"))


def imported_modules(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def is_forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_forbidden_imports(path):
    tree = ast.parse(path.read_text())
    assert not [m for m in imported_modules(tree) if is_forbidden(m)]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_no_forbidden_module_named_in_code(path):
    # Catches importlib.import_module("...") and sys.modules lookups as well.
    strings = [n.value for n in ast.walk(ast.parse(path.read_text()))
               if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    code_strings = [s for s in strings if "\n" not in s]  # docstrings are prose
    assert not [s for s in code_strings if any(f in s for f in FORBIDDEN)]


def test_checker_catches_a_forbidden_import():
    tree = ast.parse("from torch._functorch.aot_autograd import aot_function")
    assert any(is_forbidden(m) for m in imported_modules(tree))
    tree = ast.parse("from torch._functorch import aot_autograd")
    assert any(is_forbidden(m) for m in imported_modules(tree))
