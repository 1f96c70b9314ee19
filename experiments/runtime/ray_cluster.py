"""Run a Basin simulation's clients on an existing Ray cluster, or on one the job starts.

Flower's simulation engine calls ``ray.init()`` without an address, and Ray then joins the
cluster named by ``RAY_ADDRESS``: the launcher sets it for ``flwr run``, which passes it on
to the SuperLink and the simulation process. :func:`check_ray_address` fails first, with a
clear error, where nothing answers (Ray would only fail inside the simulation, the reason
buried in flwr.log). The simulation process is a Ray driver and connects through a raylet
on its own machine: launch from a node of the cluster (e.g. the head).

:class:`LocalRayCluster` is the same on this machine without ``ray start``: a job of several
runs (``experiments.run`` with ``--compare``, the main job, a sweep; with ``--parallel``
on CPUs only, ``sweep_runs.shares_one_ray_cluster``) starts one Ray cluster beside its
first run and runs every run on it, instead of each run starting and stopping Ray (what
that saves: docs/speed.md). A child
process holds it (``.venv/bin/python -m experiments.runtime.ray_cluster``) until the launcher closes
its stdin or dies; it hands its address over on a pipe of its own, and its output goes to
the job's ``ray-cluster.log``. The GCS port is chosen first, so the address is known at
once; a run launched on the cluster meanwhile is stopped with RayClusterUnreachable if it
cannot start (:meth:`LocalRayCluster.raise_if_failed`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from clients.kept_processes import KEPT_PROCESSES_STARTED
from experiments.runtime.processes import free_port, ray_sessions, remove_finished_ray_sessions, remove_own_ray_sessions
from experiments.runtime.simulation_forks import SimulationForks


class RayClusterUnreachable(ConnectionError):
    """No Ray cluster answers at the given address."""


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Raise RayClusterUnreachable unless something accepts connections at ``address``.

    ``address`` is the cluster's GCS address ``HOST:PORT``, as printed by
    ``ray start --head`` (``ray://`` Ray Client addresses are not supported). A TCP
    connection is the cheap check (milliseconds; ``ray.init`` would take seconds and
    start Ray in this process); it does not prove that the listener is Ray's GCS.
    """
    host, sep, port = address.rpartition(":")
    if address.startswith("ray://") or not sep or not host or not port.isdigit():
        raise RayClusterUnreachable(
            f"Ray address {address!r} is not allowed; allowed: the GCS address HOST:PORT "
            "that `ray start --head` prints, e.g. 10.0.0.5:6379"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        raise RayClusterUnreachable(
            f"no Ray cluster answers at {address} ({error}); start one with "
            f"`ray start --head --port {port}` on {host}, or check the address"
        ) from None


class LocalRayCluster:
    """A context manager: a Ray cluster on this machine for a job's runs, or nothing.

    ``enabled`` False enters as None (each run starts its own Ray, as ``flwr run`` does);
    else it starts the cluster and enters as its address ``127.0.0.1:PORT`` at once, to
    pass as a launch's ``ray_address`` (the launch waits until it is up). ``num_cpus``: the
    cores Ray may hand out (the machine's); ``timeout``: how long it may take to start;
    ``log_path``: where the holder's output and errors go (the job's folder; default a
    temporary file beside the cluster's temporary folder), their last lines quoted when it
    cannot start.

    The holder writes the address on a pipe of its own (never its stdout, where Ray or a
    library may print first) and closes it; end of file without an address is a failed start.
    """

    def __init__(self, enabled: bool, num_cpus: int, timeout: float = 120.0, log_path: Path | None = None):
        self.enabled = enabled
        self.num_cpus = num_cpus
        self.timeout = timeout
        self.log_path = log_path
        self.holder: subprocess.Popen | None = None
        self.address = ""
        self.folder: Path | None = None
        self.runs = 0
        self.up = False
        self._announced = b""  # what the holder wrote on its address pipe so far
        self._address_pipe = -1
        self._lock = threading.Lock()

    def __enter__(self) -> str | None:
        if not self.enabled:
            return None
        self.sessions_before = ray_sessions()
        port = free_port()
        env = {**os.environ, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",  # as the launcher gives `flwr run`
               "RAY_GCS_SERVER_PORT": str(port)}
        self.folder = Path(tempfile.mkdtemp(prefix="basin-ray-job-"))
        self.simulations = SimulationForks(self.folder)  # the runs' warm simulation processes
        if self.log_path is None:
            self.log_path = default_log_path(self.folder)
        read_end, write_end = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                self.holder = subprocess.Popen(
                    [sys.executable, "-m", "experiments.runtime.ray_cluster", str(self.num_cpus), str(self.folder),
                     str(write_end)],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(write_end,),
                    cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                )
        except BaseException:  # no holder: nothing else would remove the folder
            os.close(read_end)
            self._remove_files()
            raise
        finally:
            os.close(write_end)
        self._address_pipe = read_end
        self.started_at = time.monotonic()
        # Ray joins a cluster given as 127.0.0.1 through the address its raylet registered.
        self.address = f"127.0.0.1:{port}"
        _job_clusters[self.address] = self
        return self.address

    def raise_if_failed(self) -> None:
        """Return if the cluster is up or still starting; raise RayClusterUnreachable (the
        holder stopped) if it cannot start: its holder ended, or ``timeout`` seconds passed."""
        with self._lock:
            if self.up:
                return
            failure = self._failure()
            if not failure:
                return
        # The holder only: the job's folder holds the homes of runs whose processes still
        # run (the run being launched stops them as it fails); it goes at the job's end.
        self._stop_holder()  # outside the lock: stopping Ray may take long, and other runs' checks go on
        raise RayClusterUnreachable(f"the job's Ray cluster did not start within {self.timeout:g} s "
                                    f"(.venv/bin/python -m experiments.runtime.ray_cluster): {failure}")

    def _failure(self) -> str:
        """Why the cluster cannot start ('' while it is up or may still come up); sets ``up``."""
        if self.holder is None:
            return "it was stopped"
        while self._address_pipe >= 0 and select.select([self._address_pipe], [], [], 0)[0]:
            chunk = os.read(self._address_pipe, 256)
            if not chunk:  # the holder closed the pipe: the address is whole, or it never came
                os.close(self._address_pipe)
                self._address_pipe = -1
                break
            self._announced += chunk
        if self._address_pipe < 0:
            if self._announced.decode(errors="replace").strip().endswith(f":{self.address.rpartition(':')[2]}"):
                self.up = True
                return ""
            return f"its holder ended without an address; {self._log_tail()}"
        if time.monotonic() - self.started_at < self.timeout:
            return ""
        return f"timed out; {self._log_tail()}"

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace").strip() if self.log_path else ""
        except OSError:
            text = ""
        tail = " | ".join(text.splitlines()[-lines:])
        return f"its last output: {tail} ({self.log_path})" if tail else f"it wrote nothing ({self.log_path})"

    def wait_until_up(self) -> None:
        """Return once the cluster is up; raise as :meth:`raise_if_failed` where it cannot start."""
        while not self.up:
            self.raise_if_failed()
            time.sleep(0.05)

    @contextlib.contextmanager
    def job_flwr_home(self) -> Iterator[str]:
        """A new, empty FLWR_HOME for a run of the job. When the run ends it is removed,
        unless the run started client processes the job keeps (its simulation marked it,
        ``KEPT_PROCESSES_STARTED``): they import from the run's app in it, in the job's
        later runs too, so it stays until the job's folder is removed with the cluster."""
        assert self.folder is not None, "the cluster is not started"
        self.runs += 1
        home = self.folder / f"run-{self.runs}"
        home.mkdir()
        try:
            yield str(home)
        finally:
            if not (home / KEPT_PROCESSES_STARTED).exists():
                shutil.rmtree(home, ignore_errors=True)

    def _stop_holder(self) -> None:
        """Stop the holder (it shuts Ray down) and forget the address; runs no longer start on it."""
        with self._lock:  # only the hand-over: the wait below holds no lock
            _job_clusters.pop(self.address, None)
            holder, self.holder = self.holder, None
            if self._address_pipe >= 0:
                os.close(self._address_pipe)
                self._address_pipe = -1
        if holder is None:
            return
        holder.stdin.close()  # the holder shuts Ray down and exits
        try:
            holder.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()

    def __exit__(self, *exc_info) -> None:
        if not self.enabled:
            return
        self.simulations.close()
        self._stop_holder()
        self._remove_files()
        remove_finished_ray_sessions(self.sessions_before)

    def _remove_files(self) -> None:
        """Remove the job's folder, and its log where that is temporary or empty."""
        if self.folder is not None:  # the holder removes it too: also where this process died
            shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # a log with nothing in it says nothing; a temporary one goes with the job
            log = Path(self.log_path) if self.log_path is not None else None
            if log is not None and (log.stat().st_size == 0 or log == default_log_path(self.folder)):
                log.unlink()


def default_log_path(folder: Path) -> Path:
    """The holder's log where the job names none: beside the job's temporary folder (which
    holds the runs' homes only), and removed with it."""
    return Path(f"{folder}.log")


# The job clusters this process has started and not yet stopped, by address.
_job_clusters: dict[str, LocalRayCluster] = {}


def job_cluster(address: str | None) -> LocalRayCluster | None:
    """The cluster at ``address`` if this process started it for its job (LocalRayCluster)."""
    return _job_clusters.get(address) if address is not None else None


def hold_cluster(num_cpus: int, folder: Path, address_fd: int) -> None:
    """Start a Ray cluster, write its address on ``address_fd`` and close it, and keep the
    cluster until stdin closes (the launcher closed it, or died); then stop it and remove
    its Ray session folder and the job's ``folder``: a launcher killed (SIGKILL) removes
    nothing after it."""
    import logging

    import ray

    from clients.flower_internals import init_ray

    os.set_inheritable(address_fd, False)  # Ray's processes started below must not hold the pipe open
    try:
        init_ray(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        with os.fdopen(address_fd, "w") as address_pipe:
            address_pipe.write(f"{ray.get_runtime_context().gcs_address}\n")
        sys.stdin.read()
    finally:
        ray.shutdown()
        remove_own_ray_sessions()
        shutil.rmtree(folder, ignore_errors=True)
        default_log_path(folder).unlink(missing_ok=True)


if __name__ == "__main__":
    hold_cluster(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
