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
# Modules whose print() is a command line's own output (tables, results, its error lines).
COMMAND_OUTPUT = {
    "strategies/methods.py", "experiments/runtime/cli.py", "experiments/runtime/flwr_command.py",
    "experiments/runtime/benchmarking.py", "experiments/runtime/startup_timing.py", "experiments/runtime/method_speed.py",
    "experiments/runtime/method_costs.py", "experiments/runtime/reproduction.py", "experiments/runtime/deployment.py",
}


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


def test_no_library_module_prints():
    """Basin's own lines go through the log; print() is left to the command lines' output."""
    printing = []
    for package in ("partitions", "clients", "strategies", "experiments"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            library = package != "experiments" or relative == "experiments/api.py" or "/runtime/" in relative
            if not library or relative in COMMAND_OUTPUT:
                continue
            calls = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print"]
            printing += [f"{relative}:{line}" for line in calls]
    assert not printing, printing
