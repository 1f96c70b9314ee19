"""Basin's log (clients/log.py): whole ``[basin]`` lines on the current standard error, a
level a notebook sets with one call, and the command lines' --quiet and --verbose; no
library module prints."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from clients.log import log
from experiments.runtime.cli import add_verbosity_options, apply_verbosity

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture
def level():
    before = log.level
    yield
    log.setLevel(before)


def test_lines_go_whole_to_the_current_stderr_and_a_notebook_silences_them_with_one_call(capsys, level):
    log.info("training round 1")
    log.getChild("reproduce").warning("2 runs cannot load their data here")
    log.warning("interrupted: 1 of 2 runs completed", extra={"bare": True})
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == ["[basin] training round 1", "[reproduce] 2 runs cannot load their data here",
                                         "interrupted: 1 of 2 runs completed"]
    logging.getLogger("basin").setLevel(logging.WARNING)  # what docs/python-api.md tells a notebook
    log.info("training round 2")
    log.warning("tracker stopped")
    assert capsys.readouterr().err == "[basin] tracker stopped\n"


@pytest.mark.parametrize("flags, shown", [([], ["info", "warning"]), (["--quiet"], ["warning"]),
                                          (["--verbose"], ["debug", "info", "warning"])])
def test_quiet_and_verbose_set_what_a_command_shows(capsys, level, flags, shown):
    import argparse

    parser = argparse.ArgumentParser()
    add_verbosity_options(parser)
    apply_verbosity(parser.parse_args(flags))
    for name in ("debug", "info", "warning"):
        getattr(log, name)(name)
    assert [line.removeprefix("[basin] ") for line in capsys.readouterr().err.splitlines()] == shown


# What the commands do once their arguments are parsed: their output is the commands' own.
COMMAND_BODIES = ("experiments/analysis/", "experiments/measurement/", "experiments/reproduction/")


def is_program(tree: ast.Module) -> bool:
    """Whether a module runs as a program (``if __name__ == "__main__":``): its output is its own."""
    return any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) for node in tree.body)


def library_prints(root: Path = REPO) -> list[str]:
    """Every print() of a library module: every module but the programs (the commands, and
    the ones Basin starts) and the commands' bodies."""
    printing = []
    for package in ("partitions", "clients", "strategies", "experiments"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text())
            if not relative.startswith(COMMAND_BODIES) and not is_program(tree):
                printing += [f"{relative}:{node.lineno}" for node in ast.walk(tree)
                             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"]
    return printing


def test_no_library_module_prints(tmp_path):
    """Basin's own lines go through the log; print() is left to the commands' output. Shown to
    bite on a copy of the machinery with one planted print()."""
    assert not library_prints(), library_prints()
    planted = tmp_path / "experiments" / "runtime"
    planted.mkdir(parents=True)
    (planted / "launch.py").write_text((REPO / "experiments/runtime/launch.py").read_text() + "\nprint('planted')\n")
    assert library_prints(tmp_path) == [f"experiments/runtime/launch.py:{len((planted / 'launch.py').read_text().splitlines())}"]
