"""``experiments.benchmark --startup``: how long a user waits before round 1, stage by stage.

Times two user commands as a user runs them, each ``repeats`` times in a fresh process,
one after another: the *start-up command* (:data:`STARTUP_ARGS`: 100 clients, 10 per
round, 10 rounds of the embedded digits) and the *main job* (``python -m
experiments.run``: FedAvg, +IMA, +WIMA, 30 rounds each). For each run it reads the
stages from the files the run leaves (``summary.json``: when ``flwr run`` started, when
each start-up stage began as seen in Flower's log, when training started and the
ServerApp ended; ``results.csv``: each round's seconds), and prints the medians:

- the timeline, seconds after the command started: the launcher's first line (its
  imports and checks), ``flwr run`` started, each Flower stage, round 1 sent, round 1
  done, the last round done, the command's exit;
- the command's wall time, Σ round-seconds, and the start-up: wall − Σ round-seconds.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clients.log import log
from experiments.runtime.flower_log import STARTUP_STAGES
from experiments.runtime.run_config import APP_DIR

STARTUP_ARGS = ("--set", "num-clients=100", "--set", "participation=0.1", "--set", "num-rounds=10",
                "--set", "min-partition-size=1", "--set", "alpha=1.0")
MAIN_JOB_ARGS: tuple[str, ...] = ()
# The timeline's rows, in order: the launcher's, Flower's stages (flower_log.py), the rounds', the end.
TIMELINE = ("launcher's first line", "flwr run started", *(name for _, name in STARTUP_STAGES if name != "resuming from "
            "the checkpoint"), "round 1 done", "last round done", "command exited")


def time_command(args: tuple[str, ...], out_dir: Path) -> dict[str, Any]:
    """Run ``.venv/bin/python -m experiments.run ARGS --out OUT_DIR`` and return its figures: wall
    seconds, Σ round-seconds, start-up seconds, and per run the timeline (seconds after
    the command started)."""
    started = time.time()
    process = subprocess.Popen([sys.executable, "-m", "experiments.run", *args, "--out", str(out_dir)], cwd=APP_DIR,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_line, output = None, []
    assert process.stdout is not None
    for line in process.stdout:
        first_line = first_line if first_line is not None else time.time() - started
        output.append(line)
    code = process.wait()
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"`.venv/bin/python -m experiments.run {' '.join(args)}` exited with {code}:\n{''.join(output[-20:])}")
    run_dirs = sorted({path.parent for path in out_dir.rglob("summary.json") if (path.parent / "results.csv").is_file()},
                      key=lambda path: json.loads((path / "summary.json").read_text())["started-at"])
    runs = [run_timeline(run_dir, started) for run_dir in run_dirs]
    runs[0]["launcher's first line"] = first_line
    runs[-1]["command exited"] = wall
    rounds = sum(run["rounds-seconds"] for run in runs)
    return {"wall-seconds": wall, "round-seconds": rounds, "startup-seconds": wall - rounds, "runs": runs}


def run_timeline(run_dir: Path, command_started: float) -> dict[str, Any]:
    """One run's timeline (seconds after ``command_started``) and its Σ round-seconds."""
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(run_dir / "results.csv", newline="") as f:
        round_seconds = [float(row["round-seconds"]) for row in csv.DictReader(f)]
    launched = summary["training-started-at"] - summary["startup-seconds"]
    timeline: dict[str, Any] = {"flwr run started": launched - command_started}
    timeline.update({stage: launched + seconds - command_started for stage, seconds in summary["startup-stages"].items()})
    timeline["round 1 done"] = summary["training-started-at"] + round_seconds[0] - command_started
    timeline["last round done"] = summary["started-at"] + summary["wall-seconds"] - command_started
    timeline["rounds-seconds"] = sum(round_seconds)
    timeline["round-1-seconds"] = round_seconds[0]
    return timeline


def median_figures(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure and per timeline row of the first run, the median over the repetitions."""
    def median(values: list[float | None]) -> float | None:
        present = [value for value in values if value is not None]
        return statistics.median(present) if present else None

    figures = {key: median([m[key] for m in measurements]) for key in ("wall-seconds", "round-seconds", "startup-seconds")}
    first_runs = [m["runs"][0] | {"command exited": m["wall-seconds"]} for m in measurements]
    figures["round-1-seconds"] = median([run["round-1-seconds"] for run in first_runs])
    figures["timeline"] = {row: median([run.get(row) for run in first_runs]) for row in TIMELINE}
    return figures


def startup_command(args) -> int:
    """``--startup``: time the start-up command and the main job ``args.startup`` times each."""
    from experiments.runtime.output_dir import create_output_dir, unique_output_dir

    out = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), "benchmark-startup")
    results: dict[str, Any] = {"repeats": args.startup}
    for name, command_args in (("startup-command", STARTUP_ARGS), ("main-job", MAIN_JOB_ARGS)):
        measurements = []
        for repeat in range(args.startup):
            log.info(f"{name} {repeat + 1}/{args.startup}: .venv/bin/python -m experiments.run {' '.join(command_args)}")
            measurements.append(time_command(command_args, out / f"{name}-{repeat + 1}"))
            print(f"        wall {measurements[-1]['wall-seconds']:.1f} s, rounds {measurements[-1]['round-seconds']:.1f} s, "
                  f"start-up {measurements[-1]['startup-seconds']:.1f} s", flush=True)
        results[name] = {"measurements": measurements, "median": median_figures(measurements)}
    (out / "benchmark-startup.json").write_text(json.dumps(results, indent=2))
    print_startup_report(results)
    print(f"figures: {out / 'benchmark-startup.json'}")
    return 0


def print_startup_report(results: dict[str, Any]) -> None:
    startup, main_job = results["startup-command"]["median"], results["main-job"]["median"]
    repeats = results["repeats"]
    print(f"\nstart-up command (.venv/bin/python -m experiments.run {' '.join(STARTUP_ARGS)}), median of {repeats}:")
    print(f"  wall {startup['wall-seconds']:.1f} s = start-up {startup['startup-seconds']:.1f} s (wall − Σ round-seconds) "
          f"+ rounds {startup['round-seconds']:.1f} s (round 1: {startup['round-1-seconds']:.1f} s)")
    print("  timeline, seconds after the command started:")
    for row, seconds in startup["timeline"].items():
        if seconds is not None:
            print(f"    {seconds:6.1f}  {row}")
    print(f"main job (.venv/bin/python -m experiments.run: 3 runs of 30 rounds), median of {repeats}:")
    print(f"  wall {main_job['wall-seconds']:.1f} s = start-up of its runs {main_job['startup-seconds']:.1f} s "
          f"+ rounds {main_job['round-seconds']:.1f} s")
