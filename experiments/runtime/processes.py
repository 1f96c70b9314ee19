"""The processes of a run: finding them, stopping them, and a guardian that stops them
when their launcher is gone.

Every Flower process Basin starts for a run, and everything those start (the SuperExec,
the simulation process hosting the ServerApp, Ray's GCS, raylet and workers, a
deployment's SuperNodes and their ClientApps), inherits the run's ``FLWR_HOME``: a
temporary directory of that run alone. The environment variable therefore names a run's
processes exactly, wherever they were re-parented to, without relying on PIDs (which the
kernel reuses) or process groups (which Ray's processes leave).

A launcher's death must not leave them running: the SuperLink outlives ``flwr run``,
Ray's agents outlive their parents, and a parent-death signal reaches only direct
children. So each launch starts a **guardian** (:class:`Guardian`,
``.venv/bin/python -m experiments.runtime.guardian``) in a session of its own, where the terminal's SIGHUP
and Ctrl-C do not reach it. It reads a lifeline, a pipe whose other end only the launcher
holds: the read ends (end of file) the moment the kernel closes that end, i.e. when the
launcher is gone, however it died (SIGKILL, a closed terminal, a second Ctrl-C during
clean-up). No clock and no PID is compared (a process's start time moves when the wall
clock is stepped, and PIDs are reused). The guardian then stops every process of the
run's ``FLWR_HOME``, marks the run's summaries ``killed`` and removes the directory.
A launcher that ends normally stops its guardian first; one whose guardian dies starts
a new one within ``GUARDIAN_CHECK_S``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from clients.log import log

REPO = Path(__file__).resolve().parents[2]

ProcessTable = dict[int, tuple[int, int, str]]


def process_table() -> ProcessTable:
    """{pid: (parent pid, process group, command line)} of every process we can see."""
    table = {}
    for process in psutil.process_iter(["ppid", "cmdline"]):
        try:
            group = os.getpgid(process.pid)
        except OSError:  # gone since the listing
            continue
        table[process.pid] = (process.info["ppid"] or 0, group, " ".join(process.info["cmdline"] or ()))
    return table


def process_tree(roots: list[int], table: ProcessTable) -> set[int]:
    """``roots`` and every process descending from them in ``table`` (see process_table)."""
    tree, frontier = set(roots), list(roots)
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return tree


def stop_process_tree(roots: list[int], table: ProcessTable | None = None, grace: float = 1.0) -> None:
    """Terminate ``roots``, their descendants and the process groups they created.

    SIGTERM first, SIGKILL after ``grace`` seconds (then waits, at most a second, until they
    are gone); process groups are killed as a whole so
    that processes which left the tree (Ray's agents outlive their parent) go too. The tree
    is collected before signalling, as children are re-parented once their parent exits;
    ``table`` is a snapshot from :func:`process_table` (taken now if not given).

    Only groups that a process of the tree leads: a group the run merely joined is its
    caller's (a batch script's ``&`` job, a ``subprocess.Popen`` child without a session
    of its own: the launcher and ``flwr run`` are in the caller's group), and killing it
    killed the caller.
    """
    table = process_table() if table is None else table
    tree = process_tree(roots, table)
    groups = {table[pid][1] for pid in tree if pid in table and table[pid][1] in tree} - {os.getpgrp()}
    signal_all(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in tree):
        time.sleep(0.1)
    signal_all(tree, signal.SIGKILL)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    # SIGKILL is delivered asynchronously: return once they are gone (what follows, e.g.
    # removing a Ray session whose owner must be dead, relies on it), at most a second.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and any(alive(pid) for pid in tree):
        time.sleep(0.02)


def signal_all(pids: set[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead, though listed until its parent reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def flwr_homes() -> dict[int, str]:
    """{pid: FLWR_HOME} of every visible process that has the variable set."""
    homes = {}
    for process in psutil.process_iter():
        try:
            home = process.environ().get("FLWR_HOME")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if home is not None:
            homes[process.pid] = home
    return homes


def processes_of_home(home: Path | str) -> list[int]:
    """The live processes whose FLWR_HOME is ``home`` or inside it: one run's processes.
    Never this process or its ancestors (a shell that exported FLWR_HOME, then asked to
    stop that run, would otherwise stop itself first)."""
    home = str(home).rstrip(os.sep)
    ours = ancestry(os.getpid())
    return sorted(pid for pid, value in flwr_homes().items()
                  if (value == home or value.startswith(home + os.sep)) and pid not in ours and alive(pid))


def ancestry(pid: int) -> set[int]:
    """``pid`` and every process it descends from."""
    try:
        return {pid, *(parent.pid for parent in psutil.Process(pid).parents())}
    except psutil.NoSuchProcess:
        return {pid}


# The process that hosts a run's ServerApp: the simulation process (or the warm one that the run's
# simulation command handed itself over to, clients/warm_simulation.py), or a deployment's.
SERVER_APP_COMMANDS = ("flwr-simulation", "flwr-serverapp", "clients.warm_simulation")


def stop_home(home: Path | str, grace: float = 1.0) -> list[int]:
    """Stop every process of ``home`` (see :func:`processes_of_home`) with its tree and
    process groups; returns the PIDs it found.

    The ServerApp's process is killed first, at once: while the others get their grace to
    stop, a run that is being stopped records no further round (a fast run used to reach
    its end during that second). Everything it writes is written whole (appended rows,
    files replaced atomically), so nothing it wrote is cut."""
    roots = processes_of_home(home)
    if roots:
        table = process_table()
        for pid in process_tree(roots, table):
            if any(command in table.get(pid, (0, 0, ""))[2] for command in SERVER_APP_COMMANDS):
                signal_all({pid}, signal.SIGKILL)
        stop_process_tree(roots, table, grace=grace)
    return roots


def ray_sessions() -> set[Path]:
    """Ray's session folders on this machine (``$RAY_TMPDIR/ray/session_*``, default /tmp)."""
    root = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"
    return {path for path in root.glob("session_2*") if path.is_dir()} if root.is_dir() else set()


def session_owner(session: Path) -> int | None:
    """The PID that a Ray session folder's name ends with: the process that started its Ray
    (a run's simulation process or a job's cluster holder); None for another name."""
    try:
        return int(session.name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return None


def remove_ray_session(session: Path) -> None:
    """Remove a Ray session folder, and Ray's ``session_latest`` link beside it where the
    link names that folder (Ray points it at the newest session; it would dangle)."""
    shutil.rmtree(session, ignore_errors=True)
    latest = session.parent / "session_latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)).name == session.name:
            latest.unlink()


def remove_finished_ray_sessions(before: set[Path]) -> None:
    """Remove the Ray session folders made since ``before`` whose Ray has ended (their
    owner, :func:`session_owner`, is gone), so one still running, another job's, is kept."""
    for session in ray_sessions() - before:
        if (owner := session_owner(session)) is not None and not alive(owner):
            remove_ray_session(session)


def remove_own_ray_sessions() -> None:
    """Remove the session folders of the Ray that this process started and has shut down."""
    for session in ray_sessions():
        if session_owner(session) == os.getpid():
            remove_ray_session(session)


# How often the launcher checks that its guardian still runs.
GUARDIAN_CHECK_S = 0.5
# In a run's home: the Ray session folders that existed before the run (the guardian
# removes only the run's own, also a guardian started after the run's Ray).
SESSIONS_BEFORE_FILE = "ray-sessions-before.txt"


class Guardian:
    """The guardian of a run whose processes live under ``home`` and write into ``out_dir``
    (see the module docstring), kept alive for as long as the run: a thread of the launcher
    checks it every ``GUARDIAN_CHECK_S`` and starts a new one when it has died (the OOM
    killer, a user's ``kill`` of a stray-looking Python process), so that the launcher's
    own death later still stops the run. :meth:`stop` ends it when the run is over."""

    def __init__(self, home: Path, out_dir: Path) -> None:
        self.home, self.out_dir, self.restarts = home, out_dir, 0
        (home / SESSIONS_BEFORE_FILE).write_text("".join(f"{session}\n" for session in sorted(ray_sessions())))
        self._lifeline = -1  # this process's end of the running guardian's lifeline
        self.process = self._start()
        self._stopped = threading.Event()
        self._keeper = threading.Thread(target=self._keep, name="basin-guardian-keeper", daemon=True)
        self._keeper.start()

    def _start(self) -> subprocess.Popen:
        """A new guardian, and its lifeline: the pipe's read end goes to the guardian only,
        the write end stays here (non-inheritable: no other child of this process holds it,
        so its end of file means this process is gone)."""
        read_end, write_end = os.pipe()
        command = [sys.executable, "-m", "experiments.runtime.guardian", str(os.getpid()), str(read_end),
                   str(self.home), str(self.out_dir)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))}
        try:
            process = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(read_end,))
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        if self._lifeline >= 0:  # the previous guardian's, which has died
            os.close(self._lifeline)
        self._lifeline = write_end
        return process

    def _keep(self) -> None:
        while not self._stopped.wait(GUARDIAN_CHECK_S):
            if self.process.poll() is not None:
                log.warning(f"the run's guardian (PID {self.process.pid}) died ({_how_it_ended(self.process.returncode)}); "
                            "started a new one")
                self.process = self._start()
                self.restarts += 1

    def stop(self) -> None:
        """End the guardian of a run whose launcher is about to clean up itself (it then stops nothing)."""
        self._stopped.set()
        self._keeper.join()
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._lifeline)  # only now: its end of file would have made the guardian stop the run


