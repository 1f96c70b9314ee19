"""A run's simulation process, started by the launcher beside ``flwr run`` with its imports
done before Flower asks for it.

Flower's SuperExec starts the simulation process (``flwr-simulation``, which hosts the
ServerApp and drives Ray) only once the SuperLink it waits for is up and has the run.
That process then spends ~3 s on 2 CPU cores importing Flower's simulation engine (with
its SQL and web stacks) and Ray, and its ServerApp thread ~2.5 s more importing torch
and Basin's server side: ~7 s on one core (one interpreter), while the other core idled.
The launcher therefore starts :func:`serve` as soon as it starts ``flwr run``: it makes
those imports while the SuperLink and the SuperExec start, then waits on a Unix socket in
the run's ``FLWR_HOME``. The run's ``flwr-simulation`` (the launcher's, first on the
run's ``PATH``) calls :func:`hand_over`: it sends its command line, environment, working
folder and standard streams, and this process runs Flower's simulation command with them
(``clients.simulation_engine.run_flower_simulation``, as the command itself would), then
sends back its exit status, which the command exits with. The command forwards the
signals it gets; where it dies this process ends at once (SIGKILL, as the command's
death would end the simulation it replaces). Where no warm process answers, the command
runs the simulation itself, as before.

This module imports only the standard library at its top: the command loads it first.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import sys
import threading

# The socket's name in the run's FLWR_HOME.
SOCKET_NAME = "warm-simulation.sock"
# The longest path a Unix socket may have (sun_path, with its terminating NUL).
MAX_SOCKET_PATH = 107
# The signals the command passes on to the process that runs the simulation.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STATUS = struct.Struct("!i")


def socket_path(flwr_home: str) -> str | None:
    """The run's socket, None where its path is too long for a Unix socket."""
    path = os.path.join(flwr_home, SOCKET_NAME)
    return path if len(path.encode()) <= MAX_SOCKET_PATH else None


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def hand_over(path: str | None) -> int | None:
    """Have the warm process at ``path`` run this command; its exit status, or None where
    none answers (the command then runs the simulation itself)."""
    if path is None:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        return None
    request = json.dumps({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    # A signal that comes once the warm process may have the command waits for the handlers
    # that pass it on (it would otherwise end this command by default, and the warm process
    # by SIGKILL instead of by that signal).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        socket.send_fds(connection, [STATUS.pack(len(request)) + request], [0, 1, 2])
        (pid,) = STATUS.unpack(_receive_exactly(connection, STATUS.size))
    except ConnectionError:  # it ended before taking the command over (its imports failed)
        connection.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        return None
    for number in FORWARDED_SIGNALS:
        signal.signal(number, lambda received, _frame: os.kill(pid, received))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    try:
        (status,) = STATUS.unpack(_receive_exactly(connection, STATUS.size))
    except ConnectionError:  # it died without a status: killed
        return 1
    return status


def serve(path: str, preload: list[str]) -> None:
    """Listen at ``path``, import the modules ``preload`` names (the launcher's list: Flower's
    simulation command and engine, the ServerApp's work), then run the simulation
    (``clients.simulation_engine.run_flower_simulation``) for the first command that hands
    itself over (see the module docstring)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)  # a command that comes during the imports waits for them
    environment_before = dict(os.environ)
    for module in preload:
        importlib.import_module(module)
    # What the imports set in the environment (Flower's simulation module sets Ray's uv
    # switch), kept under the command's environment below.
    set_by_imports = {key: value for key, value in os.environ.items() if environment_before.get(key) != value}
    connection, _ = listener.accept()
    listener.close()
    os.unlink(path)
    # The streams come with the message's first bytes (a plain recv would drop them).
    message, fds, _flags, _address = socket.recv_fds(connection, 1 << 16, 3)
    while len(message) < STATUS.size:
        message += _receive_exactly(connection, STATUS.size - len(message))
    (size,) = STATUS.unpack(message[:STATUS.size])
    message = message[STATUS.size:]
    if len(message) < size:
        message += _receive_exactly(connection, size - len(message))
    request = json.loads(message)
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in set_by_imports.items():
        os.environ.setdefault(key, value)
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    connection.sendall(STATUS.pack(os.getpid()))
    finished = threading.Event()

    def end_with_the_command() -> None:
        # Returns when the command is gone: end of file, or a reset where it died with data unread.
        with contextlib.suppress(OSError):
            connection.recv(1)
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=end_with_the_command, daemon=True).start()
    from clients.simulation_engine import run_flower_simulation

    status = 1
    try:
        status = _exit_status(run_flower_simulation)
    finally:
        finished.set()
        sys.stdout.flush()
        sys.stderr.flush()
        connection.sendall(STATUS.pack(status))
    sys.exit(status)


def _exit_status(command) -> int:
    """``command()``'s exit status, as ``sys.exit(command())`` would give it."""
    try:
        result = command()
    except SystemExit as ending:
        result = ending.code
    if result is None:
        return 0
    return result if isinstance(result, int) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())  # the staged app, the launcher's working folder for it
    serve(sys.argv[1], sys.argv[2:])
