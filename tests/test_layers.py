"""kforge's packages form layers: no import runs back up them and no import circle joins them.

The order is documented in docs/architecture.md ("Layers"). Every import in every module counts
(module level, inside functions, and under ``TYPE_CHECKING``: an annotation naming a higher
layer's type depends on it too), except the notebook display hooks listed below. Between modules
too, no import circle, however it is imported, except the circles MODULE_CIRCLE_EXCEPTIONS names.

A family folder's strategies module (``kforge.ops.families.<family>.strategies``) is part of the proposers layer;
nothing in ops imports it (the built-in library imports it by the name in ``Family.strategies``), so an import of
it from ops code is caught as one running up the layers.
"""
from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kforge"

# Lowest first. A unit is a subpackage or top-level module of kforge; "kforge" is the package root.
LAYERS: list[set[str]] = [
    {"_version", "_config", "_redact", "_events", "examples", "models", "rewrites"},   # leaves: import no other layer
    {"ops"},                               # operator specs, Variant, Card/Cards, CardVerdict/CardStatus
    {"timing"},                            # the one timing function (kforge/timing.py)
    {"kernels"},                           # contract, compilers, Kernel, DeviceInfo
    {"evaluate"},                          # judges a variant + source + example paths
    {"proposers"},
    {"store"},
    {"capture"},
    {"search"},
    {"cluster"},                           # evaluator actors on a Ray cluster (the search's evaluators)
    {"deploy"},
    {"regions"},                           # graph capture, finder, region spec and generator, graph deploy
    {"session"},
    {"views"},
    {"kforge"},                            # the package root: the user's API
    {"magics", "cli", "doctor"},           # entry points
]
LEVEL = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# The documented notebook display hooks: (importer, imported, function the import lives in).
DISPLAY_HOOKS = {
    ("search", "views", "_ipython_display_"),   # OptimizationRun shows its progress view
    ("session", "views", "_ipython_display_"),  # Session shows its dashboard
    ("session", "views", "dashboard"),          # session.dashboard() returns it
    ("session", "views", "optimize"),           # a blocking optimize() in a notebook shows its progress live
    ("kforge", "magics", "load_ipython_extension"),  # %load_ext kforge
}

