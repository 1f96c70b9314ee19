"""Output folders (experiments/runtime/output_dir.py): one launcher per folder, for certain;
a dead launcher's summaries marked ``killed`` without touching a live launcher's; every
folder that cannot be used refused, naming what is allowed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.runtime import output_dir
from experiments.runtime.output_dir import (
    OutputDirError,
    OutputLock,
    create_output_dir,
    mark_abandoned_summaries,
    unique_output_dir,
)
from experiments.runtime.processes import REPO

# Each racer takes the folder's lock as often as it can for SECONDS; while it holds it, it
# creates the folder's "holder" file exclusively: a second holder at the same time finds
# it there. Exit 3 on finding one.
RACER = textwrap.dedent("""
    import os, sys, time
    from experiments.runtime.output_dir import OutputLock, OutputLocked
    folder, seconds = sys.argv[1], float(sys.argv[2])
    deadline, held = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        try:
            with OutputLock(folder):
                try:
                    fd = os.open(os.path.join(folder, "holder"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    print("two launchers held the folder at once", flush=True)
                    sys.exit(3)
                os.close(fd)
                os.unlink(os.path.join(folder, "holder"))
                held += 1
        except OutputLocked:
            continue
    print(f"held {held} times", flush=True)
""")


def test_three_launchers_racing_on_one_folder_never_hold_it_at_once(tmp_path):
    """The holder that ends removes the lock file: a launcher that had opened it just before
    used to lock the removed file while a third locked the new one (both then wrote)."""
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), "4"], cwd=REPO, stdout=subprocess.PIPE,
                               text=True) for _ in range(3)]
    outputs = [racer.communicate(timeout=60)[0] for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0, 0], outputs
    assert all(output.startswith("held ") for output in outputs)


def test_a_dead_launchers_summaries_are_marked_but_not_a_live_launchers_run(tmp_path):
    """A run folder inside the job's folder whose own lock a live launcher holds keeps its
    "running" summary; the dead launcher's own and its run's are marked killed."""
    for folder in (tmp_path, tmp_path / "runs" / "abandoned", tmp_path / "runs" / "live"):
        folder.mkdir(parents=True, exist_ok=True)
    live = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from experiments.runtime.output_dir import OutputLock; "
         "lock = OutputLock(sys.argv[1]).__enter__(); print('held', flush=True); time.sleep(120)",
         str(tmp_path / "runs" / "live")], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "held"
        for folder in (tmp_path, tmp_path / "runs" / "abandoned", tmp_path / "runs" / "live"):
            (folder / "summary.json").write_text(json.dumps({"status": "running"}))
        mark_abandoned_summaries(tmp_path, "4242")
        status = {name: json.loads((folder / "summary.json").read_text())["status"]
                  for name, folder in (("job", tmp_path), ("abandoned", tmp_path / "runs" / "abandoned"),
                                       ("live", tmp_path / "runs" / "live"))}
        assert status == {"job": "killed", "abandoned": "killed", "live": "running"}
        # A folder another launcher took over before the dead holder's guardian came: left alone.
        mark_abandoned_summaries(tmp_path / "runs" / "live", "4242", "its processes stopped by the run's guardian")
        assert json.loads((tmp_path / "runs" / "live" / "summary.json").read_text())["status"] == "running"
    finally:
        live.kill()
        live.wait()
    # This process holding the folder marks its own folder's abandoned summary.
    (tmp_path / "runs" / "live" / "summary.json").write_text(json.dumps({"status": "running"}))
    with OutputLock(tmp_path / "runs" / "live"):
        assert json.loads((tmp_path / "runs" / "live" / "summary.json").read_text())["status"] == "killed"


@pytest.mark.parametrize("path", ["", "   "])
def test_an_empty_output_path_is_refused(path):
    with pytest.raises(OutputDirError, match=r"--out .* is empty; allowed: a directory path"):
        create_output_dir(Path(path) if path else path)


def test_an_output_folder_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    """(The suite may run as root, whom no mode bit stops: the check's answer is what is set.)"""
    monkeypatch.setattr(output_dir.os, "access", lambda path, mode: False)
    with pytest.raises(OutputDirError, match="the directory is not writable; allowed: a writable directory path"):
        create_output_dir(tmp_path / "out")


def test_a_default_folder_that_cannot_be_created_is_refused(tmp_path, monkeypatch):
    def mkdir(self, *args, **kwargs):
        if self.parent == tmp_path:
            raise PermissionError(13, "Permission denied")
        return original(self, *args, **kwargs)

    original = Path.mkdir
    monkeypatch.setattr(Path, "mkdir", mkdir)
    with pytest.raises(OutputDirError, match=r"output folder .*/main-.*: cannot create it \(Permission denied\)"):
        unique_output_dir(tmp_path, "main")


def test_a_folder_whose_lock_file_cannot_be_created_is_refused(tmp_path, monkeypatch):
    def no_lock_file(path, flags, mode=0o777):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output_dir.os, "open", no_lock_file)
    with pytest.raises(OutputDirError, match=r"cannot create \.basin\.lock \(Permission denied\); allowed: a writable"):
        OutputLock(tmp_path).__enter__()
