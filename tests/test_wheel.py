"""Basin as a package in someone else's environment: its wheel, installed (not editable)
into a fresh environment, runs examples/ima-quickstart with IMA outside the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_basins_wheel_in_a_fresh_environment_runs_the_example_app_with_ima(tmp_path):
    """A missing package file, a data file left out of the wheel, or an import of the
    checkout's folders fails here. The fresh environment sees the test environment's
    packages (torch, Flower, …) through a path file, not its editable Basin: a path file's
    folders are added to sys.path, but their own path files are not read."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("basin-*.whl"))
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    packages = Path(subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip())
    (packages / "test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # Basin's wheel, and Flower's (for its commands, whose scripts must start this environment's
    # Python; pip would see the test environment's Flower as installed already).
    for requirement in (str(wheel), f"flwr=={version('flwr')}"):
        subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--quiet",
                        "--no-deps", "--ignore-installed", requirement], check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(REPO / "examples" / "ima-quickstart", elsewhere / "ima-quickstart",
                    ignore=shutil.ignore_patterns("flwr.log", "__pycache__"))
    clean = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["PATH"] = f"{env / 'bin'}{os.pathsep}{clean['PATH']}"
    where = subprocess.run([str(env / "bin" / "python"), "-c", "import strategies, experiments; "
                            "print(strategies.__file__, experiments.__file__)"],
                           cwd=elsewhere, env=clean, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(Path(path).is_relative_to(packages) for path in where.stdout.split()), where.stdout
    run = subprocess.run([str(env / "bin" / "python"), "ima-quickstart/run.py", "--run-config",
                          "num-server-rounds=3 avg-start=2 window=2", "--num-supernodes", "2"],
                         cwd=elsewhere, env=clean, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "IMA's model after the last round" in run.stdout + run.stderr
