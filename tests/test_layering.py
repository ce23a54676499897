"""The layering in docs/layout.md, checked from the source: every import of one
top-level package by another points down, and the run core has no import cycle.

Every import counts: at module level, inside functions, and under ``TYPE_CHECKING`` (an
import that only a type checker follows is still a dependency a reader has to hold in mind).
Migrations are left out: they name other apps' migrations, not their code. Tests, benchmarks
and deployment scripts sit outside the layering and may import anything; nothing imports them.
"""

from __future__ import annotations

import ast
import functools
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Bottom to top. A package may import packages of a lower rank only.
LAYERS: dict[str, int] = {
    "tau": 0,  # the tau.yaml contract: no Django
    "portal": 1,  # the kernel: settings, tenancy, audit, middleware, API plumbing, health
    "kube": 2,  # the one Kubernetes adapter
    "telemetry": 2,  # the one Prometheus/DCGM (and NVML) adapter
    "workspaces": 3,  # workspaces, members, quotas, flavors, cohorts; the audit pages
    "identity": 4,  # OpenID Connect, login, API tokens
    "runs": 5,  # the run core: models, states, submission, delivery, pages and API
    "catalog": 6,  # datasets and models: versions, their files and aliases, lineage
    "serving": 7,  # endpoints: records, histories, deployment, the backend interface, API
    "executors": 8,  # where runs and endpoints execute: executors.kubernetes, executors.local
    "evidence": 9,  # sealed records of runs
    "gpus": 9,  # the GPU fleet, telemetry, GPU efficiency of runs
    "accounting": 9,  # GPU-hours used, usage pages and API, budget warnings
    "notifications": 9,  # e-mail and webhooks about runs and budgets
    "pipelines": 10,  # stages of a workload's life as one record, above what they use
    "web": 11,  # the UI shell: root URLconf, home pages, commands that start everything
}
#: Not part of the product's layering: they may import any package, and none imports them.
OUTSIDE = {"tests", "benchmarks", "deploy", "examples", "docs", "var", "static", "templates"}


