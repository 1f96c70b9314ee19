"""A run's warm processes, forked from one process that imported once.

A run needs a simulation process (it imports Flower's simulation engine, Ray, torch and
Basin's server side: ~3 of its ~4 CPU-seconds on 2 cores), and ``flwr run``, a SuperLink
and a SuperExec, each of which imported Flower's server side in a process of its own. The
launcher instead starts a fork server (``clients.warm_simulation.fork_server``), which
makes those imports once, in turn: it forks the run's ``flwr run``, SuperLink and SuperExec
once it has imported their modules, and its simulation process after the rest
(``warm_processes.start_warm_commands`` and ``start_warm_simulation``). Each child waits
for its command to hand itself over (clients/warm_simulation.py).

A job of several runs on its own Ray cluster (``LocalRayCluster``: ``--compare``, the main
job, a sweep) has one server for all its runs, started at its first run. Its children do
not carry their run's FLWR_HOME in their environment (that of the server, until the run's
command hands itself over), so the launcher stops each by its PID (:class:`ForkedProcess`),
and the server kills those still running when the job ends or its launcher dies (end of
file on its control socket). A run alone has a server of its own (``run_own``), with the
run's environment: it and its children are found and stopped by the run's FLWR_HOME, as
the run's other processes are, and the launcher stops it when the run ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from clients.warm_simulation import STATUS, send_request
from experiments.runtime.processes import alive

# Run-config environment that belongs to one run, not to the job's fork server.
PER_RUN_VARIABLES = ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")


class ForkedProcess:
    """One process forked for a run by a fork server (its simulation, `flwr run`, SuperLink
    or SuperExec): stopped by its PID, which the server sends once it has forked (after the
    imports that the request names)."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.forked = threading.Event()  # set with the PID, or with None where the server ended first

    def kill(self, timeout: float = 120.0) -> None:
        if self.forked.wait(timeout) and self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 10.0) -> None:
        """Return once it has ended (its server reaps it), or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.pid is not None and alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.02)


class SimulationForks:
    """A fork server: a job's, started at the job's first run (:meth:`fork`) and stopped with
    the job (:meth:`close`); or with ``run_own`` a run's own, whose server keeps the run's
    environment (FLWR_HOME: found and stopped with the run's processes, as they are) and
    imports from the run's staged app, stopped with the run."""

    def __init__(self, folder: Path, run_own: bool = False) -> None:
        self.folder = folder  # the job's: the server's staged app lives there until the job ends
        self.run_own = run_own
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._pending: collections.deque[ForkedProcess] = collections.deque()
        self._lock = threading.Lock()

    def fork(self, path: str, cwd: Path, env: Mapping[str, str], imports: tuple[str, ...],
             stage: Callable[[Path], Path]) -> ForkedProcess | None:
        """A warm process for the run's command that connects at ``path``, in ``cwd``, forked
        once the server has imported ``imports`` (requests are served in turn: an earlier
        request's imports come first); None where the server cannot take it (the caller
        starts one of its own). ``env``: the run's environment (for a job's server, its
        per-run part is left out of the server's); ``stage``: puts the app's sources into a
        folder (the server imports from there)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)  # the run's command may connect before the server has forked
            with self._lock:
                if self._server is None:
                    self._start(env, stage)
                forked = ForkedProcess()
                assert self._control is not None
                send_request(self._control, {"socket": path, "cwd": str(cwd), "imports": list(imports)},
                             [listener.fileno()])
                self._pending.append(forked)
            return forked
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        finally:
            listener.close()

    def _start(self, env: Mapping[str, str], stage: Callable[[Path], Path]) -> None:
        app = stage(self.folder / "simulation-app")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_env = {key: value for key, value in env.items() if self.run_own or key not in PER_RUN_VARIABLES}
        server_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        try:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "clients.warm_simulation", "--fork-server", str(theirs.fileno()),
                 *(["--leave-children"] if self.run_own else [])],
                cwd=app, env=server_env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._control = ours
        threading.Thread(target=self._read_pids, args=(ours,), daemon=True).start()

    def _read_pids(self, control: socket.socket) -> None:
        """Hand each PID the server sends to the oldest request waiting for one."""
        data = b""
        while True:
            try:
                chunk = control.recv(STATUS.size - len(data))
            except OSError:
                chunk = b""
            if not chunk:
                break
            data += chunk
            if len(data) == STATUS.size:
                (pid,) = STATUS.unpack(data)
                data = b""
                with self._lock:
                    forked = self._pending.popleft()
                forked.pid = pid
                forked.forked.set()
        with self._lock:
            while self._pending:
                self._pending.popleft().forked.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server: a job's kills its children still running, then exits; a run's own
        (``run_own``) leaves them to the run's clean-up, which has stopped them by then."""
        with self._lock:
            server, control, self._server, self._control = self._server, self._control, None, None
        if control is not None:
            with contextlib.suppress(OSError):  # a run's own server may be gone with the run's processes
                control.shutdown(socket.SHUT_RDWR)
            control.close()
        if server is not None:
            try:
                server.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
