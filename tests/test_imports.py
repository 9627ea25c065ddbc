"""The package's import graph: no cycle among sb3_ppo_scale's modules, and each module imports on its own.

The graph is read from the source (every ``import`` statement, also those inside functions and under
``TYPE_CHECKING``), so a lazy import cannot hide a cycle. Each module is then imported first in a fresh child
process: forked after the third-party libraries are loaded (the slow part), before any sb3_ppo_scale module is.
"""

from __future__ import annotations

import ast
import importlib
import multiprocessing
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "sb3_ppo_scale"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imported(module: str, path: Path) -> set[str]:
    """The sb3_ppo_scale modules ``module`` names in an import statement (a package's attribute resolves to the
    submodule when there is one, else to the package)."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])])
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names)
    return {name for name in found if name in MODULES and name != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle_among_the_package_modules():
    graph = {module: _imported(module, path) for module, path in MODULES.items()}
    assert graph["sb3_ppo_scale.core.ppo"]  # the parser sees imports
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _import_alone(module: str) -> str:
    import sys

    for name in [name for name in sys.modules if name.split(".")[0] == "sb3_ppo_scale"]:
        del sys.modules[name]  # earlier tests in this worker imported the package: start it anew
    try:
        importlib.import_module(module)
    except Exception as error:  # reported to the parent, which names the module
        return f"{type(error).__name__}: {error}"
    return ""


def test_each_module_imports_on_its_own_in_a_fresh_process():
    for heavy in ("torch", "stable_baselines3", "sb3_contrib", "gymnasium", "optuna", "matplotlib.pyplot"):
        importlib.import_module(heavy)
    context = multiprocessing.get_context("fork")
    failures = {}
    with context.Pool(1, maxtasksperchild=1) as pool:
        for module, error in zip(MODULES, pool.map(_import_alone, MODULES, chunksize=1)):
            if error:
                failures[module] = error
    assert not failures, failures


@pytest.mark.parametrize("module", ["sb3_ppo_scale.distributed", "sb3_ppo_scale.checkpoint"])
def test_training_state_modules_do_not_import_the_algorithm(module):
    """Checkpointing and data parallelism plug into the core (sb3_ppo_scale.core.extensions); they do not import
    the algorithm."""
    imported = _imported(module, MODULES[module])
    assert "sb3_ppo_scale.core.ppo" not in imported and "sb3_ppo_scale.core.algorithm" not in imported


#: the layers above the core: nothing under sb3_ppo_scale/core/ may import them (they plug in through
#: sb3_ppo_scale.core.extensions)
ABOVE_THE_CORE = ("sb3_ppo_scale.distributed", "sb3_ppo_scale.checkpoint", "sb3_ppo_scale.envs",
                  "sb3_ppo_scale.experiments", "sb3_ppo_scale.tuning", "sb3_ppo_scale.contrib",
                  "sb3_ppo_scale.buffers", "sb3_ppo_scale.cli")


def _reaches_above_the_core(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each core module's imports of a module above the core (the package itself, ``sb3_ppo_scale``, included)."""
    return {module: reached for module, imports in graph.items() if module.startswith("sb3_ppo_scale.core")
            if (reached := {name for name in imports if name == "sb3_ppo_scale" or name.startswith(ABOVE_THE_CORE)})}


def test_nothing_in_the_core_imports_a_layer_above_it():
    graph = {module: _imported(module, path) for module, path in MODULES.items()}
    assert len([module for module in graph if module.startswith("sb3_ppo_scale.core.")]) > 20  # the parser sees them
    assert _reaches_above_the_core(graph) == {}


def test_the_direction_check_catches_a_core_module_that_imports_upwards():
    graph = {"sb3_ppo_scale.core.algorithm": {"sb3_ppo_scale.distributed", "sb3_ppo_scale.core.config"},
             "sb3_ppo_scale.core.update.step": {"sb3_ppo_scale.envs.envpool"},
             "sb3_ppo_scale.core.config": {"sb3_ppo_scale.core.checks"},
             "sb3_ppo_scale.distributed": {"sb3_ppo_scale.core.config"}}
    assert _reaches_above_the_core(graph) == {"sb3_ppo_scale.core.algorithm": {"sb3_ppo_scale.distributed"},
                                              "sb3_ppo_scale.core.update.step": {"sb3_ppo_scale.envs.envpool"}}


def test_the_update_and_collection_parts_do_not_import_each_other():
    """One feature's change touches one part: ``core.update`` and ``core.collect`` share only ``core.policy``,
    ``core.exact`` and the checks."""
    for part, other in (("update", "collect"), ("collect", "update")):
        for module, path in MODULES.items():
            if module.startswith(f"sb3_ppo_scale.core.{part}."):
                assert not {name for name in _imported(module, path)
                            if name.startswith(f"sb3_ppo_scale.core.{other}")}, module


def test_the_benchmarks_do_not_import_the_tuning_package():
    """``experiments`` (bench, reports) and ``tuning`` (Optuna studies) share the stop-signal handling through
    ``sb3_ppo_scale.stop_signals``; a bench worker does not load Optuna."""
    for module, path in MODULES.items():
        if module.startswith("sb3_ppo_scale.experiments"):
            assert not {name for name in _imported(module, path) if name.startswith("sb3_ppo_scale.tuning")}, module


def test_modules_that_moved_keep_their_old_import_path():
    """Models pickled before core/ was split name classes by the old paths (tests/test_saved_before_move.py)."""
    from sb3_ppo_scale.core import MOVED

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    assert not (PACKAGE_DIR / "core" / "lr.py").exists()


def test_no_folder_holds_more_than_twelve_modules():
    for folder in {path.parent for path in MODULES.values()}:
        modules = [path for path in folder.glob("*.py") if path.name != "__init__.py"]
        assert len(modules) <= 12, folder


def test_a_module_over_600_lines_states_why_in_its_docstring():
    for module, path in MODULES.items():
        if len(path.read_text().splitlines()) > 600:
            assert "Kept as one module" in (ast.get_docstring(ast.parse(path.read_text())) or ""), module
