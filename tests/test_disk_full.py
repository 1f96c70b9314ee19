"""A full disk ends a command with one line and exit code 3, leaves no temporary file and
no process, and the same command resumes to the uninterrupted run's results, bit for bit.

The writers are checked everywhere by injecting ENOSPC; the commands on a real full
filesystem (a small tmpfs), skipped where mounting is not permitted."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import SCOPE_VARIABLE, processes_in_scope

from clients.atomic_files import write_atomically
from clients.state_store import atomic_save
from experiments.runtime.cli import EXIT_DISK_FULL, guarded
from experiments.runtime.reproducible import compare_runs
from experiments.runtime.run_config import APP_DIR
from partitions import cache
from strategies.results import write_json_atomic

NO_SPACE = os.strerror(errno.ENOSPC)


def _full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, NO_SPACE)


WRITERS = {
    "bytes": lambda path: write_atomically(path, b"new"),
    "json (summaries)": lambda path: write_json_atomic(path, {"status": "new"}),
    "torch (checkpoints, models)": lambda path: atomic_save({"w": torch.ones(3)}, path),
}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_writer_on_a_full_disk_keeps_the_old_file_leaves_no_temporary_one_and_names_the_file(tmp_path, monkeypatch, writer):
    path = tmp_path / "file"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "fsync", _full_disk)  # the data reached the page cache, not the disk
    with pytest.raises(OSError) as raised:
        WRITERS[writer](path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_sweep_table_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    from experiments.runtime import sweep_runs

    table = pd.DataFrame({"run": ["a"], "status": ["completed"]})
    monkeypatch.setattr(sweep_runs, "collect", lambda sweep, out_dir: (table, table))
    monkeypatch.setattr(os, "fsync", _full_disk)
    with pytest.raises(OSError):
        sweep_runs.write_tables(None, tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_cache_entry_that_does_not_fit_is_not_left_for_a_later_run(tmp_path, monkeypatch):
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(np, "savez", _full_disk)
    arrays = cache.cached_arrays("test", "key", lambda: {"x": np.arange(3)})
    assert np.array_equal(arrays["x"], np.arange(3))  # the run goes on with what it built
    assert not cache.is_cached("test", "key")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, NO_SPACE, "/data/run/summary.json"),
    RuntimeError("raised from a full disk"),  # e.g. a library's own error: the cause is what counts
    shutil.Error([("/src/a.py", "/data/run/a.py", f"[Errno 28] {NO_SPACE}: '/data/run/a.py'")]),
], ids=["OSError", "raised from one", "a tree copy's"])
def test_a_full_disk_is_one_line_and_exit_code_3(capsys, error):
    def body() -> int:
        if isinstance(error, RuntimeError):
            raise error from OSError(errno.ENOSPC, NO_SPACE, "/data/run/checkpoint.pt")
        raise error

    assert guarded(body) == EXIT_DISK_FULL == 3
    assert capsys.readouterr().err == (f"error: the disk holding /data/run is full ([Errno 28] {NO_SPACE}): free space "
                                       "and run the same command to resume\n")


# ---- on a real full filesystem -----------------------------------------------------

SETTINGS = {"num-clients": 4, "participation": 0.5, "num-rounds": 6, "local-epochs": 1, "device": "cpu",
            "checkpoint-every": 1, "averaging": "ima", "window": 2, "avg-start": 2}
# The uninterrupted run that a resumed one must equal (tests/conftest.py's flower_runs).
FLOWER_RUNS = {"disk-full-uninterrupted": SETTINGS}


@contextmanager
def _small_disk(mount: Path) -> Iterator[Path]:
    """A 120 KiB tmpfs at ``mount``: round 1 or 2's checkpoint does not fit next to the run's other files."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    with _small_disk(tmp_path / "disk") as mount:
        yield mount


def _run_command(out: Path) -> list[str]:
    sets = [arg for key, value in SETTINGS.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "experiments.run", *sets, "--out", str(out)]


def _nothing_left(scope: str) -> list[int]:
    deadline = time.monotonic() + 8
    while processes_in_scope(scope) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(processes_in_scope(scope))


@dataclass
class FullThenFreed:
    """A command run with its output on a full disk, then again once space was freed."""

    out: Path
    full: subprocess.CompletedProcess
    temporary_files: list[Path]  # *.tmp files in ``out`` after the full run
    summary: dict | None  # ``out``'s summary.json after the full run, where there is one
    left_when_full: list[int]  # processes of the command still there after the full run
    resumed: subprocess.CompletedProcess
    left: list[int]  # and after the second


