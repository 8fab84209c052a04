"""The package's shape: imports run one way, no cycles, and the evaluation modules stay
torch-free."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "edgespec"
WINGS = ("cuhlm", "wisv")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Every edgespec module -> the edgespec modules it imports (module level or in a function)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("edgespec"):
                    for alias in node.names:
                        full = f"{node.module}.{alias.name}"
                        deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("edgespec"))
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _part(module: str) -> str:
    """The folder a module lives in (``decoding``, ``cuhlm``, ...) or the module itself."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def test_no_import_cycles():
    graph = _import_graph()
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep] if dep in stack else [node, dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("decoding", {"cuhlm", "wisv", "wireless", "models", "data", "multidevice"}),
        ("wireless", {"cuhlm", "wisv", "decoding", "models", "data", "multidevice"}),
        ("cuhlm", {"wisv", "multidevice"}),
        ("wisv", {"cuhlm", "multidevice"}),
        ("data", {"cuhlm", "wisv", "decoding", "wireless", "models", "multidevice"}),
        # The simulation re-prices decoded tables: no models, no decoding core.
        ("multidevice", {"decoding", "models", "data"}),
    ],
)
def test_imports_run_one_way(layer, forbidden):
    graph = _import_graph()
    bad = sorted(
        f"{module} imports {dep}"
        for module, deps in graph.items()
        if _part(module) == layer
        for dep in deps
        if _part(dep) in forbidden
    )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "module",
    [
        "edgespec.cuhlm.evaluate",
        "edgespec.cuhlm.summary",
        "edgespec.hardware",
        "edgespec.wisv.evaluate",
        "edgespec.wisv.summary",
        "edgespec.wisv.csi",
        "edgespec.wireless.channel",
        "edgespec.wireless.delay",
        "edgespec.wireless.payload",
        "edgespec.data.answers",
        "edgespec.report",
        "edgespec.multidevice.edge",
        "edgespec.multidevice.uplink",
        "edgespec.multidevice.simulate",
        "edgespec.multidevice.workload",
        "edgespec.multidevice.sweep",
        "edgespec.multidevice.summary",
        "edgespec.multidevice.batchprofile",
        "edgespec.multidevice.devices",
        "edgespec.multidevice.capacity",
        "edgespec.multidevice.report",
        "edgespec.multidevice.job",
    ],
)
def test_evaluation_modules_import_neither_torch_nor_transformers(module):
    heavy = heavy_modules_imported_by(module, ("torch", "transformers"))
    assert heavy == [], f"{module} pulls in {heavy}"


def heavy_modules_imported_by(module, heavy):
    """Which of ``heavy`` a fresh interpreter has loaded after importing ``module``."""
    code = (
        f"import sys, {module}\n"
        f"print(','.join(sorted(m for m in {tuple(heavy)!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_check_sees_a_heavy_import():
    """The subprocess check above is not vacuous: a torch module is reported."""
    assert heavy_modules_imported_by("edgespec.decoding.sampling", ("torch",)) == ["torch"]


@pytest.mark.parametrize(
    "module", ["edgespec.cuhlm.decode", "edgespec.wisv.decode", "edgespec.runconfig"]
)
def test_decoding_modules_leave_the_solvers_unimported(module):
    """The 23 decode jobs of a default run never solve a programme: cvxpy (about 1-2.5 s of
    each job's start-up) is imported where a solve happens."""
    heavy = heavy_modules_imported_by(module, ("cvxpy", "sklearn"))
    assert heavy == [], f"{module} pulls in {heavy}"


SCRIPTS = sorted((PACKAGE.parents[1] / "workflow" / "scripts").glob("*.py"))
WING_NAMES = {"cuhlm": "CU-HLM wing", "wisv": "WISV wing"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_each_workflow_script_names_the_module_and_wing_it_calls(script):
    tree = ast.parse(script.read_text())
    doc = ast.get_docstring(tree) or ""
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("edgespec")
    }
    named = set(re.findall(r"edgespec(?:\.[a-z_]+)+", doc))
    assert named & imported, f"{script.name}: its docstring names none of {sorted(imported)}"
    for wing, label in WING_NAMES.items():
        if any(m.startswith(f"edgespec.{wing}") for m in imported):
            assert label in doc, f"{script.name} calls edgespec.{wing} but does not say so"
