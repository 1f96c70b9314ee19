"""Launch one Basin run as a real ``flwr run`` simulation and check that it succeeded.

Each launch gets its own ``FLWR_HOME`` and free ports for the local SuperLink that
``flwr run`` starts, and stops that SuperLink (by PID) when the run ends, so runs do not
leak background processes or collide. ``flwr run --stream`` exits 0 even when the
ServerApp failed, so success is read from the run's ``summary.json`` instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

from clients import flower_internals
from clients.kept_processes import KEEP_CLIENT_PROCESSES
from clients.log import log
from clients.warm_simulation import command_socket_path, socket_path
from experiments.runtime.cli import NO_SPACE, DiskFull, is_disk_full
from experiments.runtime.flower_log import follow_run, read_summary
from experiments.runtime.machine import ClientResources, gpu_memory_advice
from experiments.runtime.method_keys import write_pyproject
from experiments.runtime.output_dir import OutputLock, create_output_dir, record_holder
from experiments.runtime.processes import (
    Guardian,
    deferred_interrupts,
    free_port,
    ray_sessions,
    remove_finished_ray_sessions,
    simulation_running,
    stop_home,
)
from experiments.runtime.ray_cluster import LocalRayCluster, check_ray_address, job_cluster
from experiments.runtime.run_config import APP_DIR
from experiments.runtime.run_endings import check_folder_reuse, end_summary, interrupted_reason, run_failure
from experiments.runtime.simulation_forks import ForkedProcess, SimulationForks
from experiments.runtime.warm_processes import (
    WARM_SIMULATION_IMPORTS,
    start_warm_commands,
    start_warm_simulation,
    warm_job_imports,
    write_warm_command,
)
from strategies.checkpoint import read_checkpoint
from strategies.config import validate_run_config
from strategies.methods.registry import REGISTRY
from strategies.results import write_json_atomic

# What `flwr run` packs: the ServerApp's and ClientApp's packages, the app's pyproject.toml and README.
APP_PACKAGES = ("clients", "strategies", "partitions", "experiments")
APP_FILES = ("pyproject.toml", "README.md")


def stage_app(destination: Path) -> Path:
    """Copy the app's files (APP_PACKAGES and APP_FILES, without ``__pycache__``) into
    ``destination`` and return it: the folder to give ``flwr run``.

    ``flwr run APP`` packs APP into a FAB after walking *every* file below it and resolving
    each path, a ``.venv`` (~50,000 files) and ``runs/`` included, to keep only the app's
    sources: 3.1 s of every launch on 2 CPU cores, more with each saved run. Flower then
    filters the staged copy with its own rules, so the FAB holds the same app.
    """
    for package in APP_PACKAGES:
        shutil.copytree(APP_DIR / package, destination / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in APP_FILES:
        shutil.copy2(APP_DIR / name, destination / name)
    if REGISTRY.plugins:  # Flower accepts the run-config keys that the app's pyproject.toml declares
        write_pyproject(destination / "pyproject.toml", with_plugins=True)
    return destination


def stage_in_temporary_directory(flwr_home: Path) -> Path:
    """:func:`stage_app` into the run's ``FLWR_HOME``, a full temporary directory said as such."""
    try:
        return stage_app(flwr_home / "app")
    except OSError as error:
        if not is_disk_full(error):
            raise
        raise DiskFull(f"the temporary directory {tempfile.gettempdir()}", NO_SPACE,
                       "free space there, or set TMPDIR to a folder with space,") from None


def new_flwr_home(cluster: LocalRayCluster | None) -> contextlib.AbstractContextManager[str]:
    """The run's FLWR_HOME: a temporary directory removed when the run ends, or on its job's
    own Ray cluster, a folder in the job's that stays until the job ends where the run
    started the client processes the job keeps (:meth:`LocalRayCluster.job_flwr_home`)."""
    if cluster is None:
        return tempfile.TemporaryDirectory(prefix="basin-flwr-home-")
    return cluster.job_flwr_home()


# Run-config keys a client process fixes once (cuBLAS reads its workspace setting when it
# starts): runs that differ in them do not share client processes.
PROCESS_WIDE_KEYS = ("cuda-deterministic",)


