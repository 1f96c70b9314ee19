"""A local SuperNode's ClientApp processes, forked from one that imported Flower's ClientApp
runtime and torch once (the local Deployment Engine: experiments/runtime/deployment.py).

Under Flower's subprocess isolation a SuperNode's SuperExec starts a new ``flwr-clientapp``
process for every message it gets (each round's instruction), and each such process spent
~3 s of CPU importing Flower's ClientApp runtime and torch before it did anything (2 cores:
round 1 of 5 SuperNodes took 17 s). :func:`serve` makes those imports once per SuperNode,
then listens on a Unix socket in the node's ``FLWR_HOME``; the node's ``flwr-clientapp``
(Basin's, first on the node's ``PATH``: :func:`write_command`) hands itself over
(:func:`clients.warm_simulation.hand_over`: its command line, environment, folder and
standard streams), and a child forked for it runs Flower's ClientApp command with them and
sends the exit status back, which the command exits with. The child first forgets Basin's
own modules and folder, which only the server's start put there: the ClientApp loads from
the run's FAB, as in a process of its own. Where no server answers, the command runs
Flower's ClientApp itself.

This module imports only the standard library at its top: the command loads it first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

from clients.warm_simulation import exit_forked_child, import_all, listen, run_handed_over, socket_path

# The variable that names a SuperNode's socket in the environment its SuperExec passes on.
SOCKET_VARIABLE = "BASIN_WARM_CLIENTAPP"
SOCKET_NAME = "warm-clientapp.sock"
# What a ClientApp process imports before it runs anything (Flower's command and runtime,
# torch), made once by the server.
IMPORTS = ("flwr.supernode.cli.flwr_clientapp", "flwr.supernode.runtime.run_clientapp", "torch")
# Basin's packages: the server imports them from Basin's folder, a ClientApp from its FAB.
BASIN_PACKAGES = ("clients", "strategies", "partitions", "experiments")


def write_command(bin_dir: Path, app_dir: Path) -> Path | None:
    """Write ``flwr-clientapp`` into ``bin_dir`` (to go first on the SuperNodes' ``PATH``;
    their SuperExec starts the command by name) and return its path: it hands itself over to
    the server its environment names, else runs Flower's own command. None where a script
    cannot name this Python on its first line (a space in its path): Flower's command runs."""
    if any(character.isspace() for character in sys.executable):
        return None
    bin_dir.mkdir(parents=True, exist_ok=True)
    command = bin_dir / "flwr-clientapp"
    command.write_text(f"#!{sys.executable}\n"
                       "import os, sys\n"
                       f"sys.path.insert(0, {str(app_dir)!r})\n"
                       "from clients.warm_simulation import hand_over\n"
                       f"status = hand_over(os.environ.get({SOCKET_VARIABLE!r}))\n"
                       "if status is None:\n"
                       "    del sys.path[0]\n"
                       "    from flwr.supernode.cli import flwr_clientapp\n"
                       "    status = flwr_clientapp()\n"
                       "sys.exit(status)\n")
    command.chmod(0o755)
    return command


def server_socket(flwr_home: str) -> str | None:
    """A SuperNode's socket in its FLWR_HOME; None where the path is too long for a Unix socket."""
    return socket_path(flwr_home, SOCKET_NAME)


def serve(path: str, preload: list[str]) -> None:
    """Listen at ``path``, import ``preload``, then fork a child for every command that
    hands itself over, until killed (with the SuperNode's processes, by its FLWR_HOME)."""
    listener = listen(path, backlog=16)  # a command that comes during the imports waits for them
    set_by_imports = import_all(preload)
    own_folder = sys.path[0]
    # Children are reaped by the kernel; a child restores the default (its ClientApp waits for its own).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        connection, _ = listener.accept()
        if (pid := os.fork()) != 0:
            connection.close()
            print(f"[basin] a ClientApp process ({pid}) forked from the warm one ({os.getpid()})", flush=True)
            continue
        listener.close()
        exit_forked_child(lambda: _run_clientapp(connection, set_by_imports, own_folder))


def _run_clientapp(connection: socket.socket, set_by_imports: dict[str, str], own_folder: str) -> None:
    """In a child of :func:`serve`: forget Basin's modules and folder, then run Flower's
    ClientApp command as the command that handed itself over on ``connection``."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for name in [name for name in sys.modules if name.partition(".")[0] in BASIN_PACKAGES]:
        del sys.modules[name]
    with contextlib.suppress(ValueError):
        sys.path.remove(own_folder)
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    run_handed_over(connection, set_by_imports, flwr_clientapp)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
