"""Progress written to a file (experiments/runtime/progress.py): whole lines, no redraws (a
real run's, launched from the command line with its output in a file: tests/test_tracking.py)."""

from __future__ import annotations

import io
import subprocess
import sys

from experiments.runtime import progress
from experiments.runtime.run_config import APP_DIR


class NotATerminal(io.StringIO):
    def isatty(self) -> bool:
        return False


def _lines(monkeypatch, interval: float) -> str:
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", interval)
    out = NotATerminal()
    bar = progress.progress_bar(total=6, desc="run", unit="round", file=out)
    for _ in range(6):
        bar.update(1)
    bar.close()
    return out.getvalue()


def test_a_bar_written_to_a_file_is_whole_lines_at_most_one_per_interval(monkeypatch):
    every = _lines(monkeypatch, 0.0)  # rounds slower than the interval: a line for each
    assert "\r" not in every and every.endswith("\n")
    lines = every.splitlines()
    assert lines[0].startswith("run:   0% 0/6") and [line[5:13] for line in lines[1:7]] == [
        " 17% 1/6", " 33% 2/6", " 50% 3/6", " 67% 4/6", " 83% 5/6", "100% 6/6"]
    fast = _lines(monkeypatch, 3600.0).splitlines()  # faster: the first line and the last
    assert len(fast) == 2 and fast[-1].startswith("run: 100% 6/6")


def test_a_terminal_still_gets_tqdms_bar():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress.progress_bar(total=2, file=Terminal())
    assert type(bar).__name__ == "tqdm"
    bar.close()


def test_a_python_without_the_dependencies_is_told_to_use_the_environment_in_one_line(tmp_path):
    """The system's python instead of .venv/bin/python: a command says it in one line, exit 2,
    no traceback; an import from Python raises ModuleNotFoundError with that line (no SystemExit)."""
    import os

    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pandas'] = None\n")  # as if not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(APP_DIR)])}
    done = subprocess.run([sys.executable, "-m", "experiments.run", "--help"], cwd=APP_DIR, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "lacks Basin's dependencies (pandas)" in done.stderr and ".venv/bin/python -m experiments.<tool>" in done.stderr
    code = ("try:\n    import experiments.api\nexcept ModuleNotFoundError as error:\n    print('raised:', error)\n"
            "except SystemExit:\n    print('exited')\n")
    imported = subprocess.run([sys.executable, "-c", code], cwd=APP_DIR, env=env, capture_output=True, text=True, timeout=60)
    assert imported.stdout.startswith("raised: this Python") and "lacks Basin's dependencies (pandas)" in imported.stdout
