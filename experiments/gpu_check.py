"""The GPU path, checked in one command: does everything that only runs on a GPU work,
how fast is it, is it reproducible, and does the IMA paper's pair come out?

    .venv/bin/python -m experiments.gpu_check --data-dir /path/to/fashion-mnist            # one H100: about 11 minutes
    .venv/bin/python -m experiments.gpu_check --data-dir /path/to/fashion-mnist --device cpu   # dry run: every step, tiny

In order, each skipped with ``--skip NAME``: ``tests`` (the ``gpu``-marked tests),
``benchmark`` (CUDA graphs off, on, and under MPS against the bare loop), ``determinism``
(two client-process counts, the same bits) and ``pair`` (IMA Table I's Fashion-MNIST #C=2
pair beside the paper's 81.17 / 84.68); ``gpu-check.json`` in ``--out`` after each step.

In detail: docs/command-lines.md (``.venv/bin/python -m experiments.gpu_check``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clients.log import log
from experiments.runtime.cli import UsageError, exit_command, guarded, nonempty_path

STEPS = ("tests", "benchmark", "determinism", "pair")
# IMA (Zhou et al.), Table: Fashion-MNIST, #C = 2, test accuracy % of FedAvg and FedAvg + IMA.
PAPER_PAIR = {"none": 81.17, "ima": 84.68}
PAIR_PRESET = "ima-fmnist-shards"
# --device cpu: what makes every step tiny: the paper's 100 clients (600 images each), 2 a round, 1 epoch.
DRY_SETTINGS = {"num-clients": 100, "participation": 0.02, "local-epochs": 1}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="folder holding Fashion-MNIST's IDX files")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default) or cpu: the dry run, every step tiny")
    parser.add_argument("--out", type=nonempty_path, help="output folder (default runs/gpu-check-<time>)")
    parser.add_argument("--skip", action="append", default=[], choices=STEPS, help="leave a step out (repeatable)")
    parser.add_argument("--bench-rounds", type=int, default=None, help="rounds of each benchmark (default 10; cpu 2)")
    parser.add_argument("--pair-rounds", type=int, default=None, help="rounds of the IMA pair (default 300; cpu 2)")
    parser.add_argument("--processes", default=None, metavar="A,B",
                        help="client process counts compared by the determinism step (default 8,16; cpu 2,1)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return guarded(lambda: check(args))


def _process_counts(args) -> tuple[int, int]:
    text = args.processes or ("2,1" if args.device == "cpu" else "8,16")
    try:
        first, second = (int(part) for part in text.split(","))
    except ValueError:
        first = second = 0
    if min(first, second) < 1:
        raise UsageError(f"--processes {text!r} is not allowed; allowed: two integers >= 1, e.g. 8,16")
    return first, second


def check(args) -> int:
    """Run the steps (see the module docstring); 0 when every step that ran passed."""
    from experiments.runtime.machine import machine_cpus
    from experiments.runtime.output_dir import OutputLock, create_output_dir, unique_output_dir
    from experiments.runtime.ray_cluster import LocalRayCluster
    from experiments.runtime.run_config import load_preset, resolve_config
    from partitions.datasets import load_dataset

    dry = args.device == "cpu"
    bench_rounds = (2 if dry else 10) if args.bench_rounds is None else args.bench_rounds
    pair_rounds = (2 if dry else 300) if args.pair_rounds is None else args.pair_rounds
    processes = _process_counts(args)
    if min(bench_rounds, pair_rounds) < 1:
        raise UsageError("--bench-rounds and --pair-rounds: allowed: integers >= 1")
    base = {**load_preset(PAIR_PRESET), "data-dir": str(args.data_dir.resolve()), "device": args.device,
            **(DRY_SETTINGS if dry else {})}
    resolve_config(base)  # a bad --data-dir or setup fails here, before anything runs
    load_dataset("fashion-mnist", base["data-dir"])
    if not dry:
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: this machine has no usable CUDA device; allowed here: --device cpu")
    out = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), "gpu-check")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    # The dry run's determinism and pair steps share one Ray cluster and its client processes,
    # as a sweep's runs on CPUs do: the pair's two runs each started a Ray of their own, and
    # the dry run took 46 s (pair 17.3 s) instead of 34 s (pair 7.9 s; 2 cores, 2026-12-05).
    # On a GPU each step keeps its own: the pair's two runs at once take the GPU shares sized
    # for two (sweep_runs.shares_one_ray_cluster).
    # Started with the check, its start overlapping the first steps; only where both steps run.
    shared = dry and not {"determinism", "pair"} & set(args.skip)
    with OutputLock(out), LocalRayCluster(shared, machine_cpus(), log_path=out / "ray-cluster.log") as dry_ray:
        for step in STEPS:
            if step in args.skip:
                continue
            log.getChild("gpu-check").info(f"{step} ({time.perf_counter() - started:.0f} s so far)")
            step_started = time.perf_counter()
            if step == "tests":
                new = [check_tests()]
            elif step == "benchmark":
                new = check_benchmarks(base, bench_rounds, out / "benchmark", dry)
            elif step == "determinism":
                new = [check_determinism(base, processes, out / "determinism", dry, dry_ray)]
            else:
                new = check_pair(base, pair_rounds, out / "pair", dry_ray)
            for row in new:
                row["seconds"] = round(time.perf_counter() - step_started, 1)
                log.getChild("gpu-check").info(f"{'passed' if row['ok'] else 'FAILED'}: {row['check']}: {row['result']}")
            rows.extend(new)
            # Written after every step: a check stopped later (a time limit) keeps the steps it finished.
            write_report(out, args.device, started, bench_rounds, pair_rounds, processes, rows, complete=False)
        report = write_report(out, args.device, started, bench_rounds, pair_rounds, processes, rows, complete=True)
    print_table(rows)
    print(f"{report['seconds']:.0f} s in all; table: {out / 'gpu-check.json'}")
    return 0 if all(row["ok"] for row in rows) else 1


def write_report(out: Path, device: str, started: float, bench_rounds: int, pair_rounds: int,
                 processes: tuple[int, int], rows: list[dict[str, Any]], complete: bool) -> dict[str, Any]:
    """``gpu-check.json``: the rows so far; ``complete`` is false until every step ran."""
    from strategies.results import write_json_atomic

    report = {"device": device, "dry-run": device == "cpu", "complete": complete,
              "seconds": round(time.perf_counter() - started, 1), "bench-rounds": bench_rounds,
              "pair-rounds": pair_rounds, "processes": processes, "rows": rows}
    write_json_atomic(out / "gpu-check.json", report)
    return report


def check_tests() -> dict[str, Any]:
    """The gpu-marked tests, in a process of their own (only the modules that mark any: collecting
    the whole suite took half a minute on 2 cores)."""
    repo = Path(__file__).resolve().parents[1]
    modules = sorted(str(path.relative_to(repo)) for path in (repo / "tests").glob("test_*.py")
                     if "mark.gpu" in path.read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *modules],
                          capture_output=True, text=True, cwd=repo)
    lines = (done.stdout or done.stderr).strip().splitlines()
    last = lines[-1].strip("= ") if lines else f"exit code {done.returncode}"
    # the suite's own failures outside a test (tests/conftest.py's leftovers check) say why
    errors = [line.partition("error: ")[2] for line in lines if "error: " in line and not line.startswith("E ")]
    # pytest's exit code 5: nothing collected or everything deselected; skipped tests pass
    return {"check": "gpu-marked tests", "ok": done.returncode in (0, 5), "result": "; ".join([last, *errors])}


def check_benchmarks(base: dict[str, Any], rounds: int, out: Path, dry: bool) -> list[dict[str, Any]]:
    """experiments.benchmark with graphs off, on, and on with MPS (on the CPU: once)."""
    from experiments import benchmark

    variants = [("eager steps", ["--set", "cuda-graphs=false"], False)]
    if not dry:
        variants += [("CUDA graphs", ["--set", "cuda-graphs=true"], False), ("CUDA graphs + MPS", [], True)]
    rows = []
    for index, (label, extra, mps) in enumerate(variants):
        folder = out / f"{index}"
        arguments = ["--preset", PAIR_PRESET, "--rounds", str(rounds), "--device", base["device"], "--out", str(folder),
                     *[item for key in ("data-dir", *(DRY_SETTINGS if dry else {})) for item in ("--set", f"{key}={base[key]}")],
                     *extra, *(["--mps"] if mps else [])]
        code = benchmark.main(arguments)
        path = folder / "benchmark.json"
        if code != 0 or not path.is_file():
            rows.append({"check": f"benchmark: {label}", "ok": False, "result": f"exit code {code}"})
            continue
        figures = json.loads(path.read_text())
        window = figures["excluding-round-1"] or figures["all-rounds"]
        rows.append({
            "check": f"benchmark: {label}", "ok": figures["client-steps"]["per-round-agree"],
            "result": f"{window['flower-steps-per-second']:.0f} client steps/s vs bare eager "
                      f"{window['bare-steps-per-second']:.0f}: {window['throughput-ratio']:.2f}x (rounds "
                      f"{window['rounds']}); overhead {window['overhead-mean-seconds']:.3f} s/round"
                      + ("" if figures.get("mps", True) or not mps else "; MPS did not run (see its message)"),
            "ratio": window["throughput-ratio"],
        })
    return rows


def check_determinism(base: dict[str, Any], processes: tuple[int, int], out: Path, dry: bool,
                      ray_address: str | None = None) -> dict[str, Any]:
    """The same short run with two numbers of client processes, compared bit for bit, one
    after the other on one Ray cluster, as a job's runs go (the second run's own resources
    end the first run's client processes: it starts its own count): ``ray_address``'s, else
    one of its own."""
    from experiments.runtime.launch import launch
    from experiments.runtime.machine import ClientResources, machine_cpus
    from experiments.runtime.ray_cluster import LocalRayCluster
    from experiments.runtime.reproducible import compare_runs
    from experiments.runtime.run_config import resolve_config
    from experiments.runtime.run_endings import RunFailed

    cohort = max(processes)
    num_clients = base["num-clients"] if dry else max(20, cohort)
    config = resolve_config(base, {"num-rounds": 3, "cuda-deterministic": True, "num-clients": num_clients,
                                   "participation": cohort / num_clients})
    folders = []
    out.mkdir(parents=True, exist_ok=True)
    with LocalRayCluster(ray_address is None, machine_cpus(), log_path=out / "ray-cluster.log") as own_ray:
        job_ray = ray_address or own_ray
        for count in processes:
            # On the CPU, n processes: 2/n CPUs each of this machine's 2 (1 → 2 CPUs); on CUDA a GPU share of 1/n.
            resources = ClientResources(max(1.0, 2.0 / count), 0.0) if dry else ClientResources(1.0, 1.0 / count)
            folder = out / f"{count}-processes"
            try:
                launch(config, folder, resources, progress=False, overwrite=True, ray_address=job_ray)
            except RunFailed as error:
                return {"check": f"same bits, {processes[0]} vs {processes[1]} processes", "ok": False,
                        "result": str(error).splitlines()[0]}
            folders.append(folder)
    comparison = compare_runs(*folders)
    result = "identical" if comparison.identical else "; ".join(comparison.differences)
    return {"check": f"same bits, {processes[0]} vs {processes[1]} client processes", "ok": comparison.identical,
            "result": f"{result} ({comparison.rounds} rounds, {comparison.tensors} tensors)"}


def check_pair(base: dict[str, Any], rounds: int, out: Path, ray_address: str | None = None) -> list[dict[str, Any]]:
    """FedAvg and FedAvg + IMA on the IMA paper's Fashion-MNIST #C=2, both at once, on
    ``ray_address``'s Ray cluster, else each run on a Ray of its own."""
    import dataclasses

    from experiments.runtime.machine import client_resources
    from experiments.runtime.run_config import resolve_config
    from experiments.runtime.sweep_definition import load_sweep
    from experiments.runtime.sweep_runs import run_sweep
    from strategies.results import current_summary

    out.mkdir(parents=True, exist_ok=True)
    spec = out / "pair.toml"
    settings = {**base, "num-rounds": rounds, "window": min(resolve_config(base)["window"], rounds)}
    spec.write_text('name = "ima-pair"\n[set]\n'
                    + "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())
                    + '[grid]\naveraging = ["none", "ima"]\n')
    sweep = load_sweep(spec)
    resources = client_resources([run.config for run in sweep.runs], 1.0, None, parallel=2)
    run_sweep(dataclasses.replace(sweep, resources=resources), out, progress=False, ray_address=ray_address, parallel=2)
    rows = []
    for run in sweep.runs:
        averaging = run.config["averaging"]
        label = "FedAvg" if averaging == "none" else "FedAvg + IMA"
        try:
            summary = json.loads((out / "runs" / run.run_id / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        summary = current_summary(summary)
        if summary.get("status") != "completed" or "acc-last-k" not in summary:
            rows.append({"check": f"IMA FMNIST #C=2: {label}", "ok": False,
                         "result": f"run {summary.get('status', 'missing')}: {summary.get('error', '')}"[:300]})
            continue
        accuracy = 100 * summary["acc-last-k"]
        rows.append({"check": f"IMA FMNIST #C=2: {label}", "ok": True,
                     "result": f"{accuracy:.2f} % (last {summary['last-k']} rounds of {summary['rounds']})",
                     "paper": PAPER_PAIR[averaging], "accuracy": accuracy})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    width = max(len(row["check"]) for row in rows) if rows else 10
    print(f"{'check':{width}}  {'ok':4} {'paper':>7}  {'s':>6}  result")
    for row in rows:
        paper = f"{row['paper']:.2f}" if "paper" in row else ""
        print(f"{row['check']:{width}}  {'yes' if row['ok'] else 'NO':4} {paper:>7}  {row.get('seconds', 0):>6.0f}  "
              f"{row['result']}")


if __name__ == "__main__":
    exit_command(main())
