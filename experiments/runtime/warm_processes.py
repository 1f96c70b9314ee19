"""A run's warm processes: Flower's commands of the run, each taken over by a process that
made its imports before Flower started the command.

Flower starts a run's processes by command name, one after another, each importing
Flower (and the simulation also Ray, torch and Basin's server side) before it does anything:
``flwr run`` starts the SuperLink, the SuperLink its SuperExec, the SuperExec the simulation
process. The launcher writes the run's own commands first on its ``PATH``
(:func:`write_warm_command`); each hands itself over to a process waiting on a Unix socket
in the run's ``FLWR_HOME`` (clients/warm_simulation.py), or where none answers runs
Flower's command itself.

- ``flwr run``, the SuperLink and the SuperExec (:func:`start_warm_commands`): children of
  a fork server (experiments/runtime/simulation_forks.py), the run's own or on a job's own
  Ray cluster the job's, forked once it has imported their modules.
- The simulation (:func:`start_warm_simulation`): a child of the same server, forked once
  it has imported the rest while the SuperLink and the SuperExec start; where the server
  cannot take the run, a process of its own that makes those imports.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from clients.flower_internals import ENGINE_MODULE
from clients.warm_simulation import command_socket_path, installed_command, socket_path
from experiments.runtime.simulation_forks import ForkedProcess, SimulationForks

# What the warm simulation process imports before Flower asks for it: Flower's simulation
# engine and command, Basin's replacements, and the ServerApp's work (torch, the server side).
WARM_SIMULATION_IMPORTS = (ENGINE_MODULE, "flwr.simulation.app", "clients.simulation_engine", "strategies.server_work")
WARM_SIMULATION_SWITCH = "BASIN_WARM_SIMULATION"
# Flower's commands of a run that its fork server also has warm, by name, with what each
# runs where that is not the installed command of that name: the run's `flwr run` (Basin's,
# experiments/runtime/flwr_command.py), the SuperLink it starts and the SuperExec that the
# SuperLink starts. Each imports Flower first, ~1.3 CPU-seconds for the SuperLink and 0.9 for
# `flwr run` (2 cores), in every run; the server imports it once (`flwr run`'s command line
# itself, 0.1 CPU-seconds more, in its forked process: experiments/runtime/flwr_command.py).
WARM_COMMANDS: dict[str, str | None] = {
    "flwr": "experiments.runtime.flwr_command:command_line",
    "flower-superlink": None,
    "flower-superexec": None,
}


# What each run's forked processes went on importing after the fork, which a job's fork
# server imports once instead: Ray (the simulation's Ray driver), pandas and matplotlib (the
# partition's table and figure). A job of four small runs, 2 cores: its later runs 2.1-2.4 s
# each instead of 3.3-3.8 s, 28.6 CPU-s in all instead of 34.4. A run alone gained nothing
# from them in its warm process (it needs them about when its imports would be done), so
# there they stay where they are. Never Flower's Ray backend (2 ms more in each run): it
# makes its actor class with a random ID, which seeds Ray's ID generator, and the runs
# forked after it drew the same IDs (tests/test_flwr_command.py).
JOB_SERVER_IMPORTS = ("ray", "pandas", "matplotlib.pyplot")


@functools.cache
def warm_command_imports() -> tuple[str, ...]:
    """What a fork server imports before it forks a run's commands (WARM_COMMANDS): each one's
    module, which the simulation's imports hold (1.0 of their 2.4 CPU-seconds, 2 cores)."""
    return tuple(installed_command(name).module if entry is None else entry.partition(":")[0]
                 for name, entry in WARM_COMMANDS.items())


def warm_job_imports() -> tuple[str, ...]:
    """Everything a job's fork server imports: the commands' modules, the simulation's
    imports and JOB_SERVER_IMPORTS."""
    return (*warm_command_imports(), *WARM_SIMULATION_IMPORTS, *JOB_SERVER_IMPORTS)


