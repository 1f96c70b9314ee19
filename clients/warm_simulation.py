"""A run's simulation process, started by the launcher beside ``flwr run`` with its imports
done before Flower asks for it.

Flower's SuperExec starts the simulation process (``flwr-simulation``, which hosts the
ServerApp and drives Ray) only once the SuperLink it waits for is up and has the run.
That process then spends ~3 s on 2 CPU cores importing Flower's simulation engine (with
its SQL and web stacks) and Ray, and its ServerApp thread ~2.5 s more importing torch
and Basin's server side: ~7 s on one core (one interpreter), while the other core idled.
The launcher therefore has a warm process make those imports while the SuperLink and the
SuperExec start, a child of the run's fork server (:func:`fork_server`), or where that
cannot take the run a process of its own (:func:`serve`), which then waits on a Unix socket
in the run's ``FLWR_HOME``. The run's ``flwr-simulation`` (the launcher's, first on the
run's ``PATH``) calls :func:`hand_over`: it sends its command line, environment, working
folder and standard streams, and this process runs Flower's simulation command with them
(``clients.simulation_engine.run_flower_simulation``, as the command itself would), then
sends back its exit status, which the command exits with. The command forwards the
signals it gets; where it dies this process ends at once (SIGKILL, as the command's
death would end the simulation it replaces). Where no warm process answers, the command
runs the simulation itself, as before. The run's ``flwr``, SuperLink and SuperExec
commands hand themselves over to children of the same server the same way
(:func:`run_named_command` runs what the command names; experiments/runtime/warm_processes.py).

This module imports only the standard library at its top: the command loads it first.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

# The socket's name in the run's FLWR_HOME.
SOCKET_NAME = "warm-simulation.sock"
# The longest path a Unix socket may have (sun_path, with its terminating NUL).
MAX_SOCKET_PATH = 107
# The signals the command passes on to the process that runs the simulation.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
STATUS = struct.Struct("!i")


def socket_path(flwr_home: str, name: str = SOCKET_NAME) -> str | None:
    """The run's socket (``name`` in its FLWR_HOME), None where its path is too long for a Unix socket."""
    path = os.path.join(flwr_home, name)
    return path if len(path.encode()) <= MAX_SOCKET_PATH else None


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        data += chunk
    return data


def hand_over(path: str | None, entry: str | None = None) -> int | None:
    """Have the warm process at ``path`` run this command (``entry``: the function it runs,
    "module:function", where that is not what the command's name runs: :func:`run_named_command`);
    its exit status, or None where none answers (the command then runs itself)."""
    if path is None:
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        return None
    # A signal that comes once the warm process may have the command waits for the handlers
    # that pass it on (it would otherwise end this command by default, and the warm process
    # by SIGKILL instead of by that signal).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
    try:
        send_request(connection, {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "entry": entry},
                     [0, 1, 2])
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
    listener = listen(path)  # a command that comes during the imports waits for them
    set_by_imports = import_all(preload)
    _take_over(listener, path, set_by_imports)


