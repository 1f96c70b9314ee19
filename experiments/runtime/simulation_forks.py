"""A job's warm simulation processes, forked from one process that imported once.

A run's launcher starts a warm simulation process beside ``flwr run`` (clients/warm_simulation.py),
which imports Flower's simulation engine, Ray, torch and Basin's server side while the
SuperLink starts: ~3 of its ~4 CPU-seconds on 2 cores, in every run. A job of several
runs on its own Ray cluster (``LocalRayCluster``: ``--compare``, the main job, a sweep)
instead starts one fork server (``clients.warm_simulation.fork_server``) at its first run,
which makes those imports once, and each run's warm process is forked from it; once it has
made them, so are the run's ``flwr run``, SuperLink and SuperExec (``warm_processes.start_warm_commands``).

The server's children do not carry their run's FLWR_HOME in their environment (that of
the server, until the run's command hands itself over), so the launcher stops each by its
PID (:class:`ForkedSimulation`), and the server kills those still running when the job
ends or its launcher dies (end of file on its control socket).
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


class ForkedSimulation:
    """One run's warm simulation process, forked by the job's server: stopped by its PID,
    which the server sends once it has forked (after its imports, for the job's first run)."""

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
    """The fork server of one job, started at the job's first run (:meth:`fork`), stopped
    with the job (:meth:`close`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder  # the job's: the server's staged app lives there until the job ends
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._pending: collections.deque[ForkedSimulation] = collections.deque()
        self._lock = threading.Lock()
        self.ready = False  # the server has forked a child: its imports are done

    def fork(self, path: str, cwd: Path, env: Mapping[str, str], imports: tuple[str, ...],
             stage: Callable[[Path], Path]) -> ForkedSimulation | None:
        """A warm simulation process for the run whose command connects at ``path``, in
        ``cwd``; None where the server cannot take it (the caller starts one of its own).
        ``env``: the run's environment (its per-run part is left out of the server's);
        ``stage``: puts the app's sources into a folder (the server imports from there)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)  # the run's command may connect before the server has forked
            with self._lock:
                if self._server is None:
                    self._start(env, imports, stage)
                forked = ForkedSimulation()
                assert self._control is not None
                send_request(self._control, {"socket": path, "cwd": str(cwd)}, [listener.fileno()])
                self._pending.append(forked)
            return forked
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        finally:
            listener.close()

    def _start(self, env: Mapping[str, str], imports: tuple[str, ...], stage: Callable[[Path], Path]) -> None:
        app = stage(self.folder / "simulation-app")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_env = {key: value for key, value in env.items() if key not in PER_RUN_VARIABLES}
        server_env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        try:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "clients.warm_simulation", "--fork-server", str(theirs.fileno()), *imports],
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
                self.ready = True
                forked.forked.set()
        with self._lock:
            while self._pending:
                self._pending.popleft().forked.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the server: it kills the children still running, then exits."""
        with self._lock:
            server, control, self._server, self._control = self._server, self._control, None, None
            self.ready = False
        if control is not None:
            control.shutdown(socket.SHUT_RDWR)
            control.close()
        if server is not None:
            try:
                server.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
