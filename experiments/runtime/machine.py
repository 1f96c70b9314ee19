"""What the machine can run: its CPUs and GPUs, the Ray resources of a client process, and
whether a run's data is there — checked before Flower or Ray start."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients.log import log
from partitions.availability import data_problem
from partitions.datasets import FASHION_MNIST_DEFAULT_DIR
from strategies.cohort import cohort_size
from strategies.config import ConfigError


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


# The module each tracker imports (the optional extra "tracking").
TRACKER_MODULES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_trackers(configs: Iterable[Mapping[str, Any]]) -> None:
    """Raise ConfigError, before any Flower process exists, when a run asks for a tracker
    whose library is not installed."""
    import importlib.util

    from strategies.tracking import tracker_names

    for config in configs:
        for name in tracker_names(config["track"]):
            if importlib.util.find_spec(TRACKER_MODULES[name]) is None:
                raise ConfigError(
                    f"run config key 'track' = {config['track']!r} asks for {name}, which is not installed; install "
                    f"the optional extra: {Path(sys.executable).parent / 'pip'} install -e \".[tracking]\""
                )


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


# Where torch.cuda.is_available() needs a driver's device files (Linux: the NVIDIA driver's
# control device, or WSL's GPU device); macOS has no CUDA.
CUDA_DEVICE_FILES = ("/dev/nvidiactl", "/dev/dxg")


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch (~2 s on 2 CPU cores, before
    Flower starts) where no CUDA device can be there: on macOS, and on Linux without the
    driver's device files (:data:`CUDA_DEVICE_FILES`)."""
    if sys.platform == "darwin" or (sys.platform.startswith("linux")
                                    and not any(os.path.exists(path) for path in CUDA_DEVICE_FILES)):
        return False
    import torch

    return torch.cuda.is_available()


def check_machine(
    configs: Iterable[Mapping[str, Any]], resources: ClientResources, ray_address: str | None = None
) -> None:
    """Raise ConfigError, before any Flower process exists, when the runs ask this machine
    for what it lacks: a CUDA device, or more CPU cores or GPU share per client than it has
    (Ray would place no client and the run would fail inside Flower). On an existing Ray
    cluster (``ray_address``) the clients' resources are the cluster's to judge."""
    cuda = cuda_available()
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
    on_cuda = cuda_available() and any(c["device"] in ("cuda", "auto") for c in configs)
    cohort = max(cohort_size(c) for c in configs)
    by_cores = max(1, machine_cpus() // (int(cpus_per_client) * parallel))
    if not on_cuda:
        at_once = min(cohort, by_cores)
        log.info(f"{at_once} client process{'es' if at_once != 1 else ''} train{'s' if at_once == 1 else ''} "
                 f"at once per run: cohort {cohort}, at most "
                 f"{by_cores} by CPU cores (--cpus-per-client {cpus_per_client:g} each)"
                 + (f" for {parallel} runs at once" if parallel > 1 else ""))
        return ClientResources(cpus_per_client, 0.0)
    import torch

    free_bytes, _ = torch.cuda.mem_get_info()
    by_memory = max(1, free_bytes // (CLIENT_PROCESS_GPU_BYTES * parallel))
    processes = min(cohort, by_cores, by_memory)
    log.info(f"{processes} client processes share the GPU per run (--gpus-per-client {1 / processes:.4g}): "
             f"cohort {cohort}, at most {by_cores} by CPU cores and {by_memory} by free GPU memory"
             + (f" for {parallel} runs at once" if parallel > 1 else ""))
    return ClientResources(cpus_per_client, 1.0 / processes)


def gpu_memory_advice(summary: Mapping[str, Any] | None, resources: ClientResources) -> str:
    """For a run stopped by a client out of GPU memory: how many client processes shared
    the GPU, and the --gpus-per-client that halves them ('' otherwise)."""
    if not summary or "out of GPU memory" not in str(summary.get("error", "")) or resources.num_gpus <= 0:
        return ""
    processes = max(1, math.floor(1 / resources.num_gpus))
    return (f"\n{processes} client processes shared the GPU (--gpus-per-client {resources.num_gpus:g}); "
            f"try --gpus-per-client {min(1.0, 1 / max(1, processes // 2)):g} ({max(1, processes // 2)} processes)")
