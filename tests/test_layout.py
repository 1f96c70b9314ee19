"""The code's shape, as CI checks it with import-linter (pyproject.toml [tool.importlinter]):
the layers hold and no two modules import each other, imports inside functions included.
Each contract is shown to bite on a copy of the sources with one planted import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("partitions", "clients", "strategies", "experiments")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root,
                          capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          timeout=300)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.toml", "*.ipynb"))
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_sources_keep_every_contract(sources):
    result = _lint(sources)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("module, planted, broken", [
    # A circle through an import inside a function: the one kind Python lets run.
    ("clients/kept_processes.py", "def _planted():\n    import clients.client_actor  # noqa\n", "No cycles are allowed in clients"),
    ("experiments/runtime/cli.py", "def _planted():\n    from experiments import api  # noqa\n",
     "No cycles are allowed in experiments"),
    # A lower layer importing a higher one.
    ("partitions/cache.py", "def _planted():\n    import strategies.config  # noqa\n", "partitions is not allowed to import strategies"),
])
def test_a_planted_import_breaks_a_contract(sources, module, planted, broken):
    path = sources / module
    original = path.read_text()
    path.write_text(original + "\n\n" + planted)
    try:
        result = _lint(sources)
    finally:
        path.write_text(original)
    assert result.returncode != 0 and broken in result.stdout, result.stdout[-3000:]


MODULE_DOCSTRING_LINES = 25  # a few lines of what and why; equations go to the class or function


def test_module_docstrings_say_what_and_why_in_a_few_lines():
    """Detail (an algorithm's steps, another code's quirks) sits on the class or function that
    implements it, and measurements in docs/speed.md, where they are read beside the code."""
    import ast

    too_long = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
            if len(docstring.splitlines()) > MODULE_DOCSTRING_LINES:
                too_long[str(path.relative_to(REPO))] = len(docstring.splitlines())
    assert not too_long, f"module docstrings over {MODULE_DOCSTRING_LINES} lines: {too_long}"


MAX_MODULE_LINES = 400


def long_modules(root: Path = REPO) -> dict[str, int]:
    """Modules of Basin and its tests over MAX_MODULE_LINES lines."""
    lengths = {path.relative_to(root).as_posix(): len(path.read_text().splitlines())
               for folder in (*PACKAGES, "tests", "examples") for path in (root / folder).rglob("*.py")}
    return {name: n for name, n in sorted(lengths.items()) if n > MAX_MODULE_LINES}


def test_no_module_is_over_400_lines():
    """A module over 400 lines has done two jobs each time it was looked at: split it by job."""
    assert not long_modules(), long_modules()


def _one_edit_apart(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) <= 1
    short, long = sorted((a, b), key=len)
    return len(long) - len(short) == 1 and any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def confusable_names(root: Path = REPO) -> list[tuple[str, str]]:
    """Pairs of modules or folders of Basin's packages whose names are the same or one letter
    apart, but methods' modules: a method's two halves share its name (strategies/fedfa.py,
    clients/objectives/fedfa.py), and methods are named by their papers (fedavg, fedacg)."""
    from strategies.methods.registry import AVERAGING_MODULES, METHOD_MODULES

    method_names = {module.rpartition(".")[2] for module in (*METHOD_MODULES, *AVERAGING_MODULES)}
    entries = sorted(path.relative_to(root).as_posix() for package in PACKAGES for path in (root / package).rglob("*")
                     if "__pycache__" not in path.parts and (path.is_dir() or path.suffix == ".py")
                     and path.stem not in ("__init__", "__main__"))
    stems = {entry: Path(entry).stem for entry in entries}
    return [(a, b) for i, a in enumerate(entries) for b in entries[i + 1:]
            if _one_edit_apart(stems[a], stems[b]) and not {stems[a], stems[b]} <= method_names]


def test_no_two_modules_share_a_name_or_differ_by_one_letter():
    assert not confusable_names(), confusable_names()


def test_the_shape_checks_bite_on_a_planted_long_module_and_a_planted_name(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "strategies" / "methods.py").write_text("")
    (tmp_path / "strategies" / "method.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "clients" / "flower_internals").mkdir()
    (tmp_path / "clients" / "flower_internals" / "engine.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "clients" / "fedfa.py").write_text("")
    (tmp_path / "strategies" / "fedfa.py").write_text("")
    assert confusable_names(tmp_path) == [("strategies/method.py", "strategies/methods.py")]
    assert long_modules(tmp_path) == {"strategies/method.py": MAX_MODULE_LINES + 1,
                                      "clients/flower_internals/engine.py": MAX_MODULE_LINES + 1}


def test_no_test_name_is_in_two_files():
    """A failing test's name says where it is: no name in two files."""
    import ast
    from collections import defaultdict

    files = defaultdict(list)
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                files[node.name].append(path.name)
    assert not {name: where for name, where in files.items() if len(where) > 1}
