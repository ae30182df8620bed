"""The package's shape: no import cycle between megawino's modules, every import pointing down the
layers of docs/design.md ("Packages"), no module over 400 lines, checked on the source with ast
(function-level imports count: a cycle through a function-level import still couples the two
modules both ways)."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import networkx as nx
import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "megawino"
MAX_MODULE_LINES = 400

# The layers, lowest first (docs/design.md, "Packages"): a module may import modules of its own
# package or of a lower layer.  A module belongs to the longest prefix listed; gpu.identity (which
# GPU this is) sits below the tables, tuning.table and tuning.choice (the lookup the plans need)
# below the GPU packages, tuning's search and direct tuner above them.
LAYERS = [
    ("megawino.core",),
    ("megawino.schedule",),
    ("megawino.cpu",),
    ("megawino.gpu.identity",),
    ("megawino.tuning.table",),
    ("megawino.tuning.choice",),
    ("megawino.gpu",),
    ("megawino.direct",),
    ("megawino.runtime",),
    ("megawino.tuning", "megawino.sweep", "megawino.torch"),
    ("megawino.cli",),
    ("megawino", "megawino.__main__"),
]


def module_name(path: Path) -> str:
    """``megawino/direct/model.py`` -> ``megawino.direct.model``; a package's ``__init__.py``
    is the package itself."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The megawino modules that ``name`` imports anywhere in its body.  ``from pkg import x``
    imports the submodule ``pkg.x`` when there is one, else ``pkg`` itself."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> nx.DiGraph:
    modules = package_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        graph.add_edges_from((name, target) for target in imported_modules(name, path, modules))
    return graph


def test_the_import_graph_sees_relative_function_level_and_submodule_imports():
    """The graph builder itself: edges it must find in the package as it is (a builder that
    finds nothing would pass the cycle test trivially)."""
    graph = import_graph()
    assert "megawino.direct.model" in graph and "megawino.core.tasks" in graph
    assert graph.has_edge("megawino.direct", "megawino.direct.model")      # from .model import ...
    assert graph.has_edge("megawino.direct", "megawino.direct.ptxas")      # from . import ptxas as _ptxas
    assert graph.has_edge("megawino.direct.model", "megawino.core.tasks")  # from ..core.tasks import ...
    assert graph.has_edge("megawino.sweep.gpu", "megawino.runtime")        # in a function: from . import runtime
    assert graph.has_edge("megawino.sweep", "megawino.sweep.cpu")
    assert graph.number_of_edges() > 2 * graph.number_of_nodes() // 3


def test_no_import_cycle_in_megawino():
    graph = import_graph()
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    pytest.fail("import cycle: " + " -> ".join([a for a, _ in cycle] + [cycle[-1][1]]))


def test_no_module_over_400_lines():
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines())
             for name, path in package_modules().items()}
    assert len(sizes) > 20
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines: {too_long}"


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the prefix that places it) of a megawino module."""
    matches = [(len(prefix), rank, prefix) for rank, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    _, rank, prefix = max(matches)
    return rank, prefix


def downward_violations(graph: nx.DiGraph) -> list[str]:
    """Imports that point up or sideways.  The root package is left out as a target: Python
    imports it before any of its modules, so reading ``megawino.__version__`` couples nothing."""
    bad = []
    for source, target in graph.edges:
        if target == "megawino":
            continue
        (rank_s, place_s), (rank_t, place_t) = layer_of(source), layer_of(target)
        if rank_t > rank_s or (rank_t == rank_s and place_s != place_t):
            bad.append(f"{source} ({place_s}) imports {target} ({place_t})")
    return sorted(bad)


def test_every_import_points_down_the_layers():
    graph = import_graph()
    assert {layer_of(m)[1] for m in graph} >= {p for prefixes in LAYERS[:-1] for p in prefixes}
    assert not downward_violations(graph), "\n".join(downward_violations(graph))


def test_the_layer_check_catches_an_upward_or_sideways_import():
    graph = import_graph()
    graph.add_edge("megawino.core.tasks", "megawino.schedule.mapping")     # up one layer
    graph.add_edge("megawino.gpu.weights", "megawino.direct.plan")         # up: direct sits above gpu
    graph.add_edge("megawino.sweep.gpu", "megawino.torch.gpu")             # sideways in one layer
    assert downward_violations(graph) == [
        "megawino.core.tasks (megawino.core) imports megawino.schedule.mapping (megawino.schedule)",
        "megawino.gpu.weights (megawino.gpu) imports megawino.direct.plan (megawino.direct)",
        "megawino.sweep.gpu (megawino.sweep) imports megawino.torch.gpu (megawino.torch)",
    ]


def test_no_module_left_at_the_top_level_but_the_entry_points():
    top = {path.name for path in PACKAGE_DIR.glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "runtime.py"}


REPO_DIR = PACKAGE_DIR.parent
DOTTED_STRING = re.compile(r"""["'](megawino(?:\.[A-Za-z_]\w*)+)["']""")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a megawino module or a name inside one (megawino modules import
    without CuPy, so this runs anywhere; a module that needs an absent third-party package counts
    as resolved)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(name) is None:
                continue
            obj = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name and not err.name.startswith("megawino"):
                return True
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def megawino_references(path: Path):
    """(line, dotted name) of every megawino import in ``path``, function-level and relative ones
    included, and of every quoted ``"megawino.x.y"`` (monkeypatch targets, ``-m`` commands)."""
    text = path.read_text(encoding="utf-8")
    inside = PACKAGE_DIR in path.parents
    name = module_name(path) if inside else ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - (node.level - 1)] + ([base] if base else []))
            if base.startswith("megawino"):
                yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name.startswith("megawino"))
    for match in DOTTED_STRING.finditer(text):
        if not match.group(1).startswith(("megawino._cuda", "megawino._mapping")):   # package data
            yield text.count("\n", 0, match.start()) + 1, match.group(1)


def test_every_megawino_reference_resolves():
    """GPU code paths, GPU tests and bench scripts do not run on a CPU machine; a name they import
    from a moved or renamed module must still fail here."""
    files = [path for folder in ("megawino", "tests", "bench") for path in sorted((REPO_DIR / folder).rglob("*.py"))
             if path != Path(__file__).resolve()]
    refs = [(path, line, name) for path in files for line, name in megawino_references(path)]
    assert len(refs) > 100
    broken = [f"{path.relative_to(REPO_DIR)}:{line}: {name}" for path, line, name in refs
              if not _resolves(name)]
    assert not broken, "\n".join(broken)
    assert not _resolves("megawino.core.tasks.NoSuchName") and not _resolves("megawino.tuning.choose")
