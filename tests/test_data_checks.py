"""Data problems are errors before any Flower or Ray process starts (launcher, sweep, --list)."""

from __future__ import annotations

import subprocess
import sys

from experiments import sweep as sweep_module
from partitions.availability import data_problem


def test_complete_missing_and_truncated_files_are_told_apart(tiny_fashion_mnist, tmp_path):
    assert data_problem("fashion-mnist", str(tiny_fashion_mnist)) is None
    assert "does not exist" in data_problem("fashion-mnist", str(tmp_path / "nowhere"))
    images = tiny_fashion_mnist / "train-images-idx3-ubyte.gz"
    complete = images.read_bytes()
    images.write_bytes(complete[:-40])  # a download cut short
    problem = data_problem("fashion-mnist", str(tiny_fashion_mnist) + "/")
    assert problem is not None and str(images) in problem and "truncated" in problem
    images.write_bytes(complete)
    (tiny_fashion_mnist / "t10k-labels-idx1-ubyte.gz").unlink()
    assert "t10k-labels-idx1-ubyte[.gz] is missing" in data_problem("fashion-mnist", str(tiny_fashion_mnist / "."))


def test_an_unreachable_hub_set_is_named_and_a_local_copy_is_accepted(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    problem = data_problem("hf:basin-tests/no-such-set")
    assert "hub data set 'basin-tests/no-such-set'" in problem and "local cache" in problem
    from miniature import cifar100_like

    assert data_problem(f"hf:{cifar100_like(tmp_path / 'copy')}") is None  # a local copy: decoded once, accepted


def test_the_launcher_refuses_missing_data_before_starting_flower(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--set", "dataset=fashion-mnist",
         "--set", f"data-dir={tmp_path / 'nowhere'}", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert f"{tmp_path / 'nowhere'} does not exist" in result.stderr and "'dataset'" in result.stderr
    assert "SuperLink" not in result.stdout + result.stderr and not (tmp_path / "out").exists()


def test_a_sweep_without_its_data_is_refused_and_list_marks_the_runs(tmp_path, capsys):
    sweep_file = tmp_path / "s.toml"
    sweep_file.write_text(f'[set]\ndataset = "fashion-mnist"\ndata-dir = "{tmp_path / "nowhere"}"\n'
                          "num-clients = 4\nparticipation = 0.5\n[grid]\nseed = [0, 1]\n")
    assert sweep_module.main([str(sweep_file), "--out", str(tmp_path / "out")]) == 2
    assert "2 of 2 runs cannot load their data" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert sweep_module.main([str(sweep_file), "--out", str(tmp_path / "out"), "--list"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("unavailable") == 2 and "does not exist" in captured.err
    # each run's estimate (4 clients, 2 a round, 60,000 / 4 examples: 300 batches of 32 … on digits' defaults)
    assert captured.out.count("on 2 CPU cores; GPU not measured") == 2 and "all 2 estimated runs: ≈" in captured.out
