"""Launch one Basin run as a real ``flwr run`` simulation and check that it succeeded.

Each launch gets its own ``FLWR_HOME`` and free ports for the local SuperLink that
``flwr run`` starts, and stops that SuperLink (by PID) when the run ends, so runs do not
leak background processes or collide. ``flwr run --stream`` exits 0 even when the
ServerApp failed, so success is read from the run's ``summary.json`` instead.
"""

from __future__ import annotations

import csv
import difflib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.output_dir import FolderHoldsAnotherRun, OutputLock, clear_folder, create_output_dir, record_holder
from experiments.processes import (
    alive,
    deferred_interrupts,
    process_table,
    process_tree,
    ray_sessions,
    remove_finished_ray_sessions,
    start_guardian,
    stop_guardian,
    stop_home,
)
from experiments.ray_cluster import check_ray_address
from partitions.availability import data_problem
from partitions.datasets import FASHION_MNIST_DEFAULT_DIR
from partitions.feasibility import check_partition
from strategies.checkpoint import read_checkpoint, run_identity
from strategies.config import ConfigError, cohort_size, summary_horizon, validate_run_config
from strategies.results import summarize, write_json_atomic

APP_DIR = Path(__file__).resolve().parents[1]
# What `flwr run` packs: the ServerApp's and ClientApp's packages, the app's pyproject.toml and README.
APP_PACKAGES = ("clients", "strategies", "partitions", "experiments")
APP_FILES = ("pyproject.toml", "README.md")
PRESETS_DIR = Path(__file__).resolve().parent / "presets"


class RunFailed(RuntimeError):
    """A Flower run ended without a completed summary."""


