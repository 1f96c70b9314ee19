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
