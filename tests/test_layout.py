"""The package's shape, kept: no module over the line budget, at most 12 modules directly in
aotgrad/, and no import cycle between modules (an import inside a function counts: it is a
dependency all the same, only a later one). A newcomer reads the stages bottom up because of it.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "aotgrad"
MAX_LINES = 600
MAX_TOP_LEVEL_MODULES = 12  # __init__.py aside
SUBPACKAGES = {"autograd", "backends", "cache", "capture", "compat", "partition", "replay",
               "runtime", "semantics"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _base(node: ast.ImportFrom, name: str, path: pathlib.Path) -> str:
    if not node.level:
        return node.module or ""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    up = package[:len(package) - (node.level - 1)]
    return ".".join(up + ([node.module] if node.module else []))


def imported(name: str, path: pathlib.Path) -> set[str]:
    """The aotgrad modules `name` imports, wherever the import statement stands.
    `from pkg import x` depends on the submodule pkg.x when there is one, else on pkg's
    __init__ (which defines x): a sibling reaching into its package's __init__ is an edge."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, name, path)
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def import_graph() -> dict[str, set[str]]:
    return {name: imported(name, path) for name, path in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root); on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop(); on_stack.discard(w); component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_within_line_budget(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines; split it by stage (budget {MAX_LINES})"


def test_few_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_subpackages_are_the_pipeline_rooms():
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert found == SUBPACKAGES


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_schema_is_at_the_bottom():
    assert imported("aotgrad.schema", MODULES["aotgrad.schema"]) == set()


def test_cycle_finder_sees_a_lazy_import_into_a_package_init():
    # compat/tools.py importing aot_function from compat/__init__.py inside a function, while
    # compat/__init__.py imports tools: the cycle this layout once had, and must not again.
    edges = {"aotgrad.compat": {"aotgrad.compat.tools"}, "aotgrad.compat.tools": set()}
    tree = ast.parse("def f():\n    from . import aot_function\n")
    node = tree.body[0].body[0]
    edges["aotgrad.compat.tools"].add(_base(node, "aotgrad.compat.tools",
                                            PACKAGE / "compat" / "tools.py"))
    assert cycles(edges) == [["aotgrad.compat", "aotgrad.compat.tools"]]


def _meta_keys(tree: ast.AST) -> set[str]:
    """String keys read or written through `.meta[...]` or `.meta.get(...)`."""
    keys = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "meta" and isinstance(node.slice, ast.Constant)):
            keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "setdefault", "pop")
              and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "meta"
              and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
    return keys


def test_every_meta_key_is_listed_in_schema():
    schema = MODULES["aotgrad.schema"].read_text()
    used = set().union(*(_meta_keys(ast.parse(p.read_text())) for p in MODULES.values()))
    assert used and not [k for k in sorted(used) if f'"{k}"' not in schema]


def test_aotgrad_meta_keys_are_defined_in_schema_only():
    # aotgrad's own keys are named "aotgrad..." (GRAPH_INFO is "aotgrad" itself).
    for name, path in MODULES.items():
        if name == "aotgrad.schema":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                value = node.value.value
                assert not (isinstance(value, str) and value.startswith("aotgrad_")
                            and all(isinstance(t, ast.Name) and t.id.isupper()
                                    for t in node.targets)), (name, value)