@dataclass(frozen=True)
class ClientResources:
    """Ray resources of one virtual client; fractional GPUs let clients share a GPU."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        # Flower 1.41 reads client-resources-num-cpus as an integer: 0.5 would fail inside `flwr run`.
        if isinstance(self.num_cpus, bool) or not math.isfinite(self.num_cpus) or self.num_cpus < 1 \
                or self.num_cpus != int(self.num_cpus):
            raise ValueError(f"num-cpus per client = {self.num_cpus!r} is not allowed; allowed: a whole number >= 1")
        if isinstance(self.num_gpus, bool) or not 0 <= self.num_gpus <= 1:
            raise ValueError(f"num-gpus per client = {self.num_gpus!r} is not allowed; allowed: a number in [0, 1]")

    def federation_config(self, num_supernodes: int) -> str:
        return (
            f"num-supernodes={num_supernodes} client-resources-num-cpus={self.num_cpus:g} "
            f"client-resources-num-gpus={self.num_gpus:g}"
        )


def default_run_config() -> dict[str, Any]:
    """The run-config defaults declared in pyproject.toml."""
    with open(APP_DIR / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


def named_toml(name_or_path: str, directory: Path, kind: str) -> Path:
    """A TOML file given by path, or by name (stem) in ``directory``; a clear error if absent."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        names = sorted(p.stem for p in directory.glob("*.toml"))
        guess = difflib.get_close_matches(str(name_or_path), names, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise FileNotFoundError(f"{kind} {name_or_path!r} not found{hint}; known {kind}s: {', '.join(names)}")
    return path


def read_toml(path: Path, kind: str) -> dict[str, Any]:
    """A TOML file's content; a syntax error names the file (ConfigError)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{kind} file {path} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{kind} file {path} is not UTF-8 text (byte {error.start}); allowed: a TOML text file") from None
    except OSError as error:
        raise ConfigError(f"{kind} file {path} cannot be read ({error.strerror or error})") from None


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset's overrides: a name from experiments/presets/ or a TOML file path."""
    return read_toml(named_toml(name_or_path, PRESETS_DIR, "preset"), "preset")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings with TOML value syntax (strings may be left unquoted)."""
    overrides = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"override {pair!r} is not of the form key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        overrides[key.strip()] = value
    return overrides


class DataUnavailable(ValueError):
    """A run's data set cannot be loaded on this machine (missing, unreadable, unreachable)."""


def data_problem_of(config: Mapping[str, Any]) -> str | None:
    """Why the run config's data set cannot be loaded here (None: it can), with its keys named."""
    problem = data_problem(str(config["dataset"]), str(config["data-dir"]))
    if problem is None:
        return None
    return f"run config key 'dataset' = {config['dataset']!r} (data-dir = {config['data-dir']!r}): {problem}"


def local_label_directory(config: Mapping[str, Any]) -> Path | None:
    """The directory of a local data set whose labels the partition check reads
    (Fashion-MNIST's, when it exists), else None: hub sets are checked with the data."""
    if config["dataset"] != "fashion-mnist":
        return None
    directory = (Path(config["data-dir"]) if config["data-dir"] else FASHION_MNIST_DEFAULT_DIR).expanduser()
    return directory if directory.is_dir() else None


def check_data(configs: Iterable[Mapping[str, Any]]) -> None:
    """Raise DataUnavailable, before any Flower process exists, when a run's data cannot be loaded."""
    for config in configs:
        problem = data_problem_of(config)
        if problem:
            raise DataUnavailable(problem)


def machine_cpus() -> int:
    """CPU cores this process may use, as Ray counts them (affinity, then a cgroup quota)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return cores


def check_machine(
    configs: Iterable[Mapping[str, Any]], resources: ClientResources, ray_address: str | None = None
) -> None:
    """Raise ConfigError, before any Flower process exists, when the runs ask this machine
    for what it lacks: a CUDA device, or more CPU cores or GPU share per client than it has
    (Ray would place no client and the run would fail inside Flower). On an existing Ray
    cluster (``ray_address``) the clients' resources are the cluster's to judge."""
    import torch

    cuda = torch.cuda.is_available()
    for config in configs:
        if config["device"] == "cuda" and not cuda and ray_address is None:
            raise ConfigError(
                "run config key 'device' = 'cuda' but this machine has no usable CUDA device "
                "(torch.cuda.is_available() is False); allowed here: 'cpu' or 'auto'"
            )
    if ray_address is not None:
        return
    cores = machine_cpus()
    if resources.num_cpus > cores:
        raise ConfigError(
            f"CPUs per client = {resources.num_cpus:g} exceed this machine's {cores} CPU cores (Ray could start "
            f"no client); allowed: a whole number from 1 to {cores}"
        )
    if resources.num_gpus > 0 and not cuda:
        raise ConfigError(
            f"GPUs per client = {resources.num_gpus:g} but this machine has no usable CUDA device; allowed here: 0"
        )


# GPU memory one client process is counted to hold when choosing how many share a GPU:
# generous (its CUDA context ~0.5 GiB, plus the 130 MiB of model, data and activations
# measured for Fashion-MNIST's CNN), so that the processes fit beside each other.
CLIENT_PROCESS_GPU_BYTES = 1 << 30


def client_resources(
    configs: Iterable[Mapping[str, Any]], cpus_per_client: float, gpus_per_client: float | None,
    parallel: int = 1, ray_address: str | None = None,
) -> ClientResources:
    """Each client process's Ray resources. ``gpus_per_client`` None ("auto"): on CUDA a
    GPU share that trains a round's whole cohort at once (one process per client of the
    largest cohort), as far as this machine's cores and free GPU memory allow for
    ``parallel`` runs at once; without CUDA 0, the cores deciding how many train at once.
    What was chosen is printed (not on a Ray cluster, whose resources are its own)."""
    configs = list(configs)
    if gpus_per_client is not None:
        return ClientResources(cpus_per_client, gpus_per_client)
    if ray_address is not None:
        return ClientResources(cpus_per_client, 0.0)
    ClientResources(cpus_per_client, 0.0)  # a bad --cpus-per-client is refused here, before it is divided by
    import torch

    on_cuda = torch.cuda.is_available() and any(c["device"] in ("cuda", "auto") for c in configs)
    cohort = max(cohort_size(c) for c in configs)
    by_cores = max(1, machine_cpus() // (int(cpus_per_client) * parallel))
    if not on_cuda:
        at_once = min(cohort, by_cores)
        print(f"[basin] {at_once} client process{'es' if at_once != 1 else ''} train{'s' if at_once == 1 else ''} "
              f"at once per run: cohort {cohort}, at most "
              f"{by_cores} by CPU cores (--cpus-per-client {cpus_per_client:g} each)"
              + (f" for {parallel} runs at once" if parallel > 1 else ""), file=sys.stderr, flush=True)
        return ClientResources(cpus_per_client, 0.0)
    free_bytes, _ = torch.cuda.mem_get_info()
    by_memory = max(1, free_bytes // (CLIENT_PROCESS_GPU_BYTES * parallel))
    processes = min(cohort, by_cores, by_memory)
    print(f"[basin] {processes} client processes share the GPU per run (--gpus-per-client {1 / processes:.4g}): "
          f"cohort {cohort}, at most {by_cores} by CPU cores and {by_memory} by free GPU memory"
          + (f" for {parallel} runs at once" if parallel > 1 else ""), file=sys.stderr, flush=True)
    return ClientResources(cpus_per_client, 1.0 / processes)


def resolve_config(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults, then each layer of overrides, validated, and its partition built once on
    the data set's labels (raises ConfigError: before Flower starts, not in every client)."""
    config = default_run_config()
    for layer in layers:
        config.update(layer)
    config = validate_run_config(config)
    if local_label_directory(config) is not None:  # the partition below reads its labels: a damaged file is named first
        check_data([config])
    try:
        check_partition(config)
    except ValueError as error:
        keys = "'partition', 'alpha', 'classes-per-client', 'num-clients', 'min-partition-size'"
        raise ConfigError(f"run config keys {keys}: {error}") from None
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


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
    return destination


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _simulation_running(port: int) -> bool:
    """Whether the simulation process (it hosts the ServerApp) of the SuperLink on ``port`` runs."""
    table = process_table()
    tree = process_tree(_superlinks(port, table), table)
    return any("flwr-simulation" in table[pid][2] and alive(pid) for pid in tree)


