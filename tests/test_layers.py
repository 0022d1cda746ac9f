"""The layers of docs/design.md hold: imports point down only, and Lightning stays in its adapters.

Every ``lit_rlft`` import of every module is read from its source (``import`` statements anywhere in the file,
type-checking imports included), so a helper put in the wrong place fails here, naming the file and the import.

``benchmarks/`` sits on top of the package, in two layers: ``benchmarks/study/`` (the Countdown study and the
generators of its pages) is the library the benchmark scripts ``benchmarks/<name>.py`` use. ``lit_rlft`` never
imports ``benchmarks``; no module of ``benchmarks/study/`` imports a script (what a script and the study share lives
in the study); a script may import the study and another script. No file-level import circle among the modules of
``benchmarks/``, and none of them imports another module's private (``_``) name."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "lit_rlft"
BENCHMARKS = REPO / "benchmarks"
#: The benchmarks' library (the layer below the scripts ``benchmarks/<name>.py``).
BENCHMARK_LIBRARY = BENCHMARKS / "study"

#: Bottom first; a package may import its own layer's packages only where listed in SIDEWAYS, and any lower layer.
LAYERS: list[set[str]] = [
    {"core", "runtime", "records"},
    {"selection"},
    {"models", "rewards"},
    {"rollout", "data", "envs"},
    {"step"},
    {"callbacks"},
    {"lightning"},
    {"cli", "study"},
]
#: A reward model is a model: the rewards load and shard it with the models' helpers. Episodes are rolled out with
#: an environment; an environment's own task (the guessing game's prompts) is a data-set task.
#: The command line dispatches `lit-rlft study` and `lit-rlft probe` (from cli/main.py only: CLI_TO_STUDY); a study
#: runs each arm through the command line's LightningCLI.
SIDEWAYS: set[tuple[str, str]] = {("rewards", "models"), ("rollout", "envs"), ("envs", "data"), ("cli", "study"),
                                  ("study", "cli")}
#: The one module of the command line that may import the study: the dispatcher of its commands.
CLI_TO_STUDY = {"cli/main.py"}
#: Where Lightning may be imported: its adapters, the datamodule (a LightningDataModule) and the command line.
LIGHTNING_ALLOWED = {"lightning", "callbacks", "cli", "study", "data/datamodule.py"}
#: Modules of the callbacks package that other callbacks may import (their shared base layer).
CALLBACK_BASES = {"base", "selection", "difficulty", "rounds", "extend"}


def _level(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _imports(path):
    """``(line, imported module)`` of every import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def _package(path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_point_down_the_layers(path):
    here = _package(path)
    bad = []
    for line, module in _imports(path):
        parts = module.split(".")
        if parts[0] != "lit_rlft" or len(parts) < 2:
            continue
        there = parts[1]
        if there == here:
            if here == "callbacks" and len(parts) > 2 and path.stem not in CALLBACK_BASES | {"__init__"} \
                    and parts[2] not in CALLBACK_BASES:
                bad.append(f"line {line}: {module} (one callback importing another: share it through a base)")
            continue
        if _level(there) > _level(here) or (_level(there) == _level(here) and (here, there) not in SIDEWAYS):
            bad.append(f"line {line}: {module} ({here} is below {there})")
    assert not bad, f"{path.relative_to(REPO)} imports upward:\n" + "\n".join(bad)


def test_the_command_line_reaches_the_study_only_through_its_commands():
    """``cli -> study`` is the one sideways arrow into the study: its commands dispatched from ``cli/main.py``. The
    demo, the errors and the CLI write results with :mod:`lit_rlft.records` (the ground floor), not the study."""
    bad = [f"{p.relative_to(REPO)} line {line}: {module}" for p in sorted((PACKAGE / "cli").rglob("*.py"))
           if str(p.relative_to(PACKAGE)) not in CLI_TO_STUDY
           for line, module in _imports(p) if module.startswith("lit_rlft.study")]
    assert not bad, "the command line imports the study outside its dispatcher:\n" + "\n".join(bad)
    assert any(m.startswith("lit_rlft.study") for _, m in _imports(PACKAGE / "cli" / "main.py"))


def test_the_ground_floor_imports_nothing_above_it():
    """``records`` (result files, environment, scalars, plots) stands on nothing of ``lit_rlft`` but itself."""
    bad = [f"{p.relative_to(REPO)} line {line}: {module}" for p in sorted((PACKAGE / "records").rglob("*.py"))
           for line, module in _imports(p) if module.startswith("lit_rlft.") and not module.startswith("lit_rlft.records")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_lightning_is_imported_only_by_its_adapters(path):
    rel = str(path.relative_to(PACKAGE))
    if rel in LIGHTNING_ALLOWED or _package(path) in LIGHTNING_ALLOWED:
        return
    found = [f"line {line}: {module}" for line, module in _imports(path) if module.split(".")[0] == "lightning"]
    assert not found, f"{rel} imports Lightning outside lightning/, callbacks/ and cli/: " + ", ".join(found)


def test_the_layer_table_knows_every_package():
    packages = {_package(p) for p in _modules()}
    assert packages <= set().union(*LAYERS), packages - set().union(*LAYERS)


def _module_name(path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imported(path: Path, name: str, modules: set[str] | dict[str, Path]) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` of every import in ``path`` (the module ``name``), anywhere in the file, relative
    imports resolved. ``from package import name`` gives the module ``package.name`` where it is one of ``modules``
    (``from lit_rlft.models import smollm2``), else ``package`` (whose ``__init__`` re-exports ``name``)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                module = node.module
            else:
                continue
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def _import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """``module -> the modules under root it imports`` (every import in the file, function-level and type-checking
    ones included; :func:`_imported`), for every module under ``root`` (``lit_rlft`` or ``benchmarks``)."""
    paths = {_module_name(p): p for p in root.rglob("*.py")}
    return {name: {t for _, t in _imported(path, name, paths) if t in paths and t != name}
            for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    circles.append(sorted(component))
    return circles


def test_no_file_level_import_circle():
    """No module of lit_rlft imports, directly or through others, a module that imports it back (a circle makes the
    import order matter and hides which module is the lower one). Every import counts, function-level and
    type-checking ones included."""
    circles = _circles(_import_graph())
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_file_level_import_circle_in_the_benchmarks():
    """As :func:`test_no_file_level_import_circle`, among the modules of ``benchmarks/`` (scripts and study)."""
    circles = _circles(_import_graph(BENCHMARKS))
    assert not circles, "import circles in benchmarks/:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_benchmarks_import_graph_sees_the_benchmarks():
    """The circle test above reads real modules and their imports: a circle added to them is found."""
    graph = _import_graph(BENCHMARKS)
    assert {"benchmarks.study.docs", "benchmarks.study.passes", "benchmarks.time_to_trl"} <= set(graph)
    assert "benchmarks.study.passes" in graph["benchmarks.study.docs"]
    assert "benchmarks.study.recorded" in graph["benchmarks.study.passes"]  # a function-level import
    assert "benchmarks.study.trl_tables" in graph["benchmarks.time_to_trl"]
    back = {**graph, "benchmarks.study.passes": graph["benchmarks.study.passes"] | {"benchmarks.study.docs"}}
    assert any({"benchmarks.study.docs", "benchmarks.study.passes"} <= set(c) for c in _circles(back))


def test_lit_rlft_never_imports_the_benchmarks():
    """The package is below its benchmarks: no file of ``lit_rlft`` imports ``benchmarks`` (anywhere in the file)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 100
    bad = [f"{p.relative_to(REPO)} line {line}: {module}" for p in paths for line, module in _imports(p)
           if module.split(".")[0] == "benchmarks"]
    assert not bad, "lit_rlft imports benchmarks:\n" + "\n".join(bad)


def test_the_benchmarks_library_imports_no_script():
    """No module of ``benchmarks/study/`` imports a benchmark script ``benchmarks/<name>.py``: what the study and a
    script share lives in the study (the time-to-TRL tables: :mod:`benchmarks.study.trl_tables`)."""
    scripts = {_module_name(p) for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py"}
    assert "benchmarks.time_to_trl" in scripts
    modules = {_module_name(p) for p in BENCHMARKS.rglob("*.py")}
    paths = sorted(BENCHMARK_LIBRARY.rglob("*.py"))
    assert BENCHMARK_LIBRARY / "docs.py" in paths
    bad = [f"{p.relative_to(REPO)} line {line}: {module}" for p in paths
           for line, module in _imported(p, _module_name(p), modules) if module in scripts]
    assert not bad, "benchmarks/study imports a script (move what they share into benchmarks/study):\n" + "\n".join(bad)


@pytest.mark.parametrize("root", [PACKAGE, BENCHMARKS], ids=["lit_rlft", "benchmarks"])
def test_no_private_name_is_imported(root):
    """No module of ``lit_rlft/`` or ``benchmarks/`` imports another module's private name (``from m import
    _helper``), nor binds an import to a private name (``import table as _table``): a helper two modules share is
    public where it lives. (In the package, the rule is about its own modules: torch's private helpers that
    distributed code needs are torch's to keep.)"""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            own = root is not PACKAGE or (getattr(node, "module", None) or "lit_rlft").startswith("lit_rlft")
            if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", None) != "__future__" and own:
                for alias in node.names:
                    name = alias.name.split(".")[-1]
                    if (name.startswith("_") and not name.startswith("__")) or (alias.asname or "").startswith("_"):
                        bad.append(f"{path.relative_to(REPO)} line {node.lineno}: {alias.name}"
                                   + (f" as {alias.asname}" if alias.asname else ""))
    assert not bad, "private names imported:\n" + "\n".join(bad)
