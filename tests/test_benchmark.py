"""The speed benchmark: one small Flower run on the embedded digits against the bare loop."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SMALL_DIGITS = [
    "--set", "dataset=digits", "--set", "model=auto", "--set", "num-clients=4", "--set", "participation=0.5",
    "--set", "local-epochs=1", "--set", "batch-size=32", "--rounds", "3", "--device", "cpu",
]


def parsed(pattern: str, text: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no line matching {pattern!r} in:\n{text}"
    return float(match.group(1))


@pytest.mark.slow
def test_benchmark_compares_a_flower_run_with_the_bare_loop(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.benchmark", *SMALL_DIGITS, "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert parsed(r"^throughput ratio \(flower / bare\): (\d+\.\d+)", result.stdout) > 0
    parsed(r"^flower overhead per round: (-?\d+\.\d+) s", result.stdout)

    figures = json.loads((tmp_path / "benchmark.json").read_text())
    steps = figures["client-steps"]
    # The preset's shards give every client the same data size: 3 rounds x 2 clients x 12 steps.
    assert steps["flower"] == steps["bare"] == 72 and steps["per-round-agree"]
    assert figures["config"]["averaging"] == "ima" and figures["config"]["avg-start"] == 2
    assert figures["all-rounds"]["rounds"] == "1-3" and figures["excluding-round-1"]["rounds"] == "2-3"
    assert figures["flower-startup-seconds"] > 0 and figures["device"] == "cpu"
    assert (tmp_path / "flower" / "results.csv").is_file()
    # When each start-up stage began, in order, as the run's summary.json keeps them too.
    stages = figures["flower-startup-stages"]
    assert list(stages) == ["starting the SuperLink", "starting the simulation", "starting Ray and the client processes",
                            "loading data and building the partition", "discovering clients", "training round 1"]
    assert list(stages.values()) == sorted(stages.values()) and stages["training round 1"] > 0
    assert "startup stages, seconds after the launch: starting the SuperLink" in result.stdout
    assert json.loads((tmp_path / "flower" / "summary.json").read_text())["startup-stages"] == stages
    # Like with like: 2 client processes (cohort 2, 2 cores) against the one-process bare loop.
    assert figures["flower-client-processes"] == 2
    assert "trains with 2 client processes at once, the bare loop with one" in result.stdout


def test_bad_config_fails_before_anything_starts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "experiments.benchmark", *SMALL_DIGITS, "--set", "num-clients=0", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "num-clients" in result.stderr
    assert not (tmp_path / "flower").exists()


@pytest.mark.slow
def test_the_sweep_mode_runs_the_small_grid_one_at_a_time_then_in_parallel(tmp_path, monkeypatch, capsys):
    """The plumbing of ``--sweep`` (each pass stands in for a real sweep here: the real
    sweep machinery and its --parallel are tested in tests/test_sweep.py)."""
    import pandas as pd

    import experiments.runtime.sweep_runs
    from experiments import benchmark

    passes = []

    def fake_run_sweep(sweep, out_dir, progress=True, ray_address=None, parallel=1, **_):
        passes.append((out_dir.name, parallel, sweep, ray_address))
        return pd.DataFrame({"run": [r.run_id for r in sweep.runs], "status": ["completed"] * len(sweep.runs)})

    monkeypatch.setattr(experiments.runtime.sweep_runs, "run_sweep", fake_run_sweep)
    code = benchmark.main([*SMALL_DIGITS, "--sweep", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert [(name, parallel) for name, parallel, *_ in passes] == [("one-at-a-time", 1), ("parallel-2", 2)]
    assert passes[0][3] is not None and passes[1][3] is None  # one after another: one Ray cluster, as the sweep
    configs = {run.run_id: run.config for run in passes[0][2].runs}
    assert sorted((c["partition"], c["averaging"]) for c in configs.values()) == [
        ("dirichlet", "ima"), ("dirichlet", "none"), ("shards", "ima"), ("shards", "none")]
    assert all(c["num-rounds"] == 3 and c["num-clients"] == 4 and c["dataset"] == "digits" for c in configs.values())
    assert {c["alpha"] for c in configs.values() if c["partition"] == "dirichlet"} == {0.1}
    figures = json.loads((tmp_path / "benchmark-sweep.json").read_text())
    assert figures["runs"] == 4 and figures["parallel"] == 2 and figures["parallel-2"]["completed"] == 4
    assert "runs per hour" in capsys.readouterr().out


def test_the_clients_mode_holds_the_cohort_and_each_clients_work_fixed_across_k(tmp_path):
    """--clients: K clients, --cohort of them a round, every client 300 images at every K;
    bad counts are refused by argparse, a cohort above a count before anything runs."""
    import argparse

    import pytest

    from experiments import benchmark
    from experiments.measurement import many_clients
    from experiments.runtime.cli import UsageError
    from strategies.cohort import cohort_size

    args = benchmark.build_parser().parse_args(["--clients", "100,10000", "--set", "data-dir=/nowhere"])
    assert args.clients == (100, 10000) and args.cohort == 10 and args.preset is None
    args.rounds = 5
    for k in args.clients:
        config = many_clients.resolve_config(many_clients.CLIENTS_SETUP, many_clients.parse_overrides(["data-dir=/nowhere"]),
                                          {"num-clients": k, "participation": 10 / k, "num-rounds": 5})
        assert cohort_size(config) == 10 and config["samples-per-client"] == 300
    assert benchmark.build_parser().parse_args(["--clients"]).clients == benchmark.DEFAULT_CLIENT_COUNTS
    with pytest.raises(argparse.ArgumentTypeError, match="comma-separated integers >= 1"):
        benchmark.client_counts("100,0")
    args.cohort = 200
    with pytest.raises(UsageError, match="--cohort 200 with 100 clients is not allowed"):
        many_clients.clients_config(args, 100)


def test_the_clients_table_gives_each_figure_its_ratio_and_the_memory_growth(capsys):
    from experiments.measurement.many_clients import print_clients_table

    row = {"clients": 100, "wall-seconds": 30.0, "round-1-starts-seconds": 8.0, "round-1-seconds": 6.0,
           "overhead-rounds-2-on-seconds": 0.02, "wall-minus-rounds-seconds": 10.0, "peak-memory-mib": 3500.0}
    print_clients_table([row, {**row, "clients": 10_000, "round-1-starts-seconds": 12.0,
                               "overhead-rounds-2-on-seconds": 0.03, "peak-memory-mib": 3599.0}])
    out = capsys.readouterr().out
    assert "12.0 (1.50x)" in out and "0.030 (1.50x)" in out and "8.0 (1.00x)" in out
    assert "memory K=100 -> 10,000: +1.00 MiB per 100 clients" in out


def test_the_memory_sampler_reads_a_process_proportional_set_size():
    import os

    from experiments.measurement.many_clients import proportional_set_mib

    assert 1 < proportional_set_mib(os.getpid()) < 100_000
    assert proportional_set_mib(2**22 + 12345) == 0.0  # no such process


def _fake_run(run_dir: Path, launched: float, round_seconds: list[float]) -> None:
    """A finished run's summary.json and results.csv as the launcher and ServerApp leave them."""
    run_dir.mkdir(parents=True)
    training = launched + 12.0
    summary = {"started-at": launched + 8.0, "training-started-at": training, "startup-seconds": 12.0,
               "wall-seconds": 4.0 + sum(round_seconds) + 0.5,
               "startup-stages": {"starting the SuperLink": 1.0, "starting the simulation": 4.0,
                                  "starting Ray and the client processes": 7.0,
                                  "loading data and building the partition": 9.0, "discovering clients": 9.5,
                                  "training round 1": 12.0}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    rows = "".join(f"{i + 1},{seconds}\n" for i, seconds in enumerate(round_seconds))
    (run_dir / "results.csv").write_text("round,round-seconds\n" + rows)


def test_the_startup_timeline_is_read_from_what_a_run_leaves_and_its_medians_taken(tmp_path):
    from experiments.measurement.startup_timing import median_figures, run_timeline

    _fake_run(tmp_path / "a", launched=1002.5, round_seconds=[5.0, 0.5, 0.5])
    timeline = run_timeline(tmp_path / "a", command_started=1000.0)
    assert timeline["flwr run started"] == 2.5
    assert timeline["starting the simulation"] == 6.5 and timeline["training round 1"] == 14.5
    assert timeline["round 1 done"] == 19.5  # training started at 14.5, round 1 took 5 s
    assert timeline["last round done"] == 10.5 + 4.0 + 6.0 + 0.5  # the ServerApp's start + its wall time
    assert timeline["rounds-seconds"] == 6.0 and timeline["round-1-seconds"] == 5.0
    measurements = [
        {"wall-seconds": wall, "round-seconds": 6.0, "startup-seconds": wall - 6.0,
         "runs": [{**timeline, "launcher's first line": first, "flwr run started": first + 0.5}]}
        for wall, first in ((30.0, 2.0), (20.0, 3.0), (25.0, 1.0))
    ]
    figures = median_figures(measurements)
    assert figures["wall-seconds"] == 25.0 and figures["startup-seconds"] == 19.0
    assert figures["timeline"]["launcher's first line"] == 2.0 and figures["timeline"]["flwr run started"] == 2.5
    assert figures["timeline"]["command exited"] == 25.0
    assert "resuming from the checkpoint" not in figures["timeline"]  # a fresh command never resumes
    assert list(figures["timeline"])[:2] == ["launcher's first line", "flwr run started"]


def test_the_startup_mode_refuses_no_repeats(capsys):
    from experiments.benchmark import main

    with pytest.raises(SystemExit, match="--startup 0 is not allowed"):
        main(["--startup", "0"])


def test_the_modes_of_every_shipped_method_on_cuda_without_a_gpu():
    """`--methods --modes` runs nothing: every shipped method, with and without crop + flip, and
    the mode its step takes on CUDA; only GradAug is eager, and augmentation is no reason."""
    from strategies.methods.registry import METHODS_BY_NAME

    result = subprocess.run([sys.executable, "-m", "experiments.benchmark", "--methods", "--modes"],
                            capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split(maxsplit=3) for line in result.stdout.splitlines()[1:]]
    assert {(row[0], row[1]) for row in rows} == {(m, a) for m in METHODS_BY_NAME for a in ("none", "crop-flip")}
    eager = [row for row in rows if row[2] != "graph"]
    assert [(row[0], row[2]) for row in eager] == [("gradaug", "eager"), ("gradaug", "eager")]
    assert all("widths" in row[3] and "augment" not in row[3] for row in eager)


def test_the_methods_speed_table_measures_each_method_against_fedavg_in_the_same_run():
    from experiments.measurement.method_speed import speed_table

    table = speed_table(["fedavg", "fedfa", "fedalign"], "resnet20-gn", "cpu", {}, steps=2, progress=False)
    assert list(table["setup"].unique()) == ["fmnist-cnn 1x28x28", "resnet20-gn 3x32x32 + crop-flip"]
    assert (table.loc[table["method"] == "fedavg", "× FedAvg"] == 1.0).all()
    measured = table.dropna(subset=["steps/s"])
    assert (measured["steps/s"] > 0).all() and set(measured["mode"]) == {"eager"}  # the CPU: no graphs
    # FedAlign needs a slimmable residual network: no figures on the CNN, and the reason.
    on_cnn = table[(table["setup"] == "fmnist-cnn 1x28x28") & (table["method"] == "fedalign")].iloc[0]
    assert on_cnn["mode"] == "n/a" and "needs a residual network" in on_cnn["why"]


def test_the_layouts_mode_measures_each_model_in_both_layouts_and_prints_the_ratio(tmp_path, capsys):
    from experiments.benchmark import main

    assert main(["--layouts", "fmnist-cnn,vgg11-gn", "--repeats", "1", "--steps", "1", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["model", "contiguous", "channels-last", "ratio", "used"]
    fmnist, vgg = lines[2].split(), lines[3].split()
    assert fmnist[0] == "fmnist-cnn" and fmnist[-1] == "channels-last" and vgg[-1] == "contiguous"
    assert float(fmnist[3]) == pytest.approx(float(fmnist[2]) / float(fmnist[1]), rel=0.01)
    rows = json.loads((tmp_path / "layouts.json").read_text())
    assert [row["model"] for row in rows] == ["fmnist-cnn", "vgg11-gn"] and len(rows[0]["channels-last"]) == 1
    with pytest.raises(SystemExit, match="--layouts: mlp is not allowed"):
        main(["--layouts", "mlp"])
