"""The test suite's own checks: a test run stopped from outside, one that leaves something
behind or runs past CI's time gate, and the fast tier's pytest-xdist workers."""

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
                           text=True, env=_environment())
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


def _environment(**env: str) -> dict[str, str]:
    """This environment with ``env`` added, and without CI's checks of a test run (.ci/run's)
    that ``env`` does not set: an inner run neither fails on them nor adds its seconds to
    the outer run's file."""
    import os

    environment = {**os.environ, "PYTHONPATH": str(REPO), **env}
    for name in ("BASIN_CHECK_LEFTOVERS", "BASIN_TEST_AIM_S", "BASIN_TEST_GATE_S", "BASIN_TEST_SECONDS_FILE"):
        if name not in env:
            environment.pop(name, None)
    return environment


def _run_pytest(test: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    """pytest on ``test`` with the suite's conftest and ``env`` added to the environment."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", *options,
                           str(test)], cwd=test.parent, env=_environment(**env), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "two xdist workers"])
def test_a_test_run_that_leaves_a_basin_folder_behind_fails_naming_it(tmp_path, workers):
    """CI's check that a test run leaves nothing behind (BASIN_CHECK_LEFTOVERS=1,
    tests/conftest.py) fails a run whose test leaves a /tmp/basin-* folder, and names it;
    also when the test ran on one of pytest-xdist's workers (the fast tier's)."""
    import os
    import tempfile

    test = tmp_path / "test_leaves.py"
    marker = tmp_path / "left.txt"
    test.write_text("import tempfile\n"
                    f"def test_leaves():\n    open({str(marker)!r}, 'w').write(tempfile.mkdtemp(prefix='basin-left-'))\n"
                    "def test_passes():\n    pass\n")
    result = _run_pytest(test, *workers, BASIN_CHECK_LEFTOVERS="1", BASIN_LEFTOVER_GRACE_S="0")
    left = marker.read_text()
    os.rmdir(left)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "the test run left these behind" in result.stdout and left in result.stdout
    assert left.startswith(tempfile.gettempdir())


def test_importing_the_conftest_under_a_second_name_makes_no_second_cache_folder():
    """A test module importing ``tests.conftest`` (pytest loaded it as ``conftest``) makes no
    second Hugging Face cache folder, which CI's leftovers check would count as left behind."""
    import importlib.util
    import tempfile

    import conftest

    before = set(Path(tempfile.gettempdir()).glob("basin-test-hf-datasets-*"))
    spec = importlib.util.spec_from_file_location("second_conftest", REPO / "tests" / "conftest.py")
    second = importlib.util.module_from_spec(spec)
    sys.modules["second_conftest"] = second  # as an import does, before it runs the module (its dataclass needs it)
    try:
        spec.loader.exec_module(second)
    finally:
        del sys.modules["second_conftest"]
    assert second._HF_DATASETS_CACHE == conftest._HF_DATASETS_CACHE
    assert set(Path(tempfile.gettempdir()).glob("basin-test-hf-datasets-*")) == before


def test_a_test_run_past_its_aim_passes_saying_so_and_past_its_gate_fails_naming_its_slowest_tests(tmp_path):
    """CI's aim for a test run (BASIN_TEST_AIM_S, set by .ci/run) is reported, met or
    missed, and never fails a run; its gate (BASIN_TEST_GATE_S) fails a run that takes
    longer, though every test passed, naming the slowest tests with their seconds."""
    test = tmp_path / "test_takes_a_second.py"
    test.write_text("import time\ndef test_takes_a_second():\n    time.sleep(1.0)\ndef test_quick():\n    pass\n")
    missed = _run_pytest(test, BASIN_TEST_AIM_S="0.5", BASIN_TEST_GATE_S="60")
    assert missed.returncode == 0, missed.stdout[-2000:]
    assert "missed by 1 s: the aim of 0.5 s" in missed.stdout and "past CI's gate" not in missed.stdout, missed.stdout[-2000:]
    met = _run_pytest(test, BASIN_TEST_AIM_S="60")
    assert met.returncode == 0 and "within the aim of 60 s" in met.stdout, met.stdout[-2000:]
    past = _run_pytest(test, "-n", "2", BASIN_TEST_AIM_S="0.2", BASIN_TEST_GATE_S="0.5")
    assert past.returncode == 1, past.stdout[-2000:]
    assert "2 passed" in past.stdout and "past CI's gate of 0.5 s" in past.stdout, past.stdout[-2000:]
    slowest = past.stdout.split("its slowest tests: ")[1]
    assert slowest.startswith("test_takes_a_second.py::test_takes_a_second 1 s;"), slowest[:500]


def test_the_aim_and_the_gate_cover_the_test_runs_that_share_a_seconds_file(tmp_path):
    """With BASIN_TEST_SECONDS_FILE (.ci/run: the fast and the second tier), the aim and the
    gate are for the runs together: a run within the gate alone fails once the earlier runs'
    seconds are counted, naming them, and adds its own to the file."""
    test = tmp_path / "test_takes_a_moment.py"
    test.write_text("import time\ndef test_takes_a_moment():\n    time.sleep(0.2)\n")
    seconds = tmp_path / "seconds"
    seconds.write_text("1.5\n1.5\n")  # two earlier runs
    result = _run_pytest(test, BASIN_TEST_GATE_S="3.1", BASIN_TEST_SECONDS_FILE=str(seconds))
    assert result.returncode == 1, result.stdout[-2000:]
    assert "together with 2 earlier (3 s;" in result.stdout and "past CI's gate of 3.1 s" in result.stdout
    earlier, ours = seconds.read_text().split()[1:]
    assert earlier == "1.5" and float(ours) >= 0.2
    seconds.write_text("")  # no earlier run: within the gate
    assert _run_pytest(test, BASIN_TEST_GATE_S="3.1", BASIN_TEST_SECONDS_FILE=str(seconds)).returncode == 0


def test_each_xdist_worker_runs_torch_on_one_thread(tmp_path):
    """The fast tier runs on one pytest-xdist worker per core (README's test command): torch's
    default of a thread per core in each worker oversubscribes the cores (the fast tier took
    332 s with 2 workers, 94 s with 2 workers of one thread each, on 2 cores)."""
    test = tmp_path / "test_threads.py"
    test.write_text("import torch\ndef test_one_thread():\n    assert torch.get_num_threads() == 1\n")
    result = _run_pytest(test, "-n", "2")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-2000:]
