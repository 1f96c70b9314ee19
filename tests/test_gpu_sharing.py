"""Sharing one GPU (experiments/runtime/mps.py, machine.client_resources, sweep --parallel auto),
tested without one: a fake ``nvidia-cuda-mps-control`` records what it was asked."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from experiments.runtime import machine, sweep_definition, sweep_runs
from experiments.runtime import mps as mps_module
from experiments.runtime.cli import UsageError
from experiments.runtime.machine import client_resources
from experiments.runtime.mps import LOG_ENV, PIPE_ENV, MpsDaemon, probe_cuda
from experiments.runtime.run_config import default_run_config

FAKE_CONTROL = """#!/bin/sh
# Records each call: its arguments, its pipe and log directories, and stdin for 'quit'.
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "{log}"; exit {code}; fi
read command; echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "{log}"
"""


@pytest.fixture(autouse=True)
def driver_device_file(monkeypatch):
    """As on a machine with the NVIDIA driver: whether CUDA is there is torch's (patched) answer."""
    monkeypatch.setattr(machine, "CUDA_DEVICE_FILES", (__file__,))


def test_cuda_is_asked_of_torch_only_where_a_driver_device_file_is(monkeypatch):
    """The launcher needs no torch (~2 s) to learn that a machine without a CUDA driver has no CUDA."""
    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(True) or True)
    monkeypatch.setattr(machine.sys, "platform", "linux")
    monkeypatch.setattr(machine, "CUDA_DEVICE_FILES", ("/nonexistent/nvidiactl", "/nonexistent/dxg"))
    assert machine.cuda_available() is False and asked == []
    monkeypatch.setattr(machine, "CUDA_DEVICE_FILES", ("/nonexistent/nvidiactl", __file__))
    assert machine.cuda_available() is True and asked == [True]
    monkeypatch.setattr(machine.sys, "platform", "darwin")
    assert machine.cuda_available() is False and asked == [True]


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    def install(code: int = 0):
        script = tmp_path / "bin" / "nvidia-cuda-mps-control"
        script.parent.mkdir(exist_ok=True)
        script.write_text(FAKE_CONTROL.format(log=tmp_path / "calls.log", code=code))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv(PIPE_ENV, str(tmp_path / "no-daemon-here"))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(mps_module, "probe_cuda", lambda: "")  # a CUDA process can use the daemon
        return tmp_path / "calls.log"
    return install


def test_mps_starts_its_own_daemon_for_the_launch_and_stops_it(fake_control):
    calls = fake_control()
    with MpsDaemon(True) as mps:
        assert mps.active
        pipe, log = os.environ[PIPE_ENV], os.environ[LOG_ENV]
        assert os.path.isdir(pipe) and os.path.isdir(log) and os.path.dirname(pipe) in mps.message
    assert calls.read_text().splitlines() == [f"start {pipe} {log}", f"quit {pipe}"]
    assert not os.path.exists(pipe)  # its folders are removed
    assert os.environ[PIPE_ENV].endswith("no-daemon-here") and LOG_ENV not in os.environ  # environment restored


def test_mps_uses_a_daemon_that_is_already_running(fake_control, tmp_path, monkeypatch):
    calls = fake_control()
    (tmp_path / "running").mkdir()
    (tmp_path / "running" / "control").touch()
    monkeypatch.setenv(PIPE_ENV, str(tmp_path / "running"))
    with MpsDaemon(True) as mps:
        assert "already running" in mps.message and os.environ[PIPE_ENV] == str(tmp_path / "running")
    assert not calls.exists()  # neither started nor stopped


def test_a_daemon_that_does_not_start_leaves_the_run_without_mps_and_says_so(fake_control):
    calls = fake_control(code=1)
    before = dict(os.environ)
    with MpsDaemon(True) as mps:
        assert not mps.active and dict(os.environ) == before
        assert "nvidia-cuda-mps-control -d failed (1" in mps.message and "running without MPS" in mps.message
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["start"]


def test_a_daemon_that_cuda_processes_cannot_use_is_stopped_and_the_run_goes_on_without_it(fake_control, monkeypatch):
    calls = fake_control()
    monkeypatch.setattr(mps_module, "probe_cuda", lambda: "RuntimeError: all CUDA-capable devices are busy")
    before = dict(os.environ)
    with MpsDaemon(True) as mps:
        assert not mps.active and dict(os.environ) == before
        assert "could not use the daemon (RuntimeError: all CUDA-capable devices are busy); running without MPS" \
            in mps.message
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["start", "quit"]  # stopped at once


@pytest.mark.skipif(torch.cuda.is_available(), reason="the probe succeeds on a GPU")
def test_the_probe_says_why_a_cuda_process_fails_here():
    reason = probe_cuda()  # e.g. "RuntimeError: Found no NVIDIA driver on your system. …"
    assert "Error" in reason and len(reason) <= 300


def test_mps_refuses_clearly_where_it_cannot_run(fake_control, monkeypatch):
    fake_control()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UsageError, match="not on PATH"):
        MpsDaemon(True).__enter__()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="needs a CUDA GPU"):
        MpsDaemon(True).__enter__()
    with MpsDaemon(False) as off:  # without --mps: nothing at all
        assert off.message == ""


def config(**values):
    return {**default_run_config(), **values}


def test_auto_gpu_share_trains_a_whole_cohort_at_once_within_cores_and_memory(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (40 << 30, 80 << 30))
    monkeypatch.setattr(machine, "machine_cpus", lambda: 16)
    cohort_of_10 = config(**{"num-clients": 100, "participation": 0.1})
    assert client_resources([cohort_of_10], 1, None).num_gpus == pytest.approx(1 / 10)
    assert "10 client processes share the GPU" in capsys.readouterr().err
    assert client_resources([config(**{"num-clients": 40, "participation": 1.0})], 1, None).num_gpus == pytest.approx(1 / 16)
    assert client_resources([cohort_of_10], 1, None, parallel=4).num_gpus == pytest.approx(1 / 4)  # 16 cores / 4 runs
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (3 << 30, 80 << 30))
    assert client_resources([cohort_of_10], 1, None).num_gpus == pytest.approx(1 / 3)  # 3 GiB free
    assert client_resources([cohort_of_10], 1, 0.125).num_gpus == 0.125  # given: as given
    assert client_resources([config(device="cpu")], 1, None).num_gpus == 0.0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    capsys.readouterr()
    assert client_resources([cohort_of_10], 2, None).num_gpus == 0.0
    assert "8 client processes train at once per run: cohort 10, at most 8 by CPU cores" in capsys.readouterr().err


def test_auto_parallel_is_one_run_without_a_gpu_and_as_many_as_the_free_gpu_memory_holds(monkeypatch):
    runs = [sweep_definition.SweepRun(f"r{i}", config(**{"num-clients": 100, "participation": 0.1})) for i in range(6)]
    plan = sweep_definition.Sweep("s", runs, machine.ClientResources(), 0, True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sweep_runs.auto_parallel(plan) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (70 << 30, 80 << 30))
    assert sweep_runs.auto_parallel(plan) == sweep_runs.AUTO_PARALLEL_MAX
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (25 << 30, 80 << 30))
    assert sweep_runs.auto_parallel(plan) == 2  # 10 client processes of 1 GiB per run