def python_files(package: str) -> Iterator[Path]:
    for path in sorted((ROOT / package).rglob("*.py")):
        if "migrations" not in path.relative_to(ROOT).parts:
            yield path


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(
    path: Path, module: str | None = None, *, modules: set[str] | None = None
) -> Iterator[tuple[int, str]]:
    """Every module the file imports, absolute, with its line (``module``: the file's module
    name, when it is not in the tree). With ``modules`` (the package's modules) ``from pkg
    import sub`` of a module ``pkg.sub`` is an import of that module only: the package's
    ``__init__`` is loaded before any of its modules whatever they import, so it is no
    dependency of theirs (counting it made every module a package re-exports from a cycle)."""
    package = module or module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in import_statements(path.read_text(encoding="utf-8"), str(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            named = [f"{target}.{alias.name}" for alias in node.names]
            if modules is None or not all(name in modules for name in named):
                yield node.lineno, target
            # ``from runs import delivery`` imports the module runs.delivery.
            for name in named:
                yield node.lineno, name


@functools.cache
def import_statements(source: str, filename: str) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of ``source`` in the order ``ast.walk`` meets them, found once
    per source: the checks here read every file of the product several times."""
    return tuple(
        node
        for node in ast.walk(ast.parse(source, filename=filename))
        if isinstance(node, ast.Import | ast.ImportFrom)
    )


def project_packages() -> set[str]:
    return {
        child.name
        for child in ROOT.iterdir()
        if child.is_dir() and (child / "__init__.py").is_file() and child.name not in OUTSIDE
    }


def test_every_package_has_a_place_in_the_layering() -> None:
    unplaced = project_packages() - set(LAYERS)
    assert not unplaced, f"add {sorted(unplaced)} to LAYERS (and to docs/layout.md)"


def all_modules() -> set[str]:
    return {module_name(path) for package in LAYERS for path in python_files(package)}


def upward_imports() -> list[str]:
    found = []
    modules = all_modules()
    for package, rank in LAYERS.items():
        for path in python_files(package):
            for line, target in imported_modules(path, modules=modules):
                top = target.split(".")[0]
                if top == package:
                    continue
                if top in OUTSIDE and (ROOT / top / "__init__.py").is_file():
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {target} (outside)")
                elif top in LAYERS and LAYERS[top] >= rank:
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {target} (up)")
    return found


def test_no_package_imports_one_above_it_or_beside_it() -> None:
    assert upward_imports() == []


def module_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports."""
    modules = {module_name(path): path for path in python_files(package)}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for _, target in imported_modules(path, modules=set(modules)):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None."""
    done: set[str] = set()
    trail: list[str] = []
    on_trail: set[str] = set()

    def visit(node: str) -> list[str] | None:
        trail.append(node)
        on_trail.add(node)
        for child in sorted(graph[node]):
            if child in on_trail:
                return [*trail[trail.index(child) :], child]
            if child not in done:
                cycle = visit(child)
                if cycle:
                    return cycle
        trail.pop()
        on_trail.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_cycle_inside_a_package(package: str) -> None:
    # A package's __init__ importing its own modules is how a package re-exports; a module
    # importing its package's __init__ back is the cycle that matters, and is caught.
    assert find_cycle(module_graph(package)) is None


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The cycle finder and the import reader, on cases with a known answer."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from runs.models import Run\n"
        "def later():\n    import web.urls\n"
        "from .. import audit\n",
        encoding="utf-8",
    )
    targets = {target for _, target in imported_modules(source, "portal.sub.mod")}
    assert {"runs.models", "runs.models.Run", "web.urls", "portal.audit"} <= targets
    # ``from pkg import sub`` of a module is that module, not the package's __init__ too;
    # ``from pkg import name`` of anything else is the package.
    source.write_text("from pkg import sub\nfrom pkg import helper\n", encoding="utf-8")
    named = [
        target for _, target in imported_modules(source, "pkg.mod", modules={"pkg", "pkg.sub"})
    ]
    assert named == ["pkg.sub", "pkg", "pkg.helper"]


#: The executors, each a package of its own above the run core: no executor imports another.
EXECUTORS = ("executors.kubernetes", "executors.local")
#: The packages of the core: they ask an executor through ``runs.backends.RunBackend``
#: (found by ``runs.backends.registry``; an endpoint's through ``serving.backends``), never
#: import one.
CORE = ("runs", "workspaces", "evidence", "identity", "serving")


def module_of(target: str) -> str:
    """The module (or package) of the tree an imported name lives in: ``a.b.c.name`` → ``a.b.c``."""
    parts = target.split(".")
    while parts:
        path = ROOT.joinpath(*parts)
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return target


def executor_of(module: str) -> str | None:
    """The executor a module is part of, or None (the core, or outside both)."""
    for executor in EXECUTORS:
        if module == executor or module.startswith(executor + "."):
            return executor
    return None


def reaches_into_executors() -> tuple[set[tuple[str, str]], list[str]]:
    """The core's imports of executor modules, and every import of one executor by another."""
    from_core: set[tuple[str, str]] = set()
    across: list[str] = []
    modules = all_modules()
    for package in (*CORE, "executors"):
        for path in python_files(package):
            module = module_name(path)
            mine = executor_of(module)
            for line, target in imported_modules(path, modules=modules):
                theirs = executor_of(target)
                if theirs is None or theirs == mine:
                    continue
                if mine is None and package != "executors":
                    from_core.add((module, module_of(target)))
                elif mine is not None:
                    across.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return from_core, across


def test_the_core_asks_a_backend_and_never_imports_one() -> None:
    from_core, across = reaches_into_executors()
    assert across == [], "one executor imports another"
    assert sorted(from_core) == [], (
        "the core imports an executor: ask through runs.backends.RunBackend, or announce it "
        "(a signal) for the executor to connect in its AppConfig.ready()"
    )


def test_every_executor_named_exists() -> None:
    for executor in EXECUTORS:
        assert (ROOT.joinpath(*executor.split(".")) / "apps.py").is_file(), executor


#: Every place the product writes a ``failure_class`` field, as (file, what is written). A
#: run's is written by ``runs.state.transition`` alone (acceptance of issue 31); an attempt's
#: by ``close_attempt`` and, for attempts that never started, by ``transition``.
FAILURE_CLASS_WRITERS = {
    ("runs/state.py", "locked.failure_class"),  # transition(): the run's
    ("runs/state.py", "waiting.update"),  # transition(): its waiting attempts'
    ("runs/attempts.py", "attempt.failure_class"),  # close_attempt(): an attempt's
    ("executors/local/agent/prepare.py", "self.failure_class"),  # PreparationFailed's
}


def failure_class_writes(path: Path) -> Iterator[tuple[int, str]]:
    """Where ``path`` writes a ``failure_class``: an attribute assigned, or a keyword of a
    queryset's update or create."""
    source = path.read_text(encoding="utf-8")
    # Only a file that names the field can write it: the others are not parsed (Python reads
    # names as NFKC, so a name written in other forms of the letters is found too).
    if "failure_class" not in unicodedata.normalize("NFKC", source):
        return
    tree = ast.parse(source, filename=str(path))
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "failure_class":
                yield target.lineno, ast.unparse(target)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"update", "create", "get_or_create", "update_or_create"}
            and any(keyword.arg == "failure_class" for keyword in node.keywords)
        ):
            yield node.lineno, ast.unparse(node.func)


def test_only_transition_writes_a_runs_failure_class(tmp_path: Path) -> None:
    found = [
        (str(path.relative_to(ROOT)), line, written)
        for package in LAYERS
        for path in python_files(package)
        for line, written in failure_class_writes(path)
    ]
    unexpected = [
        f"{where}:{line} writes {written}"
        for where, line, written in found
        if (where, written) not in FAILURE_CLASS_WRITERS
    ]
    assert unexpected == [], (
        "a failure class written outside runs.state.transition: pass it to transition() "
        "(a run's) or runs.attempts.close_attempt (an attempt's)"
    )
    named = {(where, written) for where, _, written in found}
    assert named == FAILURE_CLASS_WRITERS, "a writer named here is gone: update the list"
    # The reader finds both shapes of a write.
    source = tmp_path / "mod.py"
    source.write_text(
        "run.failure_class = 'oom_killed'\n"
        "Run.objects.filter(pk=1).update(state='failed', failure_class='unknown')\n",
        encoding="utf-8",
    )
    assert list(failure_class_writes(source)) == [
        (1, "run.failure_class"),
        (2, "Run.objects.filter(pk=1).update"),
    ]