def write_warm_command(flwr_home: Path, app: Path, command: str = "flwr-simulation") -> Path | None:
    """Write the run's ``command`` (``flwr-simulation`` or one of WARM_COMMANDS) into
    ``flwr_home/bin`` and return that folder (it goes first on the run's ``PATH``; Flower
    starts the command by name, the launcher ``flwr`` by its path): it hands itself over to the
    run's warm process for it where one answers, else runs what it names itself
    (``clients.warm_simulation.run_named_command``), with the staged app (the sources of the
    run's FAB) first on its path: for ``flwr-simulation``, Flower's command with Basin's
    simulation-engine replacements installed before Flower's engine starts; for ``flwr``,
    Basin's (its entry in WARM_COMMANDS); for the others, Flower's. None where a script
    cannot name this Python on its first line (a space in its path): Flower's own command
    runs, the replacements installed as the ServerApp loads."""
    if any(character.isspace() for character in sys.executable):
        return None
    bin_dir = flwr_home / "bin"
    bin_dir.mkdir(exist_ok=True)
    entry = WARM_COMMANDS.get(command)
    script = bin_dir / command
    script.write_text(f"#!{sys.executable}\n"
                      "import sys\n"
                      f"sys.path.insert(0, {str(app)!r})\n"
                      "from clients.warm_simulation import hand_over, run_named_command\n"
                      f"status = hand_over({command_socket_path(str(flwr_home), command)!r}, {entry!r})\n"
                      "if status is None:\n"
                      f"    status = run_named_command({entry!r})\n"
                      "sys.exit(status)\n")
    script.chmod(0o755)
    return bin_dir


def copy_of(app: Path) -> Callable[[Path], Path]:
    """What puts the staged ``app`` into a folder: for the job's fork server, which imports from there."""
    return lambda destination: Path(shutil.copytree(app, destination, ignore=shutil.ignore_patterns("__pycache__")))


def staging(forks: SimulationForks, app: Path) -> Callable[[Path], Path]:
    """What puts the run's staged ``app`` where ``forks``' server imports from: a run's own
    server imports from the app itself, a job's from a copy in the job's folder (the run's
    own goes with the run)."""
    return (lambda _folder: app) if forks.run_own else copy_of(app)


def start_warm_simulation(flwr_home: Path, app: Path, env: Mapping[str, str], forks: SimulationForks | None = None,
                          imports: tuple[str, ...] = WARM_SIMULATION_IMPORTS) -> subprocess.Popen | ForkedProcess | None:
    """Start the run's warm simulation process (clients/warm_simulation.py), which makes the
    simulation's ``imports`` while the SuperLink and the SuperExec start; None where the
    run's ``flwr-simulation`` cannot reach one, or ``BASIN_WARM_SIMULATION=off``. Forked from
    ``forks``' server, the run's own or its job's (experiments/runtime/simulation_forks.py;
    stopped by its PID) once that has made the ``imports``; where it cannot take the run, or
    without one, a process of its own with the run's environment (FLWR_HOME: stopped with the
    run's processes)."""
    path = socket_path(str(flwr_home))
    if path is None or os.environ.get(WARM_SIMULATION_SWITCH, "on") == "off":
        return None
    if forks is not None and (forked := forks.fork(path, app, env, imports, staging(forks, app))) is not None:
        return forked
    return subprocess.Popen([sys.executable, "-m", "clients.warm_simulation", path, *imports],
                            cwd=app, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def start_warm_commands(flwr_home: Path, app: Path, env: Mapping[str, str],
                        forks: SimulationForks) -> dict[str, ForkedProcess]:
    """The run's ``flwr``, SuperLink and SuperExec (WARM_COMMANDS), each a process forked from
    ``forks``' server (the run's own or its job's) once that has imported the commands'
    modules, that waits for its command (the run's own, in ``flwr_home/bin``:
    :func:`write_warm_command`) to hand itself over; stopped by their PIDs. By command name;
    empty with ``BASIN_WARM_SIMULATION=off``, and from the first command the server cannot
    take (that one and those after it run themselves)."""
    forked: dict[str, ForkedProcess] = {}
    if os.environ.get(WARM_SIMULATION_SWITCH, "on") == "off":
        return forked
    for command in WARM_COMMANDS:
        path = command_socket_path(str(flwr_home), command)
        if path is None or write_warm_command(flwr_home, app, command) is None:
            break
        if (process := forks.fork(path, app, env, warm_command_imports(), staging(forks, app))) is None:
            break  # the command finds no warm process at its socket: it runs itself
        forked[command] = process
    return forked
