"""The test suite itself, stopped from outside, leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_test_run_stopped_with_sigterm_tears_down_and_removes_its_folders(tmp_path):
    """SIGTERM (a timeout, a CI runner stopping the job) ends a run as Ctrl-C does: its
    fixtures tear down and the suite's own Hugging Face cache folder is removed."""
    (tmp_path / "test_waits.py").write_text(
        "import os, time\n"
        "def test_waits():\n"
        "    print('cache', os.environ['HF_DATASETS_CACHE'], flush=True)\n"
        "    time.sleep(120)\n")
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                            str(tmp_path / "test_waits.py")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("cache") and time.monotonic() < deadline:
            line = run.stdout.readline()
        cache = Path(line.split()[1])
        assert cache.is_dir()
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=60)[0]
    finally:
        run.kill()
    assert "KeyboardInterrupt" in output
    assert not cache.exists()