def _how_it_ended(returncode: int) -> str:
    return f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"


def sessions_before(home: Path) -> set[Path]:
    """The Ray session folders that existed before the run of ``home`` (see :class:`Guardian`)."""
    try:
        return {Path(line) for line in (home / SESSIONS_BEFORE_FILE).read_text().splitlines() if line}
    except OSError:
        return ray_sessions()


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while the block runs (in the main thread, where Python
    handles signals): a second Ctrl-C during a clean-up ends the launcher (as
    KeyboardInterrupt) only once the clean-up is done. (Blocking the signal would not do:
    the kernel hands it to any thread that does not block it, and Python then raises in
    the main thread all the same.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            raise KeyboardInterrupt


# The ports free_port has handed out in this process, never handed out again.
_ports_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on the loopback interface that no process listens on now and that this
    process has not handed out before. The kernel gives a port that was just closed again
    (3,000 calls here: 2,712 distinct ports), so two launches started at once (a sweep's or
    a test's threads) could name the same SuperLink port: both runs then used the SuperLink
    of the first, and the end of the first stopped the second."""
    with _ports_lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _ports_handed_out:
                _ports_handed_out.add(port)
                return port


def simulation_running(home: Path | str) -> bool:
    """Whether the simulation process (it hosts the ServerApp) of the run whose FLWR_HOME is
    ``home`` runs: its ``flwr-simulation`` command (Flower's, or Basin's that handed itself over
    to a warm process and waits for it). Found by the run's FLWR_HOME, not below its SuperLink:
    on a job's own cluster the SuperLink and its SuperExec may be forked from the job's warm
    process (experiments/runtime/warm_processes.py), not children of the commands that started them."""
    for pid in processes_of_home(home):
        try:
            if SERVER_APP_COMMANDS[0] in " ".join(psutil.Process(pid).cmdline()):
                return True
        except psutil.Error:  # gone since the listing
            continue
    return False

