"""``python -m experiments.gpu_check``: its dry run on the CPU runs every step (tiny), and
its table says what each gave; bad arguments are refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_idx

from experiments import gpu_check
from experiments.runtime.run_config import APP_DIR
from partitions.datasets import IDX_STEMS, fashion_mnist_files, read_idx


def test_help_documents_the_one_command():
    done = subprocess.run([sys.executable, "-m", "experiments.gpu_check", "--help"], capture_output=True, text=True,
                          cwd=APP_DIR, timeout=60)
    assert done.returncode == 0
    for words in ("--data-dir", "--device", "11 minutes", "81.17", "84.68", "--processes", "dry run"):
        assert words in done.stdout


def _with_a_smaller_test_set(source: Path, folder: Path, count: int) -> Path:
    """Fashion-MNIST's training files as they are (the setup's 100 shard clients need all
    60,000 images) and the first ``count`` of its test images and labels."""
    folder.mkdir()
    for stem, path in zip(IDX_STEMS, fashion_mnist_files(str(source))):
        if stem.startswith("train"):
            (folder / path.name).symlink_to(path)
        else:
            write_idx(folder / f"{stem}.gz", read_idx(path)[:count])
    return folder


@pytest.mark.slow
def test_the_dry_run_on_the_cpu_runs_every_step_and_writes_its_table(fashion_mnist_dir, tmp_path, capsys):
    # Each round's central evaluation of 10,000 test images took most of the dry run's rounds
    # on 2 cores (2-5 s a round against 0.3-0.5 s of training); 1,000 do here.
    data = _with_a_smaller_test_set(fashion_mnist_dir, tmp_path / "fashion-mnist", 1000)
    assert gpu_check.main(["--data-dir", str(data), "--device", "cpu", "--out", str(tmp_path / "check")]) == 0
    report = json.loads((tmp_path / "check" / "gpu-check.json").read_text())
    checks = [row["check"] for row in report["rows"]]
    assert checks == ["gpu-marked tests", "benchmark: eager steps", "same bits, 2 vs 1 client processes",
                      "IMA FMNIST #C=2: FedAvg", "IMA FMNIST #C=2: FedAvg + IMA"]
    assert all(row["ok"] for row in report["rows"]) and report["dry-run"] and report["complete"]
    rows = {row["check"]: row for row in report["rows"]}
    assert rows["same bits, 2 vs 1 client processes"]["result"].startswith("identical (3 rounds")
    assert rows["IMA FMNIST #C=2: FedAvg + IMA"]["paper"] == 84.68 and 0 <= rows["IMA FMNIST #C=2: FedAvg"]["accuracy"] <= 100
    assert rows["benchmark: eager steps"]["ratio"] > 0
    out = capsys.readouterr().out
    assert "same bits, 2 vs 1 client processes  yes" in out and "gpu-check.json" in out


def test_a_check_stopped_midway_keeps_the_steps_it_finished(fashion_mnist_dir, tmp_path, monkeypatch):
    """On the H100 the whole check outran a 10-minute command limit during its last step
    and left no table at all: each finished step's rows are on disk before the next starts."""
    monkeypatch.setattr(gpu_check, "check_tests", lambda: {"check": "gpu-marked tests", "ok": True, "result": "1 passed"})

    def stopped(*_):
        raise KeyboardInterrupt  # what a time limit's SIGTERM becomes (experiments.runtime.cli.guarded)

    monkeypatch.setattr(gpu_check, "check_pair", stopped)
    arguments = ["--data-dir", str(fashion_mnist_dir), "--device", "cpu", "--out", str(tmp_path),
                 "--skip", "benchmark", "--skip", "determinism"]
    assert gpu_check.main(arguments) == 130
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert report["complete"] is False
    assert [(row["check"], row["ok"]) for row in report["rows"]] == [("gpu-marked tests", True)]


@pytest.mark.parametrize("arguments, message", [
    (["--processes", "8"], "--processes '8' is not allowed"),
    (["--pair-rounds", "0", "--device", "cpu"], "allowed: integers >= 1"),
])
def test_bad_arguments_are_refused_in_one_line(fashion_mnist_dir, tmp_path, capsys, arguments, message):
    assert gpu_check.main(["--data-dir", str(fashion_mnist_dir), "--out", str(tmp_path / "x"), *arguments]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