# NB: edges that other work in flight removes; the lead deletes each line once that work is merged.
PENDING: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str:
    """The layer unit of a dotted name; an attribute of the package root (``kforge.__version__``) is the root, and
    a family folder's strategies module (or a name in it) is the proposers layer's."""
    parts = module.split(".")
    if len(parts) == 1:
        return "kforge"
    if parts[1:3] == ["ops", "families"] and len(parts) >= 5 and parts[4] == "strategies":
        return "proposers"
    name = parts[1]
    is_module = (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists()
    return name if is_module else "kforge"


def _imports() -> list[tuple[str, str, str, int, str | None]]:
    """(importer unit, imported unit, module, line, enclosing function) for every kforge import."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_init else parts)
        package = module if is_init else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, func: str | None) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, child.name)
                    continue
                targets: list[str] = []
                if isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        target = ".".join(base + ([child.module] if child.module else []))
                    else:
                        target = child.module or ""
                    # `from . import x` and `from kforge import x` name modules or attributes: take each
                    names = [f"{target}.{a.name}" for a in child.names]
                    targets = (names if target == "kforge" or not child.module
                               else [target] + [n for n in names if _unit(n) != _unit(target)])
                elif isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                for t in targets:
                    if t == "kforge" or t.startswith("kforge."):
                        a, b = _unit(module), _unit(t)
                        if a != b:
                            out.append((a, b, module, child.lineno, func))
                visit(child, func)

        visit(tree, None)
    return out


def _known(unit: str) -> bool:
    return unit in LEVEL


def test_every_package_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    missing = sorted(u for u in units if not _known(u))
    assert not missing, f"place these in LAYERS here and in docs/architecture.md: {missing}"


def test_no_import_runs_back_up_the_layers():
    upward = []
    for a, b, module, line, func in _imports():
        if LEVEL[b] <= LEVEL[a]:
            continue
        if (a, b, func) in DISPLAY_HOOKS or (a, b) in PENDING:
            continue
        upward.append(f"{module}:{line} imports {b} (layer {LEVEL[b]}) from {a} (layer {LEVEL[a]})")
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def _fail_on_a_circle(graph: dict[str, set[str]]) -> None:
    """Fails the test naming the first import circle of ``graph`` (depth first, in name order)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (cycle := dfs(v)):
                return cycle
        state[u] = 2
        stack.pop()
        return None

    for u in sorted(graph):
        if u not in state and (cycle := dfs(u)):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_no_import_circle_among_packages():
    graph: dict[str, set[str]] = {}
    for a, b, _, _, func in _imports():
        if (a, b, func) in DISPLAY_HOOKS or (a, b) in PENDING:
            continue
        graph.setdefault(a, set()).add(b)
    _fail_on_a_circle(graph)


def test_pending_edges_still_exist():
    """A pending edge that is gone must leave the list (so that it cannot come back unnoticed)."""
    present = {(a, b) for a, b, *_ in _imports()}
    gone = sorted(set(PENDING) - present)
    assert not gone, f"remove from PENDING (the work landed): {gone}"


def test_the_code_parses_on_the_oldest_supported_python():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert declared == ">=3.11"
    assert sys.version_info >= (3, 11)
    for path in PACKAGE.rglob("*.py"):
        ast.parse(path.read_text(), str(path), feature_version=(3, 11))


# Circles between modules the test allows, each closed by one import inside one function, named (importer, imported,
# the function the import is in); test_module_circle_exceptions_still_exist removes a line whose import is gone.
MODULE_CIRCLE_EXCEPTIONS: dict[tuple[str, str, str], str] = {
}


def _module_imports() -> dict[str, dict[str, set[str | None]]]:
    """Module -> the kforge modules it imports -> the functions those imports are in (None: at module level or under
    ``TYPE_CHECKING``, which run when the module is loaded or type-checked; a name: inside that function, innermost,
    which runs when it is called). A name imported from a package is its submodule where one has that name, else
    the package's ``__init__``; importing a submodule runs its packages' ``__init__`` first, outside the importer's
    own packages."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    graph: dict[str, dict[str, set[str | None]]] = {}
    for module, (path, is_init) in modules.items():
        package = module if is_init else module.rpartition(".")[0]
        found: list[tuple[str, str | None]] = []

        def visit(node: ast.AST, func: str | None) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(child, child.name)
                    continue
                if isinstance(child, ast.Import):
                    found.extend((a.name, func) for a in child.names)
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        target = ".".join(base + ([child.module] if child.module else []))
                    else:
                        target = child.module or ""
                    found.extend((f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target, func)
                                 for a in child.names)
                visit(child, func)

        visit(ast.parse(path.read_text(), str(path)), None)
        edges: dict[str, set[str | None]] = {}
        for t, func in found:
            if t not in modules or t == module:
                continue
            parts = t.split(".")
            for m in [t, *(p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                           if p in modules and p != module and not module.startswith(p + "."))]:
                edges.setdefault(m, set()).add(func)
        graph[module] = edges
    return graph


def test_no_import_circle_between_modules():
    """Issue 44: no two modules import each other, directly or round a circle, when loaded, type-checked or when a
    function runs, except the circles named in MODULE_CIRCLE_EXCEPTIONS."""
    imports = _module_imports()
    assert "kforge.deploy._dispatch" in imports["kforge.deploy._graph"]   # the scan sees relative imports
    assert imports["kforge.session"]["kforge.views"] >= {"dashboard", "_ipython_display_"}  # ... and those in functions
    graph = {module: {b for b, funcs in edges.items()
                      if any(f is None or (module, b, f) not in MODULE_CIRCLE_EXCEPTIONS for f in funcs)}
             for module, edges in imports.items()}
    _fail_on_a_circle(graph)


def test_module_circle_exceptions_still_exist():
    """An exception whose import is gone must leave the list (so that its circle cannot come back unnoticed)."""
    imports = _module_imports()
    present = {(a, b, f) for a, edges in imports.items() for b, funcs in edges.items() for f in funcs}
    gone = sorted(set(MODULE_CIRCLE_EXCEPTIONS) - present)
    assert not gone, f"remove from MODULE_CIRCLE_EXCEPTIONS (the import is gone): {gone}"
