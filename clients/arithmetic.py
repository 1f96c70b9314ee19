"""What fixes a process's floating-point arithmetic, set from the run config alone.

The same config and seed give the same bits however the machine is shared only if every
process that computes (each client process, and the ServerApp for aggregation and
evaluation) runs the same kernels with the same reduction order. Two things decide that
beyond the code and the data:

- **torch's intra-op threads.** A matrix product or convolution split over two threads
  sums in another order than on one: the digits job's final model differed by ~5e-8
  between ``--cpus-per-client 1`` (two processes of one thread) and ``2`` (one process of
  two threads), because Ray sets ``OMP_NUM_THREADS`` from a client's CPUs. The run-config
  key ``torch-threads`` (default 1: on the default 2-core machine one thread per client
  process is also the fastest) sets them in every client process instead, and
  ``server-torch-threads`` (default 2: evaluation runs while the clients wait, on every
  core of that machine) in the ServerApp; 0 leaves torch's own choice (for clients:
  Ray's CPUs per client), and results then depend on how the machine is shared.
- **CUDA kernels.** With ``cuda-deterministic`` (default true) cuDNN uses deterministic
  algorithms and does not benchmark, TF32 is off in matrix products and convolutions, and
  ``torch.use_deterministic_algorithms`` is on (warning, not failing, for an operation
  without a deterministic kernel; cuBLAS then needs ``CUBLAS_WORKSPACE_CONFIG``, set here
  when the user has not). False lets cuDNN pick its fastest kernels and allows TF32.

:func:`arithmetic_record` is what ``summary.json`` keeps (``arithmetic``), so two runs can
be told apart by what fixed their numbers: versions, device, threads and flags.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import torch

from clients.memory_format import layout_name, memory_format
from clients.model_names import resolve_model_name

CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
# cuBLAS's documented setting for reproducible results (one of two it allows).
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"


def fix_arithmetic(threads: int, device: torch.device, cuda_deterministic: bool) -> None:
    """Set this process's torch threads (``threads`` > 0) and, on CUDA, its kernel choice
    (see the module docstring). Cheap when nothing changes: call it with every message."""
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if device.type != "cuda":
        return
    if cuda_deterministic:
        os.environ.setdefault(CUBLAS_WORKSPACE, CUBLAS_DETERMINISTIC_WORKSPACE)
    torch.backends.cudnn.deterministic = cuda_deterministic
    torch.backends.cudnn.benchmark = not cuda_deterministic
    torch.backends.cuda.matmul.allow_tf32 = not cuda_deterministic
    torch.backends.cudnn.allow_tf32 = not cuda_deterministic
    if torch.are_deterministic_algorithms_enabled() != cuda_deterministic:
        torch.use_deterministic_algorithms(cuda_deterministic, warn_only=True)


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def arithmetic_record(device: torch.device, config: Mapping[str, Any], cuda_deterministic: bool) -> dict[str, Any]:
    """What fixed this run's arithmetic, for ``summary.json``: package versions, the
    device, torch's threads (the clients' key; the ServerApp's, as set), and on CUDA the flags.
    The clients' layout (``memory-format``) is theirs to say: their replies report it and the
    round loop adds it after round 1 (strategies/results.RunRecorder.record_clients_layout)."""
    record: dict[str, Any] = {
        "torch": torch.__version__, "flwr": _version("flwr"), "numpy": np.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "device": str(device),
        "torch-threads": config["torch-threads"], "server-torch-threads": torch.get_num_threads(),
        # the layout of the ServerApp's central evaluation, on its own device (clients/memory_format.py)
        "evaluation-memory-format": layout_name(memory_format(resolve_model_name(str(config["model"]),
                                                                                 str(config["dataset"])), device.type)),
    }
    if device.type == "cuda":
        record.update({
            "gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "cuda-deterministic": cuda_deterministic,
            "cudnn-deterministic": torch.backends.cudnn.deterministic,
            "tf32": torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32,
            "deterministic-algorithms": torch.are_deterministic_algorithms_enabled(),
            CUBLAS_WORKSPACE: os.environ.get(CUBLAS_WORKSPACE, ""),
        })
    return record