def _superlinks(port: int, table: dict[int, tuple[int, int, str]]) -> list[int]:
    """The SuperLink processes in ``table`` that ``flwr run`` started on ``port``."""
    return [pid for pid, (_, _, cmd) in table.items() if "flower-superlink" in cmd and f"--port {port}" in cmd]


def _read_summary(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None


def count_rounds(out_dir: Path) -> int:
    """Rounds a run has written to its results.csv (0 before the first)."""
    try:
        with open(out_dir / "results.csv") as f:
            return max(sum(1 for _ in f) - 1, 0)
    except OSError:
        return 0


def check_folder_reuse(out_dir: Path, config: Mapping[str, Any], overwrite: bool = False) -> None:
    """Refuse an output directory that holds results of a run with another config
    (FolderHoldsAnotherRun names the keys that differ); with ``overwrite`` its contents are
    removed instead. The same config may come back: it resumes, or runs again."""
    previous_path = Path(out_dir) / "run-config.toml"
    if not (Path(out_dir) / "results.csv").exists() or not previous_path.exists():
        return
    try:
        previous = run_identity(tomllib.loads(previous_path.read_text()))
    except (OSError, tomllib.TOMLDecodeError):
        previous = {}
    current = run_identity({**config, "output-dir": str(out_dir)})
    differing = sorted(key for key in set(previous) | set(current) if previous.get(key) != current.get(key))
    if not differing:
        return
    if overwrite:
        clear_folder(out_dir)
        return
    shown = ", ".join(f"{key} = {previous.get(key)!r} there but {current.get(key)!r} now" for key in differing[:6])
    more = f" and {len(differing) - 6} more" if len(differing) > 6 else ""
    raise FolderHoldsAnotherRun(
        f"output directory {out_dir} holds the results of a run with another config ({shown}{more}); "
        f"allowed: the same config (it resumes or runs again), another --out, or --overwrite to replace them"
    )


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

    The output directory is locked for the run (experiments/output_dir.py): a second
    launcher there raises OutputLocked before Flower starts. When the launcher is
    interrupted (Ctrl-C, SIGTERM: KeyboardInterrupt) or Flower dies before the ServerApp
    recorded an end, ``summary.json`` says ``interrupted`` or ``killed``, never
    ``running``. With ``ray_address`` (``HOST:PORT``) the clients run on that existing Ray
    cluster (``experiments.ray_cluster``); RayClusterUnreachable is raised before Flower
    starts if nothing answers there. A folder holding another config's results is refused
    (:func:`check_folder_reuse`) unless ``overwrite``. Setting ``stop`` (from another thread) interrupts the
    run as Ctrl-C does: KeyboardInterrupt is raised in the launching thread.
    """
    if ray_address is not None:
        check_ray_address(ray_address)
    out_dir = create_output_dir(out_dir, "output directory")
    with OutputLock(out_dir):
        check_folder_reuse(out_dir, config, overwrite)
        return _launch_locked(config, out_dir, resources, progress, label, leave, ray_address, stop)


INLINE_LIMIT_VARIABLE = "RAY_max_direct_call_object_size"


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
    }
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    return env


def _launch_locked(
    config: Mapping[str, Any], out_dir: Path, resources: ClientResources, progress: bool, label: str, leave: bool,
    ray_address: str | None, stop: threading.Event | None,
) -> dict[str, Any]:
    config = validate_run_config({**config, "output-dir": str(out_dir)})
    read_checkpoint(out_dir, config)  # a corrupt or foreign checkpoint is refused before Flower starts
    (out_dir / "summary.json").unlink(missing_ok=True)
    run_config_path = out_dir / "run-config.toml"
    run_config_path.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in config.items()))

    launched_at = time.time()
    sessions_before = ray_sessions()
    http_port, control_port = _free_port(), _free_port()
    bin_dir = Path(sys.executable).parent
    log_path = out_dir / "flwr.log"
    with tempfile.TemporaryDirectory(prefix="basin-flwr-home-") as flwr_home:
        # Every process of the run inherits FLWR_HOME: the guardian, and a launcher that
        # takes the folder over after this one died, find them all by it.
        record_holder(out_dir, flwr_home)
        guardian = start_guardian(Path(flwr_home), out_dir)
        env = flower_environment(bin_dir, flwr_home, http_port, control_port, ray_address)
        command = [
            str(bin_dir / "flwr"), "run", str(stage_app(Path(flwr_home) / "app")), "--stream",
            "--run-config", str(run_config_path),
            "--federation-config", resources.federation_config(config["num-clients"]),
        ]
        interrupted = False
        try:
            with open(log_path, "w") as log:
                process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=APP_DIR)
                stages_seen = _follow(process, out_dir, config["num-rounds"], progress, label, leave,
                                      server_alive=lambda: _simulation_running(http_port), stop=stop)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            # A second Ctrl-C waits until the clean-up is done (then ends the launcher).
            with deferred_interrupts():
                if "process" in locals() and process.poll() is None:
                    process.terminate()
                # The SuperLink, its SuperExec, the simulation and Ray's processes (which leave
                # the SuperLink's tree): all of them, and only them, have the run's FLWR_HOME.
                stop_home(flwr_home)
                if interrupted:  # recorded once the ServerApp is stopped: its rows are final
                    end_summary(out_dir, config, "interrupted", "stopped by Ctrl-C or SIGTERM")
                remove_finished_ray_sessions(sessions_before)  # Ray's logs and sockets of this run
                stop_guardian(guardian)

    summary = _read_summary(out_dir)
    if summary is None or summary.get("status") != "completed":
        raise run_failure(out_dir, config, log_path, gpu_memory_advice(summary, resources))
    # The run's real wall time, Flower's start-up included, the part before round 1, and
    # when each start-up stage began (seconds after `flwr run` was started, as seen in
    # Flower's streamed log: up to a second or two late under load), kept in summary.json too.
    summary["run-seconds"] = time.time() - launched_at
    if summary.get("training-started-at"):
        summary["startup-seconds"] = summary["training-started-at"] - launched_at
    summary["startup-stages"] = {stage: round(seen - launched_at, 2) for stage, seen in stages_seen.items()}
    write_json_atomic(out_dir / "summary.json", summary)
    return summary


def gpu_memory_advice(summary: Mapping[str, Any] | None, resources: ClientResources) -> str:
    """For a run stopped by a client out of GPU memory: how many client processes shared
    the GPU, and the --gpus-per-client that halves them ('' otherwise)."""
    if not summary or "out of GPU memory" not in str(summary.get("error", "")) or resources.num_gpus <= 0:
        return ""
    processes = max(1, math.floor(1 / resources.num_gpus))
    return (f"\n{processes} client processes shared the GPU (--gpus-per-client {resources.num_gpus:g}); "
            f"try --gpus-per-client {min(1.0, 1 / max(1, processes // 2)):g} ({max(1, processes // 2)} processes)")


def run_failure(out_dir: Path, config: Mapping[str, Any], log_path: Path, context: str = "") -> RunFailed:
    """Why a Flower run in ``out_dir`` did not complete, as the RunFailed to raise.

    The ServerApp's recorded error when there is one (Flower's log, with its traceback, is
    named, not shown); else Flower or its processes died before the ServerApp recorded an
    end: summary.json is marked ``killed``, and the reason is the last error in Flower's
    log, or what is known, followed by the log's last lines. ``context`` adds what the
    caller saw (e.g. a SuperLink's exit).
    """
    summary = _read_summary(out_dir)
    if summary is not None and summary.get("status") == "failed":
        return RunFailed(f"run in {out_dir} failed: {summary.get('error')}{context}\n(Flower's log: {log_path})")
    log_text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    reason = flower_failure_reason(log_text) or (
        f"the ServerApp's process ended after round {count_rounds(out_dir)} without recording why "
        f"(killed from outside, or out of memory?)"
    )
    end_summary(out_dir, config, "killed", reason)
    tail = "\n".join(log_text.splitlines()[-30:])
    return RunFailed(f"run in {out_dir} failed: {reason}{context}\n--- last lines of {log_path} ---\n{tail}")


def end_summary(out_dir: Path, config: Mapping[str, Any], status: str, reason: str) -> None:
    """Record in ``summary.json`` how a run that did not complete ended (``interrupted``,
    ``killed``), with the metrics of the rounds it finished; a completed run's is left alone."""
    summary = _read_summary(out_dir) or {}
    if summary.get("status") == "completed":
        return
    try:
        with open(out_dir / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        rows = []
    metrics = summarize(rows, summary_horizon(config), config["target-accuracy"])
    write_json_atomic(out_dir / "summary.json", {**summary, **metrics, "status": status, "error": reason})


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def flower_failure_reason(log_text: str) -> str | None:
    """The reason Flower's log gives for a failed run: its last ERROR line (a Python
    exception's last line when that is all there is), None when the log names none."""
    lines = [ANSI_ESCAPE.sub("", line).strip() for line in log_text.splitlines()]
    errors = [line for line in lines if line.startswith("ERROR")]
    if errors:
        return errors[-1].partition(":")[2].strip() or errors[-1]
    exceptions = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b.*", line)]
    return exceptions[-1] if exceptions else None


# What a run waits for before its first round, recognised by the first line of each stage
# in flwr.log (Flower's own lines, then the ServerApp's); the last one seen is shown.
STARTUP_STAGES = (
    ("Starting local SuperLink", "starting the SuperLink"),
    ("Successfully started run", "starting the simulation"),
    ("Starting Flower Simulation", "starting Ray and the client processes"),
    ("[basin] loading", "loading data and building the partition"),
    ("[basin] discovering clients", "discovering clients"),
    ("[basin] resuming", "resuming from the checkpoint"),
    ("[basin] training round 1", "training round 1"),
)


# From this stage on the ServerApp runs inside the simulation process.
SERVER_APP_STARTED = "loading data and building the partition"


def startup_stages(log_text: str) -> list[str]:
    """The start-up stages a flwr.log shows, in STARTUP_STAGES order."""
    return [name for marker, name in STARTUP_STAGES if marker in log_text]


def startup_stage(log_text: str) -> str:
    """The start-up stage a flwr.log has reached ("starting Flower" before any line)."""
    return (["starting Flower", *startup_stages(log_text)])[-1]


FAILED_RUN_LOG_GRACE_S = 3.0


def _follow(
    process: subprocess.Popen, out_dir: Path, num_rounds: int, progress: bool, label: str, leave: bool,
    server_alive: Callable[[], bool] | None = None, stop: threading.Event | None = None,
) -> dict[str, float]:
    """Wait for ``flwr run``, drawing a progress bar of rounds written to results.csv; until
    the first round is written the bar says which start-up stage the run is in. Returns
    when each start-up stage was first seen in flwr.log (``time.time()``, polled every
    0.2 s).

    Returns as soon as the ServerApp has marked the run completed (it writes the summary
    last, after the final model), or a few seconds after it marked it failed (time for
    Flower to log the error's traceback): the tens of seconds Flower then spends shutting
    down Ray and the log stream would only delay the next run; the caller stops those
    processes. With ``server_alive``, also returns once the ServerApp has started and its
    process is gone twice in a row (checked every second) without a recorded end: killed
    from outside, where ``flwr run`` itself would wait about a minute.
    """
    from experiments.progress import progress_bar

    log_path = out_dir / "flwr.log"
    last_stage = STARTUP_STAGES[-1][1]
    seen: dict[str, float] = {}
    server_checked, server_missing = 0.0, 0
    shown_stage = ""
    with progress_bar(total=num_rounds, desc=label or out_dir.name, unit="round", disable=not progress, leave=leave) as bar:
        while process.poll() is None:
            if stop is not None and stop.is_set():
                raise KeyboardInterrupt
            bar.update(count_rounds(out_dir) - bar.n)
            if last_stage not in seen:
                try:
                    log_text = log_path.read_text(errors="replace")
                except OSError:
                    log_text = ""
                now = time.time()
                for stage in startup_stages(log_text):
                    seen.setdefault(stage, now)
                if progress and bar.n == 0 and startup_stage(log_text) != shown_stage:
                    shown_stage = startup_stage(log_text)  # a line of its own when written to a file
                    bar.set_postfix_str(shown_stage, refresh=True)
            if progress and bar.n > 0 and bar.postfix:
                bar.set_postfix_str("", refresh=False)
            summary = _read_summary(out_dir)
            if summary is not None and summary.get("status") == "completed":
                break
            if summary is not None and summary.get("status") == "failed":
                try:
                    process.wait(timeout=FAILED_RUN_LOG_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
                break
            if server_alive is not None and SERVER_APP_STARTED in seen and time.monotonic() - server_checked >= 1.0:
                server_checked = time.monotonic()
                server_missing = 0 if server_alive() else server_missing + 1
                if server_missing == 2:
                    break
            time.sleep(0.2)
        bar.update(count_rounds(out_dir) - bar.n)
    return seen