def process_wide_settings(config: Mapping[str, Any]) -> tuple[Any, ...]:
    """The run's values of :data:`PROCESS_WIDE_KEYS`: runs that differ in them do not share client processes."""
    return tuple(config.get(key) for key in PROCESS_WIDE_KEYS)


def kept_processes_key(app: Path, config: Mapping[str, Any]) -> str:
    """The key under which the runs of a job on its own Ray cluster keep their client
    processes (clients/client_actor.py): a digest of the staged app's files and of the
    settings a process fixes once, so a process serves only runs of the same sources."""
    digest = hashlib.sha256(repr(process_wide_settings(config)).encode())
    for path in sorted(app.rglob("*")):
        if path.is_file():
            digest.update(f"{path.relative_to(app)}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def launch(
    config: Mapping[str, Any],
    out_dir: Path,
    resources: ClientResources = ClientResources(),
    progress: bool = True,
    label: str = "",
    leave: bool = True,
    ray_address: str | None = None,
    stop: threading.Event | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run one validated config with ``flwr run``; return its summary or raise RunFailed.

    The output directory is locked for the run (experiments/runtime/output_dir.py): a second
    launcher there raises OutputLocked before Flower starts. When the launcher is
    interrupted (Ctrl-C, SIGTERM: KeyboardInterrupt) or Flower dies before the ServerApp
    recorded an end, ``summary.json`` says ``interrupted`` or ``killed``, never
    ``running``. With ``ray_address`` (``HOST:PORT``) the clients run on that existing Ray
    cluster (``experiments.runtime.ray_cluster``); RayClusterUnreachable is raised before Flower
    starts if nothing answers there (the job's own cluster may still be starting: the run
    starts beside it, and is stopped with that error if it cannot start). A folder holding
    another config's results is refused (:func:`check_folder_reuse`) unless ``overwrite``.
    Setting ``stop`` (from another thread) interrupts the run as Ctrl-C does:
    KeyboardInterrupt is raised in the launching thread.
    """
    if ray_address is not None and job_cluster(ray_address) is None:
        check_ray_address(ray_address)
    out_dir = create_output_dir(out_dir, "output directory")
    with OutputLock(out_dir):
        check_folder_reuse(out_dir, config, overwrite)
        return _launch_locked(config, out_dir, resources, progress, label, leave, ray_address, stop)


def run_app(app: Path, log_path: Path, num_supernodes: int, run_config: str = "", timeout: float = 600.0,
            echo: bool = False) -> str:
    """Run any Flower app (a folder with its pyproject.toml) in a local simulation of
    ``num_supernodes`` nodes, with ``flwr run --stream`` and its own FLWR_HOME; return its
    log (also written to ``log_path``; with ``echo``, also to stdout as it comes). Every
    process it started is stopped when it ends, however it ends. ``run_config``: Flower's
    ``--run-config`` overrides (``"k=v k2='s'"``)."""
    command = [flwr_executable(), "run", str(app), "--stream",
               "--federation-config", f"num-supernodes={num_supernodes}"]
    command += ["--run-config", run_config] if run_config else []
    sessions_before = ray_sessions()
    with tempfile.TemporaryDirectory(prefix="basin-flwr-home-") as flwr_home:
        env = flower_environment(Path(sys.executable).parent, flwr_home, free_port(), free_port(), None)
        try:
            with open(log_path, "w") as log:
                if not echo:
                    subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=app, timeout=timeout)
                else:
                    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=app,
                                          text=True) as flwr:
                        for line in flwr.stdout:
                            log.write(line)
                            sys.stdout.write(line)
                            sys.stdout.flush()
        finally:
            with deferred_interrupts():
                stop_home(flwr_home)
                # Flower's own simulation starts Ray with its session folder in /tmp/ray: gone with the run.
                remove_finished_ray_sessions(sessions_before)
    return log_path.read_text(errors="replace")


# Flower's `flwr` as a run's launcher starts it (from APP_DIR): the local SuperLink of
# `flwr run` then loads beside Flower's command line instead of after it.
FLWR_COMMAND = (sys.executable, "-m", "experiments.runtime.flwr_command")


@functools.cache
def say_once(line: str) -> None:
    log.warning(line)


def flwr_executable() -> str:
    """Flower's own ``flwr`` command, beside this Python."""
    return str(Path(sys.executable).parent / "flwr")


INLINE_LIMIT_VARIABLE = "RAY_max_direct_call_object_size"
TASK_POLL_VARIABLE = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
TASK_POLL_SECONDS = "0.2"


def flower_environment(
    bin_dir: Path, flwr_home: str, http_port: int, control_port: int, ray_address: str | None
) -> dict[str, str]:
    """The environment of a run's ``flwr run`` (and so of its SuperLink, simulation and Ray)."""
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": flwr_home,
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        # Messages up to 8 MiB (a round's model, a client's reply) travel inside Ray's task
        # call instead of through its object store (Ray inlines up to 100 KiB by default):
        # about 2 ms less each way for the 1.1 MB Fashion-MNIST CNN on 2 cores.
        INLINE_LIMIT_VARIABLE: os.environ.get(INLINE_LIMIT_VARIABLE, str(8 * 2**20)),
        # The SuperExec looks for the run's task to start its simulation process every 1 s
        # by default (0.5 s of every launch on average); Flower's own setting.
        TASK_POLL_VARIABLE: os.environ.get(TASK_POLL_VARIABLE, TASK_POLL_SECONDS),
    }
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    return env


