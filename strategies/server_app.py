"""Basin's ServerApp: validated config → strategy → rounds → central evaluation → results.

One round: the strategy samples a seeded cohort and sends the global model with the
round's client config (lr_t = lr · lr-decay^(t−1), local epochs, batch size, …); replies
are aggregated in partition order; the new global model is evaluated on the central
test set; one row is appended to ``results.csv``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from clients.models import build_model, resolve_model_name
from clients.training import evaluate, select_device
from partitions import load_dataset
from strategies.config import cohort_size, validate_run_config
from strategies.registry import build_strategy
from strategies.results import RunRecorder
from strategies.sampling import discover_partitions

app = ServerApp()


def output_directory(config: dict[str, Any], run_id: int) -> Path:
    if config["output-dir"]:
        return Path(config["output-dir"]).expanduser().resolve()
    return Path.home() / "basin-runs" / str(run_id)


def round_train_config(config: dict[str, Any], server_round: int) -> ConfigRecord:
    """What clients receive with round ``server_round`` (1-based)."""
    return ConfigRecord({
        "lr": config["lr"] * config["lr-decay"] ** (server_round - 1),
        "local-epochs": config["local-epochs"],
        "batch-size": config["batch-size"],
        "momentum": config["momentum"],
        "weight-decay": config["weight-decay"],
        "grad-clip": config["grad-clip"],
        "seed": config["seed"],
    })


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = validate_run_config(context.run_config)
    recorder = RunRecorder(
        output_directory(config, context.run_id), config, config["summary-last-k"], config["target-accuracy"]
    )
    try:
        run(grid, config, recorder)
    except BaseException as error:
        recorder.fail(error)
        raise
    summary = recorder.complete()
    print(f"[basin] completed: {summary}", flush=True)


def run(grid: Grid, config: dict[str, Any], recorder: RunRecorder) -> None:
    """Run all rounds, writing one results row per round."""
    device = select_device(config["device"])
    data = load_dataset(config["dataset"], config["data-dir"])
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    torch.manual_seed(config["seed"])
    model = build_model(resolve_model_name(config["model"], config["dataset"]), data.input_shape, data.num_classes)
    arrays = ArrayRecord(model.state_dict())
    model.to(device)

    strategy = build_strategy(config)
    strategy.bind_partitions(
        discover_partitions(grid, config["num-clients"], config["round-timeout"]), cohort_size(config), config["seed"]
    )
    for server_round in range(1, config["num-rounds"] + 1):
        started = time.perf_counter()
        train_config = round_train_config(config, server_round)
        replies = grid.send_and_receive(
            strategy.configure_train(server_round, arrays, train_config, grid), timeout=config["round-timeout"]
        )
        aggregated, metrics = strategy.aggregate_train(server_round, replies)
        if aggregated is not None:
            arrays = aggregated
        model.load_state_dict(arrays.to_torch_state_dict())
        test_loss, test_accuracy = evaluate(model, x_test, y_test)
        metrics = metrics or {}
        recorder.append({
            "round": server_round,
            "lr": train_config["lr"],
            "test-accuracy": test_accuracy,
            "test-loss": test_loss,
            "train-loss": metrics.get("train-loss", float("nan")),
            "local-steps": metrics.get("local-steps", float("nan")),
            "round-seconds": time.perf_counter() - started,
            **strategy.round_clients,
        })
        print(
            f"[basin] round {server_round}/{config['num-rounds']} accuracy {test_accuracy:.4f} "
            f"loss {test_loss:.4f} ({time.perf_counter() - started:.2f} s)",
            flush=True,
        )
    torch.save(arrays.to_torch_state_dict(), recorder.directory / "final_model.pt")
