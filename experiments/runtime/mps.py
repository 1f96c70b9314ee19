"""CUDA MPS for the client processes of a run (``--mps`` of run, sweep and benchmark).

Without MPS, processes that share a GPU take turns on it (time slicing): a round's client
processes, each launching small kernels, leave most of the GPU idle. Under the Multi-
Process Service their kernels run concurrently. Measured on one H100 with 16 processes
each training Fashion-MNIST's CNN: ~2.9k client steps/s without MPS, ~10.4k with it.

:class:`MpsDaemon` starts ``nvidia-cuda-mps-control -d`` with pipe and log directories of
its own (a temporary folder), points the launcher's environment at them so that Flower's
processes, Ray and the client actors started from it connect, and stops the daemon
(``quit``) when the launcher ends, Ctrl-C included. If an MPS daemon already answers at
``$CUDA_MPS_PIPE_DIRECTORY`` (or the default ``/tmp/nvidia-mps``), it is used and left
running. While Basin's daemon runs, other processes on the same GPU that do not use its
pipe directory run beside the MPS server as usual (time-sliced against it); on a GPU in
exclusive-process compute mode only MPS clients can use the GPU at all.

MPS is a speed-up, so it fails soft: a daemon that does not start, or one that a CUDA
process cannot use (checked once by a small probe process touching the GPU through it),
leaves the run without MPS, and :attr:`MpsDaemon.message` says so and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from experiments.runtime.cli import UsageError
from experiments.runtime.machine import cuda_available

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")


def running_daemon() -> Path | None:
    """The pipe directory of an MPS daemon already running for this environment, or None."""
    pipe_dir = Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE_DIR)
    return pipe_dir if (pipe_dir / "control").exists() else None


def check_mps(enabled: bool) -> None:
    """Raise UsageError when ``--mps`` cannot work here (called before anything is created)."""
    if not enabled:
        return
    if not cuda_available():
        raise UsageError("--mps needs a CUDA GPU; this machine has none (allowed here: without --mps)")
    if running_daemon() is None and shutil.which(CONTROL) is None:
        raise UsageError(f"--mps: {CONTROL} is not on PATH (it ships with the NVIDIA driver utilities); "
                         "allowed here: without --mps")


# The probe: a CUDA context and one allocation, through MPS when the environment names it.
PROBE = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
PROBE_TIMEOUT_S = 120


def probe_cuda() -> str:
    """'' when a new process of this environment can use CUDA, else why not."""
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer within {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1][:300] if lines else f"exit code {done.returncode}"


class MpsDaemon:
    """A context manager: MPS for every CUDA process started inside it (see the module
    docstring). ``enabled=False`` does nothing, so callers can always enter it."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.started_in: Path | None = None
        self.active = False  # the run's CUDA processes use MPS
        self.previous_env: dict[str, str | None] = {}
        self.message = ""

    def __enter__(self) -> MpsDaemon:
        if not self.enabled:
            return self
        check_mps(True)
        existing = running_daemon()
        if existing is not None:
            self._set_env({PIPE_ENV: str(existing)})
            problem = probe_cuda()
            if problem:
                self.__exit__()
                self.message = (f"MPS: a CUDA process could not use the daemon already running at {existing} "
                                f"({problem}); running without MPS")
                return self
            self.active = True
            self.message = f"using the MPS daemon already running at {existing}"
            return self
        control = shutil.which(CONTROL)
        directory = Path(tempfile.mkdtemp(prefix="basin-mps-"))
        env = {PIPE_ENV: str(directory / "pipe"), LOG_ENV: str(directory / "log")}
        for path in env.values():
            Path(path).mkdir()
        started = subprocess.run([control, "-d"], env={**os.environ, **env}, capture_output=True, text=True)
        if started.returncode != 0:
            shutil.rmtree(directory, ignore_errors=True)
            self.message = (f"MPS: {CONTROL} -d failed ({started.returncode}: "
                            f"{(started.stderr or started.stdout).strip()[:300]}); running without MPS")
            return self
        self.started_in = directory
        self._set_env(env)
        problem = probe_cuda()
        if problem:
            self.__exit__()
            self.message = f"MPS: a CUDA process could not use the daemon ({problem}); running without MPS"
            return self
        self.active = True
        self.message = f"started an MPS daemon for this launcher (pipe and log in {directory})"
        return self

    def __exit__(self, *exc_info) -> None:
        if self.started_in is not None:
            env = {**os.environ, PIPE_ENV: str(self.started_in / "pipe"), LOG_ENV: str(self.started_in / "log")}
            subprocess.run([shutil.which(CONTROL) or CONTROL], input="quit\n", env=env, capture_output=True, text=True,
                           timeout=30)
            shutil.rmtree(self.started_in, ignore_errors=True)
            self.started_in = None
        self.active = False
        for key, value in self.previous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.previous_env = {}

    def _set_env(self, env: dict[str, str]) -> None:
        for key, value in env.items():
            self.previous_env[key] = os.environ.get(key)
            os.environ[key] = value