def _launch_locked(
    config: Mapping[str, Any], out_dir: Path, resources: ClientResources, progress: bool, label: str, leave: bool,
    ray_address: str | None, stop: threading.Event | None,
) -> dict[str, Any]:
    config = validate_run_config({**config, "output-dir": str(out_dir)})
    checkpoint = read_checkpoint(out_dir, config)  # a corrupt or foreign checkpoint is refused before Flower starts
    if checkpoint is not None:  # said on the terminal too, not only in flwr.log
        log.info(f"{label + ': ' if label else ''}resuming {out_dir} after round {checkpoint['round']} of "
                 f"{config['num-rounds']} (its checkpoint.pt)")
    (out_dir / "summary.json").unlink(missing_ok=True)
    run_config_path = out_dir / "run-config.toml"
    run_config_path.write_text(tomli_w.dumps(dict(config)))

    launched_at = time.time()
    sessions_before = ray_sessions()
    http_port, control_port = free_port(), free_port()
    bin_dir = Path(sys.executable).parent
    log_path = out_dir / "flwr.log"
    cluster = job_cluster(ray_address)  # the job's own, maybe still starting beside this run
    with new_flwr_home(cluster) as flwr_home:
        # The app is staged before anything starts: a full temporary directory stops the
        # launch here, with nothing to stop.
        app = stage_in_temporary_directory(Path(flwr_home))
        # Every process of the run inherits FLWR_HOME: the guardian, and a launcher that
        # takes the folder over after this one died, find them all by it.
        record_holder(out_dir, flwr_home)
        guardian = Guardian(Path(flwr_home), out_dir)
        env = flower_environment(bin_dir, flwr_home, http_port, control_port, ray_address)
        if cluster is not None:
            env[KEEP_CLIENT_PROCESSES] = kept_processes_key(app, config)
        warm_simulation, flowers_own = None, flower_internals.speed_ups_off_because()
        warm_commands: dict[str, ForkedProcess] = {}
        if flowers_own and not flowers_own.startswith(flower_internals.SPEED_UPS_SWITCH):
            say_once(f"speed-ups off, Flower's own commands run: {flowers_own} "
                     f"(Basin's were checked against flwr {', '.join(flower_internals.FLOWER_RELEASES)})")
        # The run's processes are forked from one that imports once: its job's fork server, or its own.
        forks = cluster.simulations if cluster is not None else SimulationForks(Path(flwr_home), run_own=True)
        ending: tuple[str, str] | None = None  # how the launch ended, when not with the run's own end
        try:
            if not flowers_own and (simulation_bin := write_warm_command(Path(flwr_home), app)) is not None:
                env["PATH"] = f"{simulation_bin}{os.pathsep}{env['PATH']}"
                # The commands first: the server forks them once it has imported their modules, the
                # simulation's after importing the rest (requests are served in turn).
                warm_commands = start_warm_commands(Path(flwr_home), app, env, forks)
                warm_simulation = start_warm_simulation(Path(flwr_home), app, env, forks,
                                                        WARM_SIMULATION_IMPORTS if cluster is None else warm_job_imports())
            # The run's `flwr`: where forked, the command that hands itself over to its warm process.
            flwr = ([str(Path(flwr_home) / "bin" / "flwr")] if "flwr" in warm_commands
                    else FLWR_COMMAND if not flowers_own else [flwr_executable()])
            command = [
                *flwr, "run", str(app), "--stream",
                "--run-config", str(run_config_path),
                "--federation-config", resources.federation_config(config["num-clients"]),
            ]
            with open(log_path, "w") as log_file:
                process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT, cwd=APP_DIR)
                stages_seen = follow_run(process, out_dir, config["num-rounds"], progress, label, leave,
                                         server_alive=lambda: simulation_running(flwr_home), stop=stop,
                                         check=cluster.raise_if_failed if cluster is not None else None)
                # The warm process removes its socket when the run's simulation command hands over.
                warm_ran = warm_simulation is not None and not os.path.exists(socket_path(flwr_home) or "")
                warm_commands_ran = [name for name in warm_commands
                                     if not os.path.exists(command_socket_path(flwr_home, name) or "")]
        except KeyboardInterrupt:
            ending = ("interrupted", "")  # the reason says the last round: read once the ServerApp is stopped
            raise
        except BaseException as error:  # a cluster that cannot start, a failed read of the log, a bug: said, not "running"
            ending = ("failed", f"the launcher stopped following the run: {type(error).__name__}: {error}")
            raise
        finally:
            # A second Ctrl-C waits until the clean-up is done (then ends the launcher).
            with deferred_interrupts():
                if "process" in locals() and process.poll() is None:
                    process.terminate()
                # The SuperLink, its SuperExec, the simulation and Ray's processes (which leave
                # the SuperLink's tree): all of them, and only them, have the run's FLWR_HOME.
                # A completed run has written everything: its processes get no grace (1 s).
                completed = (read_summary(out_dir) or {}).get("status") == "completed"
                if isinstance(warm_simulation, ForkedProcess) and not forks.run_own and not completed:
                    # The ServerApp's process first, as stop_home kills it (no further round is
                    # recorded): one forked by its job's server has no FLWR_HOME for stop_home to
                    # find. One of the run's own (the run's server has its FLWR_HOME) is left to
                    # stop_home, which finds the Ray it started before killing it.
                    warm_simulation.kill()
                stop_home(flwr_home, grace=0.0 if completed else 1.0)
                if ending is not None:  # recorded once the ServerApp is stopped: its rows are final
                    status, reason = ending
                    with contextlib.suppress(OSError):  # (a full disk) the launch's own error goes on
                        end_summary(out_dir, config, status, reason or interrupted_reason(out_dir, config))
                # Stopped with the run's processes (their commands, which stop_home found), or never handed the run.
                for warm in [*([warm_simulation] if warm_simulation is not None else []), *warm_commands.values()]:
                    warm.kill()
                    warm.wait()
                if forks.run_own:
                    forks.close()
                remove_finished_ray_sessions(sessions_before)  # Ray's logs and sockets of this run
                guardian.stop()

    summary = read_summary(out_dir)
    if summary is None or summary.get("status") != "completed":
        raise run_failure(out_dir, config, log_path, gpu_memory_advice(summary, resources))
    # The run's real wall time, Flower's start-up included, the part before round 1, and
    # when each start-up stage began (seconds after `flwr run` was started, as seen in
    # Flower's streamed log: up to a second or two late under load), kept in summary.json too.
    summary["run-seconds"] = time.time() - launched_at
    if summary.get("training-started-at"):
        summary["startup-seconds"] = summary["training-started-at"] - launched_at
    summary["startup-stages"] = {stage: round(seen - launched_at, 2) for stage, seen in stages_seen.items()}
    summary["warm-simulation-process"] = warm_ran
    summary["warm-commands"] = warm_commands_ran
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


