"""Every test function checks something: a scan of the suite's source fails on a ``test*`` function that contains no
assertion, so a test that only runs code (and passes whatever it computes) cannot come back unnoticed.

A test asserts when its body (nested functions included) holds one of:

- an ``assert`` statement, or ``raise AssertionError(...)``;
- ``pytest.raises`` / ``pytest.warns`` / ``pytest.deprecated_call`` / ``pytest.fail``;
- a library assertion, a call whose name starts with ``assert`` and is not defined in ``tests/``
  (``np.testing.assert_array_equal``, ``th.testing.assert_close``, a mock's ``assert_called_once``);
- a call to a function of ``tests/`` that itself asserts by these rules (transitively): one of the same module, or
  imported from another module of ``tests/`` (``from tests.helpers import assert_identical``, ``from tests import
  helpers`` then ``helpers.x(...)``), or a method called through ``self`` / ``cls``.

The vendored upstream tests in :data:`EXEMPT` are not scanned.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Test files not scanned, with the reason (paths relative to the repository root).
EXEMPT: dict[str, str] = {
    "tests/contrib/test_invalid_actions.py": "vendored from sb3-contrib 2.9.2 (tests/contrib/LICENSE-sb3-contrib); "
                                             "kept as upstream wrote it, only the class swapped",
    "tests/contrib/test_lstm.py": "vendored from sb3-contrib 2.9.2 (tests/contrib/LICENSE-sb3-contrib); kept as "
                                  "upstream wrote it, only the class swapped",
}

#: ``pytest.<name>(...)`` calls that check something.
PYTEST_CHECKS = {"raises", "warns", "deprecated_call", "fail"}


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


@dataclass
class Module:
    """One parsed source file of ``tests/``: its functions by name (any depth) and the names it imports from tests."""

    path: Path
    tree: ast.Module
    functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = field(default_factory=dict)
    #: local name -> (module file, function name); a module alias maps to (module file, "").
    imported: dict[str, tuple[Path, str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, source: str, path: Path) -> Module:
        module = cls(path, ast.parse(source, filename=str(path)))
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.functions.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if node.module == "tests":  # from tests import helpers
                        module.imported[local] = (TESTS / f"{alias.name}.py", "")
                    elif node.module.startswith("tests."):
                        target = TESTS.joinpath(*node.module.split(".")[1:]).with_suffix(".py")
                        module.imported[local] = (target, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("tests.") and alias.asname:
                        target = TESTS.joinpath(*alias.name.split(".")[1:]).with_suffix(".py")
                        module.imported[alias.asname] = (target, "")
        return module


class Scanner:
    """Decides, with memory, whether a function asserts; loads the ``tests/`` modules that calls lead to."""

    def __init__(self) -> None:
        self.modules: dict[Path, Module | None] = {}
        self.memo: dict[int, bool] = {}

    def module(self, path: Path) -> Module | None:
        if path not in self.modules:
            self.modules[path] = Module.parse(path.read_text(), path) if path.is_file() else None
        return self.modules[path]

    def resolve(self, name: str, module: Module) -> tuple[list[ast.FunctionDef | ast.AsyncFunctionDef], bool]:
        """The ``tests/`` functions a called name may be, and whether the name is one of ``tests/`` at all."""
        head, _, rest = name.partition(".")
        if not rest:
            if name in module.functions:
                return module.functions[name], True
            if name in module.imported:
                path, target = module.imported[name]
                other = self.module(path)
                return (other.functions.get(target, []) if other else []), True
            return [], False
        if head in ("self", "cls") and "." not in rest:
            return module.functions.get(rest, []), rest in module.functions
        if head in module.imported and module.imported[head][1] == "" and "." not in rest:
            other = self.module(module.imported[head][0])
            return (other.functions.get(rest, []) if other else []), True
        return [], False

    def asserts(self, function: ast.FunctionDef | ast.AsyncFunctionDef, module: Module) -> bool:
        key = id(function)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = False  # a recursive call proves nothing by itself
        found = any(self._checks(node, module) for node in ast.walk(function))
        self.memo[key] = found
        return found

    def _checks(self, node: ast.AST, module: Module) -> bool:
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            return dotted(raised) == "AssertionError"
        if not isinstance(node, ast.Call):
            return False
        name = dotted(node.func)
        if name is None:
            return False
        head, _, last = name.rpartition(".")
        if head == "pytest" and last in PYTEST_CHECKS:
            return True
        functions, in_tests = self.resolve(name, module)
        if in_tests:
            return any(self.asserts(function, self.module_of(function, module)) for function in functions)
        return last.startswith("assert")

    def module_of(self, function: ast.AST, default: Module) -> Module:
        for module in self.modules.values():
            if module is not None and any(function in defs for defs in module.functions.values()):
                return module
        return default

    def unchecked_tests(self, module: Module) -> list[str]:
        """``path::name`` of each ``test*`` function (module level or in a ``Test*`` class) that asserts nothing."""
        self.modules.setdefault(module.path, module)
        candidates: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        for node in module.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                candidates.append(node)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                candidates += [f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return [f"{relative(module.path)}::{f.name}" for f in candidates
                if f.name.startswith("test") and not self.asserts(f, module)]


def relative(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def scanned_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if relative(p) not in EXEMPT)


def scan(paths: Iterable[Path]) -> list[str]:
    scanner = Scanner()
    flagged: list[str] = []
    for path in paths:
        module = scanner.module(path)
        assert module is not None
        flagged += scanner.unchecked_tests(module)
    return flagged


def scan_source(source: str, path: Path | None = None) -> list[str]:
    """Scan one module given as text (its ``tests.`` imports are read from the real ``tests/``)."""
    path = path or TESTS / "test_snippet.py"
    scanner = Scanner()
    return scanner.unchecked_tests(Module.parse(source, path))


# ------------------------------------------------------------------------------------------------ the suite
def test_every_test_function_asserts_something() -> None:
    files = scanned_files()
    assert len(files) > 40 and TESTS / "test_errors.py" in files
    flagged = scan(files)
    assert not flagged, ("test functions without an assertion (add one that checks what the name says, or a "
                         f"pytest.raises/warns; vendored upstream files go in EXEMPT with a reason): {flagged}")


def test_exempt_files_exist_and_are_vendored() -> None:
    for name, reason in EXEMPT.items():
        path = ROOT / name
        assert path.is_file(), f"EXEMPT names {name}, which does not exist"
        assert reason and "Vendored from" in path.read_text().splitlines()[0], f"{name} does not say it is vendored"


# ------------------------------------------------------------------------------------------------ the scan itself
SNIPPET = '''
import numpy as np
import pytest
from tests.helpers import assert_identical, train_one


def check_shape(x):
    assert x.shape == (2,)


def helper_without_assert(x):
    return x + 1


def calls_checker(x):
    check_shape(x)


class Checks:
    def verify(self, x):
        assert x


def test_runs_only():
    helper_without_assert(1)


def test_direct():
    assert helper_without_assert(1) == 2


def test_raises():
    with pytest.raises(ValueError):
        int("x")


def test_transitive_helper():
    calls_checker(np.zeros(2))


def test_helper_from_tests_helpers():
    assert_identical(None, None)


def test_helper_from_tests_helpers_that_does_not_assert():
    train_one(None, "CartPole-v1", 1, "MlpPolicy", "cpu")


def test_library_assertion():
    np.testing.assert_array_equal(np.zeros(2), np.zeros(2))


def test_nested_checker():
    def check(value):
        assert value
    check(1)


def test_raises_assertion_error():
    raise AssertionError("always")


def test_calls_a_non_assert_library_function():
    np.zeros(2).sum()


class TestGrouped:
    def test_method_without_assert(self):
        helper_without_assert(1)

    def test_method_with_self_helper(self):
        self.verify(1)

    def verify(self, x):
        assert x
'''


def test_the_scan_flags_a_test_without_an_assertion_and_only_those() -> None:
    flagged = {name.split("::")[1] for name in scan_source(SNIPPET)}
    assert flagged == {"test_runs_only", "test_helper_from_tests_helpers_that_does_not_assert",
                       "test_calls_a_non_assert_library_function", "test_method_without_assert"}


@pytest.mark.parametrize("body", ["    pass", "    x = 1", "    print('ran')", "    recurse()"])
def test_the_scan_flags_trivial_bodies(body: str) -> None:
    source = f"def recurse():\n    recurse()\n\n\ndef test_trivial():\n{body}\n"
    assert [name.split("::")[1] for name in scan_source(source)] == ["test_trivial"]