def _full_then_freed(command: list[str], out: Path, disk: Path) -> FullThenFreed:
    scope = uuid.uuid4().hex
    env = {**os.environ, SCOPE_VARIABLE: scope, "PYTHONPATH": str(APP_DIR)}
    full = subprocess.run(command, cwd=APP_DIR, env=env, capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else None
    temporary, left_when_full = sorted(out.rglob("*.tmp")), _nothing_left(scope)
    subprocess.run(["mount", "-o", "remount,size=20m", str(disk)], check=True)  # space freed
    resumed = subprocess.run(command, cwd=APP_DIR, env=env, capture_output=True, text=True, timeout=300)
    return FullThenFreed(out, full, temporary, summary, left_when_full, resumed, _nothing_left(scope))


@pytest.fixture(scope="module")
def full_disks(tmp_path_factory) -> Iterator[dict[str, Future]]:
    """A run's and a sweep's commands, each on a small disk of its own, at once: each alone
    left about 40 % of 2 cores idle (its processes' start)."""
    folder = tmp_path_factory.mktemp("full-disks")
    spec = folder / "sweep.toml"
    spec.write_text('name = "full"\n[set]\n' + "".join(f"{key} = {json.dumps(value)}\n" for key, value in SETTINGS.items())
                    + '[grid]\naveraging = ["none", "ima"]\n')
    with _small_disk(folder / "run-disk") as run_disk, _small_disk(folder / "sweep-disk") as sweep_disk, \
            ThreadPoolExecutor(max_workers=2) as pool:
        sweep = [sys.executable, "-m", "experiments.sweep", str(spec), "--no-progress", "--out", str(sweep_disk / "sweep")]
        futures = {"run": pool.submit(_full_then_freed, _run_command(run_disk / "run"), run_disk / "run", run_disk),
                   "sweep": pool.submit(_full_then_freed, sweep, sweep_disk / "sweep", sweep_disk)}
        for future in futures.values():
            future.exception()  # both have ended before their disks are unmounted
        yield futures


@pytest.mark.slow
@pytest.mark.flower_runs("disk-full-uninterrupted")
def test_a_full_output_disk_stops_the_run_in_one_line_and_the_same_command_resumes_exactly(full_disks, flower_runs):
    ran = full_disks["run"].result()
    full, out = ran.full, ran.out
    assert full.returncode == EXIT_DISK_FULL, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert last == (f"error: the disk holding {out} is full ([Errno 28] {NO_SPACE}): free space and run the same "
                    "command to resume")
    assert "Traceback" not in full.stderr
    assert ran.temporary_files == []
    assert ran.summary["status"] == "failed" and "disk" in ran.summary["error"] and "full" in ran.summary["error"]
    assert ran.left_when_full == []

    assert ran.resumed.returncode == 0, ran.resumed.stderr[-3000:]
    comparison = compare_runs(out, flower_runs["disk-full-uninterrupted"].completed())
    assert comparison.identical, comparison.differences
    assert ran.left == []


@pytest.mark.slow
def test_a_full_temporary_directory_is_named_and_leaves_no_process(small_disk, tmp_path, scoped_env):
    env, scope = scoped_env
    done = subprocess.run(_run_command(tmp_path / "run"), cwd=APP_DIR, capture_output=True, text=True, timeout=300,
                          env={**env, "TMPDIR": str(small_disk), "PYTHONPATH": str(APP_DIR)})
    assert done.returncode == EXIT_DISK_FULL, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: the disk holding the temporary directory {small_disk} is full ([Errno 28] {NO_SPACE}): free space "
        "there, or set TMPDIR to a folder with space, and run the same command to resume")
    assert "Traceback" not in done.stderr
    assert _nothing_left(scope) == []
    assert list(small_disk.iterdir()) == []  # the staged app's partial copy is removed


@pytest.mark.slow
def test_a_sweep_on_a_full_disk_stops_in_one_line_and_the_same_command_completes_it(full_disks):
    ran = full_disks["sweep"].result()
    full, out = ran.full, ran.out
    assert full.returncode == EXIT_DISK_FULL, full.stderr[-3000:]
    assert full.stderr.strip().splitlines()[-1].startswith(f"error: the disk holding {out / 'runs'}")
    assert "Traceback" not in full.stderr
    assert ran.temporary_files == []
    assert ran.left_when_full == []

    assert ran.resumed.returncode == 0, ran.resumed.stderr[-3000:]
    assert pd.read_csv(out / "results.csv")["status"].eq("completed").all()
    assert ran.left == []
