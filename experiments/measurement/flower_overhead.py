"""A Flower run timed against the bare training loop (``.venv/bin/python -m
experiments.benchmark``, its default mode): the same rounds, cohorts and local training
without Flower, in this process, then as a real ``flwr run``; the ratio is what Flower costs.
Its command line (experiments/benchmark.py) answers ``--help`` and usage errors before this
module imports torch and Flower.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from flwr.app import RecordDict

from clients.client_info import ClientInfo
from clients.data import client_tensors
from clients.local_round import LocalRound, round_randomness
from clients.log import log
from clients.memory_format import memory_format
from clients.models import build_run_model, resolve_model_name
from clients.training import evaluate, select_device
from experiments.runtime.cli import UsageError
from experiments.runtime.launch import launch
from experiments.runtime.machine import check_machine, client_resources, machine_cpus
from experiments.runtime.mps import MpsDaemon, check_mps
from experiments.runtime.output_dir import OutputLock, create_output_dir, unique_output_dir
from experiments.runtime.run_config import default_run_config, load_preset, parse_overrides, resolve_config
from experiments.runtime.run_endings import RunFailed
from partitions import load_dataset
from strategies.cohort import cohort_size
from strategies.config import ConfigError
from strategies.methods.registry import hand_over_client_halves
from strategies.methods.strategy_builder import build_client_schedule
from strategies.sampling import CohortSampling
from strategies.server_work import round_train_config


@dataclasses.dataclass
class BareRun:
    """What the bare loop measured."""

    round_seconds: list[float]  # per round: client training, aggregation and evaluation
    round_steps: list[int]  # per round: Σ local steps of the cohort
    peak_gpu_mib: float | None


def benchmark_config(preset: str, overrides: dict[str, Any], rounds: int, no_preset: str) -> dict[str, Any]:
    """The validated run config: preset (``no_preset``: none), IMA from 75 % of the rounds,
    --set, then --rounds (IMA's window capped at --rounds)."""
    layers = [{} if preset == no_preset else load_preset(preset),
              {"averaging": "ima", "avg-start": max(1, round(0.75 * rounds))}, overrides]
    window = next((layer["window"] for layer in reversed(layers) if "window" in layer), default_run_config()["window"])
    config = resolve_config(*layers, {"num-rounds": rounds, "window": min(window, rounds)})
    if config["strategy"] != "fedavg":
        raise ConfigError(f"strategy = {config['strategy']!r}: the bare reference loop trains FedAvg clients; "
                          "allowed: 'fedavg' (with any averaging)")
    load_dataset(config["dataset"], config["data-dir"])  # missing data fails here, before Flower starts
    return config


def config_of(args) -> dict[str, Any]:
    """The validated run config of the command line (``--preset``, ``--set``, ``--device``, ``--rounds``)."""
    if args.rounds < 1:
        raise UsageError(f"--rounds: {args.rounds} is not allowed; allowed: an integer >= 1")
    overrides = parse_overrides(args.set + ([f"device={args.device}"] if args.device else []))
    return benchmark_config(args.preset or args.default_preset, overrides, args.rounds, args.no_preset)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_bare(config: dict[str, Any]) -> BareRun:
    """The Flower run's client work, aggregation and evaluation, sequentially in this process."""
    hand_over_client_halves()
    device = select_device(config["device"])
    data = load_dataset(config["dataset"], config["data-dir"], config["normalize"])
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    torch.manual_seed(config["seed"])  # the ServerApp's initial model
    global_state = {k: v.to(device) for k, v in build_run_model(config, data.input_shape, data.num_classes).state_dict().items()}
    layout = memory_format(resolve_model_name(config["model"], config["dataset"]), device.type)
    model = build_run_model(config, data.input_shape, data.num_classes).to(device).to(memory_format=layout)
    schedule = build_client_schedule(config)
    sampler = CohortSampling()
    sampler.bind_partitions({p: p for p in range(config["num-clients"])}, cohort_size(config), config["seed"])
    config_items = tuple(sorted(config.items()))
    client_states: defaultdict[int, RecordDict] = defaultdict(RecordDict)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run = BareRun([], [], None)
    for server_round in range(1, config["num-rounds"] + 1):
        synchronize(device)
        started = time.perf_counter()
        round_config = round_train_config(config, schedule, server_round, data.black)
        round_config["server-round"] = server_round  # Flower's strategy adds it to every message
        content = RecordDict({"config": round_config})
        sums = {key: torch.zeros_like(value, dtype=torch.float32) for key, value in global_state.items()}
        examples, steps = [], []
        for partition_id in sampler.sample_partitions(server_round):
            x, y, _, _ = client_tensors(config_items, partition_id, config["num-clients"], str(device), layout)
            model.load_state_dict(global_state)
            generator, rng = round_randomness(config["seed"], server_round, partition_id)
            client = ClientInfo.of(y, data.num_classes, partition_id, config["dataset"], server_round)
            local_round = LocalRound(model, content, client_states[partition_id], rng, client)
            result = local_round.train(model, x, y, generator)
            local_round.finish(model, result)
            for key, value in model.state_dict().items():
                sums[key].add_(value.float(), alpha=result.num_examples)
            examples.append(result.num_examples)
            steps.append(result.num_steps)
        global_state = {key: (sums[key] / sum(examples)).to(value.dtype) for key, value in global_state.items()}
        model.load_state_dict(global_state)
        evaluate(model, x_test, y_test)
        synchronize(device)
        run.round_seconds.append(time.perf_counter() - started)
        run.round_steps.append(sum(steps))
    if device.type == "cuda":
        run.peak_gpu_mib = torch.cuda.max_memory_allocated(device) / 2**20
    return run


def window_figures(rows: pd.DataFrame, bare: BareRun, first_round: int) -> dict[str, Any] | None:
    """Throughput and overhead over rounds first_round … N (None when that leaves no round)."""
    selected = rows["round"] >= first_round
    if not selected.any():
        return None
    flower_steps = float(rows["client-steps"][selected].sum())
    bare_steps = sum(bare.round_steps[first_round - 1:])
    flower_seconds = float(rows["round-seconds"][selected].sum())
    bare_seconds = sum(bare.round_seconds[first_round - 1:])
    overhead = (rows["train-seconds"] - rows["client-seconds"])[selected]
    return {
        "rounds": f"{first_round}-{int(rows['round'].max())}",
        "flower-seconds": flower_seconds, "bare-seconds": bare_seconds,
        "flower-steps-per-second": flower_steps / flower_seconds, "bare-steps-per-second": bare_steps / bare_seconds,
        "throughput-ratio": (flower_steps / flower_seconds) / (bare_steps / bare_seconds),
        "overhead-mean-seconds": float(overhead.mean()), "overhead-median-seconds": float(overhead.median()),
    }


def report(config: dict[str, Any], rows: pd.DataFrame, launch_seconds: float, bare: BareRun,
           resources, device: torch.device, startup_stages: dict[str, float], bare_graph: BareRun | None = None,
           mps: bool = False) -> dict[str, Any]:
    """All figures as one JSON-able dict (``startup_stages``: when each start-up stage of the
    Flower run began, seconds after its launch; ``bare_graph``: the bare loop with
    graph-replayed steps, on CUDA)."""
    flower_steps = rows["client-steps"].tolist()
    gpu_mib = rows["client-gpu-mib"].max()
    return {
        "client-steps": {"flower": float(sum(flower_steps)), "bare": sum(bare.round_steps),
                         "per-round-agree": flower_steps == bare.round_steps},
        "all-rounds": window_figures(rows, bare, 1),
        "excluding-round-1": window_figures(rows, bare, 2),
        "flower-startup-seconds": launch_seconds - float(rows["round-seconds"].sum()),
        "flower-launch-seconds": launch_seconds,
        "flower-startup-stages": startup_stages,
        "peak-gpu-mib": {"flower-client": None if math.isnan(gpu_mib) else float(gpu_mib), "bare": bare.peak_gpu_mib},
        "per-round": {"flower-round-seconds": rows["round-seconds"].tolist(),
                      "flower-overhead-seconds": (rows["train-seconds"] - rows["client-seconds"]).tolist(),
                      "bare-round-seconds": bare.round_seconds, "bare-steps": bare.round_steps},
        "bare-graph-steps-per-second": None if bare_graph is None else sum(bare_graph.round_steps) / sum(bare_graph.round_seconds),
        "config": config, "device": str(device), "torch": torch.__version__, "cpu-count": os.cpu_count(),
        "torch-threads": torch.get_num_threads(), "resources": dataclasses.asdict(resources), "mps": mps,
        "flower-client-processes": client_processes(config, resources, device),
    }


def client_processes(config: dict[str, Any], resources, device: torch.device) -> int:
    """How many client processes the Flower run trains with at once: the cohort, at most
    what the CPU cores (``num_cpus`` each) or the GPU share (``num_gpus`` each) allow."""
    cohort = cohort_size(config)
    if device.type == "cuda" and resources.num_gpus > 0:
        return min(cohort, max(1, int(1 / resources.num_gpus)))
    return min(cohort, max(1, machine_cpus() // max(1, int(resources.num_cpus))))


def print_report(figures: dict[str, Any]) -> None:
    config, steps = figures["config"], figures["client-steps"]
    print(f"{config['dataset']} / {resolve_model_name(config['model'], config['dataset'])}: {config['num-clients']} "
          f"clients × {config['participation']:g}, {config['local-epochs']} local epochs, batch {config['batch-size']}, "
          f"averaging {config['averaging']}, {config['num-rounds']} rounds on {figures['device']}")
    print(f"client steps: flower {steps['flower']:g}, bare {steps['bare']}")
    if not steps["per-round-agree"]:
        print("WARNING: Flower's per-round client steps differ from the bare loop's: the runs did different work "
              "(cohorts or data); the throughput ratio is not comparable", file=sys.stderr)
    windows = [w for w in (figures["all-rounds"], figures["excluding-round-1"]) if w]
    print(f"{'':26}" + "".join(f"{'rounds ' + w['rounds']:>14}" for w in windows))
    for label, key, fmt in [("flower steps/s", "flower-steps-per-second", ".1f"),
                            ("bare steps/s", "bare-steps-per-second", ".1f"),
                            ("flower / bare", "throughput-ratio", ".2f"),
                            ("overhead mean s/round", "overhead-mean-seconds", ".3f"),
                            ("overhead median s/round", "overhead-median-seconds", ".3f")]:
        print(f"{label:26}" + "".join(f"{w[key]:>14{fmt}}" for w in windows))
    for prefix, key, digits, unit in [("throughput ratio (flower / bare)", "throughput-ratio", 2, ""),
                                      ("flower overhead per round", "overhead-mean-seconds", 3, " s")]:
        steady = f"; {windows[1][key]:.{digits}f}{unit} excluding round 1" if len(windows) > 1 else ""
        print(f"{prefix}: {windows[0][key]:.{digits}f}{unit} (all rounds{steady})")
    processes = figures["flower-client-processes"]
    if processes > 1:  # like with like: the bare loop is one process
        ratio = windows[-1]["throughput-ratio"]
        print(f"the Flower run trains with {processes} client processes at once, the bare loop with one: "
              f"{ratio / processes:.2f}x the bare loop per client process ({windows[-1]['rounds']})")
    if figures["bare-graph-steps-per-second"] is not None:
        eager = figures["all-rounds"]["bare-steps-per-second"]
        graph = figures["bare-graph-steps-per-second"]
        print(f"bare loop with CUDA-graph steps: {graph:.1f} steps/s ({graph / eager:.2f}x the eager bare loop)")
    print(f"flower startup: {figures['flower-startup-seconds']:.1f} s (launch wall time − Σ round-seconds, once per run)")
    stages = figures["flower-startup-stages"]
    print("startup stages, seconds after the launch: " + ", ".join(f"{stage} {at:.1f}" for stage, at in stages.items()))
    gpu = figures["peak-gpu-mib"]
    if gpu["bare"] is not None:
        client = "n/a" if gpu["flower-client"] is None else f"{gpu['flower-client']:.0f}"
        print(f"peak GPU MiB: flower client process {client}, bare loop {gpu['bare']:.0f}")


def run_command(args) -> int:
    """Validate, measure the bare loop, then the Flower run (see the module docstring)."""
    config = config_of(args)
    resources = client_resources([config], args.cpus_per_client, args.gpus_per_client)
    check_machine([config], resources)
    check_mps(args.mps)
    device = select_device(config["device"])
    out_dir = create_output_dir(args.out) if args.out else unique_output_dir(Path("runs"), "benchmark")

    with OutputLock(out_dir), MpsDaemon(args.mps) as mps:
        # First, on a quiet machine (not beside Ray's shutdown), and before this process
        # could connect to MPS: the bare loop with eager steps (the baseline of the ratios)
        # and, on CUDA, with graph-replayed steps.
        bare = run_bare({**config, "cuda-graphs": False})
        bare_graph = run_bare({**config, "cuda-graphs": True}) if device.type == "cuda" else None
        if device.type == "cuda":
            torch.cuda.empty_cache()  # leave the GPU to the Flower clients
        if mps.message:
            log.warning(mps.message)
        started = time.perf_counter()
        try:
            summary = launch(config, out_dir / "flower", resources, progress=sys.stderr.isatty(), label="flower")
        except RunFailed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        launch_seconds = time.perf_counter() - started
        rows = pd.read_csv(out_dir / "flower" / "results.csv")
        figures = report({**config, "output-dir": str(out_dir / "flower")}, rows, launch_seconds, bare, resources, device,
                         summary["startup-stages"], bare_graph, mps.active)
        print_report(figures)
        (out_dir / "benchmark.json").write_text(json.dumps(figures, indent=2))
    print(f"results: {out_dir / 'benchmark.json'}")
    return 0