def listen(path: str, backlog: int = 1) -> socket.socket:
    """A Unix socket listening at ``path``, for ``backlog`` commands at once."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(backlog)
    return listener


def import_all(modules: list[str]) -> dict[str, str]:
    """Import ``modules``; return what the imports set in the environment (Flower's
    simulation module sets Ray's uv switch), kept under the command's environment."""
    environment_before = dict(os.environ)
    for module in modules:
        importlib.import_module(module)
    return {key: value for key, value in os.environ.items() if environment_before.get(key) != value}


def command_socket_path(flwr_home: str, command: str) -> str | None:
    """The socket in the run's FLWR_HOME at which ``command`` (its name) hands itself over."""
    return socket_path(flwr_home, SOCKET_NAME if command == "flwr-simulation" else f"warm-{command}.sock")


def installed_command(name: str) -> EntryPoint:
    """The entry point of the installed console command ``name``: what its script runs."""
    from importlib.metadata import entry_points

    (found,) = entry_points(group="console_scripts", name=name)
    return found


def run_named_command(entry: str | None = None) -> object:
    """Run what the command named by ``sys.argv[0]`` runs: ``entry`` ("module:function",
    called as a console script's entry point is) where given (the run's ``flwr``: Basin's,
    experiments/runtime/flwr_command.py); for ``flwr-simulation``, Flower's simulation with
    Basin's engine replacements (``clients.simulation_engine``); for another command (the
    run's SuperLink and SuperExec: each would import Flower's server side in a process of its
    own), the installed command's entry point."""
    if entry is not None:
        from importlib.metadata import EntryPoint

        return EntryPoint(name=os.path.basename(sys.argv[0]), value=entry, group="console_scripts").load()()
    name = os.path.basename(sys.argv[0])
    if name == "flwr-simulation":
        from clients.simulation_engine import run_flower_simulation

        return run_flower_simulation()
    return installed_command(name).load()()


def _take_over(listener: socket.socket, path: str, set_by_imports: dict[str, str]) -> None:
    """Take over the first command that hands itself over at ``listener``, run what it
    would run (:func:`run_named_command`), send it the exit status, and exit with it."""
    connection, _ = listener.accept()
    listener.close()
    os.unlink(path)
    run_handed_over(connection, set_by_imports, run_named_command)


def run_handed_over(connection: socket.socket, set_by_imports: dict[str, str],
                    command: Callable[[], object]) -> NoReturn:
    """Become the command that handed itself over on ``connection`` (its standard streams,
    environment, folder and command line; ``set_by_imports`` kept under its environment),
    run ``command`` (what the command would run; the entry the command names instead, where
    it names one: :func:`hand_over`), send the command the exit status, and exit with it;
    where the command dies first, die at once (SIGKILL)."""
    request, fds = receive_request(connection, 3)
    if request.get("entry") is not None:
        command = functools.partial(run_named_command, request["entry"])
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
    status = 1
    try:
        status = _exit_status(command)
    finally:
        finished.set()
        sys.stdout.flush()
        sys.stderr.flush()
        connection.sendall(STATUS.pack(status))
    sys.exit(status)


def receive_request(connection: socket.socket, max_fds: int) -> tuple[dict, list[int]]:
    """One request: its length, its JSON, and up to ``max_fds`` file descriptors that
    come with its first bytes (a plain recv would drop them); ``({}, [])`` at end of file."""
    message, fds, _flags, _address = socket.recv_fds(connection, 1 << 16, max_fds)
    if not message:
        return {}, []
    while len(message) < STATUS.size:
        message += _receive_exactly(connection, STATUS.size - len(message))
    (size,) = STATUS.unpack(message[:STATUS.size])
    message = message[STATUS.size:]
    if len(message) < size:
        message += _receive_exactly(connection, size - len(message))
    return json.loads(message), fds


def send_request(connection: socket.socket, request: dict, fds: list[int]) -> None:
    """Send what :func:`receive_request` reads."""
    data = json.dumps(request).encode()
    socket.send_fds(connection, [STATUS.pack(len(data)) + data], fds)


def fork_server(control_fd: int, stop_children: bool = True) -> None:
    """A run's or a job's warm processes, forked from one that imports once.

    Each run needs a simulation process, a SuperLink, a SuperExec and ``flwr run``, and each
    imported Flower (the simulation also Ray, torch and Basin's server side: ~3 of its ~4
    CPU-seconds on 2 cores). This process reads requests on the Unix socket ``control_fd``
    (:func:`send_request`: ``{"socket": PATH, "cwd": FOLDER, "imports": [MODULE, ...]}``
    with the run's listening socket, bound by the launcher so that the run's command can
    connect at once), in turn: it imports what the request names and it has not imported
    yet, forks, and sends back the child's PID (``STATUS``); the child chdirs to the run's
    folder and serves the socket as :func:`serve` does after its imports. At end of file
    (the launcher closed its end at the job's or run's end, or died) it exits, killing the
    children still running first where ``stop_children``. A child has this process's
    environment until a command hands itself over (then the command's, FLWR_HOME included):
    a job's server has none of a run's, and the launcher stops its children by their PIDs. A
    run's own server (``stop_children`` false) has the run's, and so do its children: they
    are stopped with the run's other processes, in the order of that clean-up (the
    launcher's, or its guardian's where the launcher died). Killed here first, the
    simulation's Ray head went with it, and Ray's agents, no longer below it when the
    guardian looked and without the run's FLWR_HOME (Ray writes their process titles over
    their environment), were left running."""
    control = socket.socket(fileno=control_fd)
    set_by_imports: dict[str, str] = {}
    children: set[int] = set()

    def reap(*_: object) -> None:
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    children.discard(pid)

    signal.signal(signal.SIGCHLD, reap)
    # Ctrl-C reaches the whole process group: the job's launcher says when this process ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        while True:
            try:
                request, fds = receive_request(control, 1)
            except (OSError, ConnectionError):
                break
            if not fds:
                break
            listener = socket.socket(fileno=fds[0])
            set_by_imports.update(import_all(request.get("imports", [])))
            pid = os.fork()
            if pid == 0:
                control.close()
                _serve_forked(listener, request["socket"], request["cwd"], set_by_imports)
            listener.close()
            children.add(pid)
            reap()  # one that ended before it was added
            try:
                control.sendall(STATUS.pack(pid))
            except OSError:
                break
    finally:  # also where an import failed: no child waits for a command that will not come
        stopped = list(children) if stop_children else []
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for pid in stopped:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _serve_forked(listener: socket.socket, path: str, cwd: str, set_by_imports: dict[str, str]) -> NoReturn:
    """A forked child of :func:`fork_server`: serve the run's socket; never return into the server's loop."""

    def serve_run() -> None:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the simulation waits for the processes it starts
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY)):  # not the server's request and PID pipes
            null = os.open(os.devnull, mode)
            os.dup2(null, target)
            os.close(null)
        os.chdir(cwd)
        _take_over(listener, path, set_by_imports)

    exit_forked_child(serve_run)


def exit_forked_child(body: Callable[[], object]) -> NoReturn:
    """In a child forked from a server: run ``body``, then end the process at once with the
    status it exited with (1 where it raised, an error's traceback on standard error as
    Python's own exit prints it, or returned), after the exit functions that a process's own exit runs
    (what the command registered); never return into the server's loop."""
    status = 1
    try:
        body()
    except SystemExit as ending:
        status = ending.code if isinstance(ending.code, int) else (0 if ending.code is None else 1)
    except Exception:
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


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
    if sys.argv[1] == "--fork-server":
        fork_server(int(sys.argv[2]), stop_children="--leave-children" not in sys.argv[3:])
    else:
        serve(sys.argv[1], sys.argv[2:])
