"""The work of Basin's ServerApp (strategies/server_app.py): validated config → strategy →
rounds → evaluation → results.

One round: the strategy samples a seeded cohort and sends the global model with the
round's client config (lr_t = lr · lr-decay^(t−1), local epochs, batch size, …); replies
are screened (a client that raised, timed out, or returned non-finite or misshapen
arrays is left out and counted) and aggregated in partition order; the new global model
is evaluated on the central test set (``evaluation = central``) or on the round's sampled
nodes' own test splits (``federated``: strategies/federated_evaluation.py, the server reads
no data set); one row is appended to ``results.csv``. Every
``checkpoint-every`` rounds a checkpoint is written, and a run started again on the same
output directory continues from it (strategies/checkpoint.py); stateful clients snapshot
their state for it (clients/state_store.py). With ``save-models-every`` the round's base,
averaged and client models go to ``models/`` for the analysis tools
(strategies/model_store.py); ``round-indicators`` adds IMA's locality and client CKA to
each row (strategies/indicators.py).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid

from clients import protocol
from clients.arithmetic import arithmetic_record, fix_arithmetic
from clients.data import partition_indices
from clients.log import log
from clients.memory_format import memory_format
from clients.model_names import resolve_model_name
from clients.models import build_run_model
from clients.simulation_engine import simulated_partitions
from clients.state_store import CLIENT_STATE_DIR, discard_snapshots_after, remove_run_snapshots
from clients.training import select_device
from partitions import class_count_table, load_dataset, plot_class_counts
from partitions.datasets import dataset_shape
from partitions.feasibility import check_no_empty_clients, partition_settings
from partitions.stats import partition_notation
from strategies.arrays import to_numpy
from strategies.central_evaluation import CentralEvaluation
from strategies.checkpoint import CHECKPOINT_FILE, read_checkpoint, restore_checkpoint, write_checkpoint
from strategies.cohort import cohort_size
from strategies.config import refuse_buffers_under_dp, summary_horizon, validate_run_config
from strategies.discovery import discover_partitions
from strategies.exchange import TRAFFIC, send_and_receive
from strategies.federated_evaluation import FederatedEvaluation
from strategies.indicators import round_indicators
from strategies.methods.registry import hand_over_client_halves, method
from strategies.methods.strategy_builder import build_client_schedule, build_strategy
from strategies.model_store import discard_rounds_after, save_round_models, saves_round
from strategies.privacy import privacy_summary
from strategies.reply_screening import (
    ClientOutOfGpuMemory,
    ClientProcessesDied,
    ClientStateLost,
    NothingTrained,
    infrastructure_loss,
    nothing_trained_reason,
    out_of_gpu_memory,
)
from strategies.results import RunRecorder
from strategies.round_conditions import describe_participation_and_clock, participation_of, simulated_time
from strategies.round_interface import RoundStrategy
from strategies.schedules import ClientSchedule
from strategies.system_clock import SystemClock, local_epochs_of
from strategies.tracking import Trackers


def output_directory(config: dict[str, Any], run_id: int) -> Path:
    if config["output-dir"]:
        return Path(config["output-dir"]).expanduser().resolve()
    return Path.home() / "basin-runs" / str(run_id)


def round_train_config(
    config: dict[str, Any], schedule: ClientSchedule, server_round: int, black: Sequence[float] = ()
) -> ConfigRecord:
    """What clients receive with round ``server_round`` (1-based); ``black`` is the data
    set's standardised black pixel per channel (the crop's padding, when ``augment`` is on)."""
    lr, local_epochs = schedule(server_round)
    entries = {
        "lr": lr,
        "local-epochs": local_epochs,
        "batch-size": config["batch-size"],
        "momentum": config["momentum"],
        "nesterov": config["nesterov"],
        "weight-decay": config["weight-decay"],
        "grad-clip": config["grad-clip"],
        "augment": config["augment"],
        "seed": config["seed"],
        protocol.CUDA_GRAPHS: config["cuda-graphs"],
    }
    if config["augment"] != "none":
        entries[protocol.AUGMENT_PAD] = [float(v) for v in black] or [0.0]
    if protocol.LABEL_COUNTS_RECORD in method(config["strategy"]).reply_records:  # it leaves the client, as declared
        entries[protocol.REPORT_LABEL_COUNTS] = True
    return ConfigRecord(entries)


def main(grid: Grid, context: Context) -> None:
    hand_over_client_halves()  # the global model is built by client code (clients/models/)
    """One run of the ServerApp: its rounds, results and checkpoints (see the module docstring)."""
    config = validate_run_config(context.run_config)
    directory = output_directory(config, context.run_id)
    checkpoint = read_checkpoint(directory, config)
    recorder = RunRecorder(
        directory, config, summary_horizon(config), config["target-accuracy"],
        rows=checkpoint["rows"] if checkpoint else (), resumed_after=checkpoint["round"] if checkpoint else None,
        trackers=Trackers(config, directory) if config["track"] else None,
    )
    try:
        run(grid, config, recorder, checkpoint)
    except BaseException as error:
        recorder.fail(error)
        raise
    summary = recorder.complete()
    log.info(f"completed: {summary}")


def run(grid: Grid, config: dict[str, Any], recorder: RunRecorder, checkpoint: dict[str, Any] | None = None) -> None:
    """Run all rounds (those after ``checkpoint``'s when given), writing one results row per
    round and a checkpoint every ``checkpoint-every`` rounds."""
    device = select_device(config["device"])
    fix_arithmetic(config["server-torch-threads"], device, config["cuda-deterministic"])
    recorder.describe(arithmetic=arithmetic_record(device, config, config["cuda-deterministic"]))
    if config["dp-clipping-norm"] > 0:
        recorder.describe(privacy=privacy_summary(config))
    describe_participation_and_clock(config, recorder)
    if config["evaluation"] == "federated":  # the server reads no data set
        recorder.describe(evaluation=FederatedEvaluation.description(config))
        recorder.extend_columns(("clients-evaluated",))
        train_rounds(grid, config, recorder, checkpoint, None, device)
        return
    recorder.describe(evaluation={"kind": "central", "test-split": f"{config['dataset']}'s test split, on the server"})
    log.info(f"loading {config['dataset']} and building its partition")
    data = load_dataset(config["dataset"], config["data-dir"], config["normalize"])
    statistics = partition_statistics(config, data, recorder.directory)
    try:
        train_rounds(grid, config, recorder, checkpoint, data, device, on_training_start=statistics.start)
    except BaseException:  # partition.csv and .png are complete when the ServerApp ends, however it ends
        statistics.finish(raise_error=False)
        raise
    statistics.finish()


def round_timeout(config: dict[str, Any], first_contact: bool) -> float:
    """How long a round waits for replies: ``round-timeout``, plus ``node-timeout`` when the
    round is the first message the client processes get (a simulation's first round after
    a start or resume), which then also waits for them to start, as discovery did when it
    asked them."""
    return config["round-timeout"] + (config["node-timeout"] if first_contact else 0.0)


def train_rounds(grid: Grid, config: dict[str, Any], recorder: RunRecorder, checkpoint: dict[str, Any] | None, data,
                 device: torch.device, on_training_start: Callable[[], None] = lambda: None) -> None:
    """Client discovery, then every round from the initial model (or the checkpoint) to the
    final model; ``on_training_start`` is called once the clients are known, as training starts.
    ``data`` is None under federated evaluation: the server holds no data set."""
    layout = memory_format(resolve_model_name(config["model"], config["dataset"]), device.type)
    if data is None:
        num_classes, input_shape = dataset_shape(config["dataset"], config["data-dir"], config["normalize"])
        evaluator: CentralEvaluation | FederatedEvaluation = FederatedEvaluation(config["round-timeout"])
        black: Sequence[float] = ()  # augment is refused: no pixel statistics on the server
    else:
        num_classes, input_shape, black = data.num_classes, data.input_shape, data.black
        evaluator = CentralEvaluation(data, device, layout, recorder)
    torch.manual_seed(config["seed"])
    model = build_run_model(config, input_shape, num_classes)
    if config["dp-clipping-norm"] > 0:  # the model as built: a plug-in's buffers, on any data set
        refuse_buffers_under_dp(resolve_model_name(config["model"], config["dataset"]), config,
                                [name for name, _ in model.named_buffers()])
    arrays = ArrayRecord(model.state_dict())
    model.to(device).to(memory_format=layout)

    strategy = build_strategy(config)
    schedule = build_client_schedule(config)
    participation = participation_of(config, data)
    if participation.name != "uniform":
        recorder.describe(participation=participation.describe())
    federation = discover_partitions(grid, config["num-clients"], config["node-timeout"], (num_classes, input_shape),
                                     checkpoint.get("partition-names") if checkpoint else None)
    if federation.data_problems:  # the nodes whose rounds will fail: named in the summary too
        recorder.describe(**{"node-data-problems": {
            f"partition {p}" + (f" ({federation.names[p]})" if federation.names else ""): problem
            for p, problem in sorted(federation.data_problems.items())}})
    strategy.bind_partitions(
        federation, cohort_size(config), config["seed"],
        config["min-replies"], skip_unavailable=config["dead-nodes"] == "skip",
        # with client-state snapshots, each node is told when it last trained (a lost state is then its error)
        follow_trained_rounds=bool(method(config["strategy"]).client_state and config["checkpoint-every"]),
        participation=participation,
        clock=SystemClock(config) if config["system-speeds"] != "none" else None,
        local_epochs=(lambda t, partitions: local_epochs_of(config, t, partitions)) if config["local-epochs-range"] else None,
    )
    # In a simulation discovery read the engine's map: round 1 is the client processes' first message.
    clients_unasked = simulated_partitions(timeout=0) is not None
    log.info("training round 1")
    recorder.training_starts()
    on_training_start()
    first_round = 1
    # A fresh token per fresh run: a resume never reads client snapshots of another run.
    client_state_run = checkpoint["client-state-run"] if checkpoint else secrets.token_hex(8)
    snapshots = client_state_snapshots(config, recorder.directory, client_state_run)
    run_snapshots = recorder.directory / CLIENT_STATE_DIR / client_state_run
    if checkpoint:
        arrays, first_round = restore_checkpoint(checkpoint, strategy)
        log.info(f"resuming after round {first_round - 1} from {recorder.directory / CHECKPOINT_FILE}")
        skipped = [row["round"] for row in checkpoint["rows"] if str(row.get("round-status", "")).startswith("skipped")]
        if skipped:  # a resume does not redo them: say so
            log.info(f"the checkpoint holds {len(skipped)} skipped round(s) ({', '.join(map(str, skipped[:10]))}): "
                     "results.csv keeps their reasons")
        if snapshots:
            discard_snapshots_after(run_snapshots, first_round - 1)
        discard_rounds_after(recorder.directory, first_round - 1)
    clients_layout_recorded = False
    for server_round in range(first_round, config["num-rounds"] + 1):
        started = time.perf_counter()
        TRAFFIC.sent = TRAFFIC.received = 0  # this round's exchanges (MIME's extra one included)
        if not clients_unasked:  # simulated nodes never rejoin; asking the link for them costs O(K) a round
            strategy.follow_rejoined_nodes(grid, config["round-timeout"])
        train_config = round_train_config(config, schedule, server_round, black)
        if strategy.clock is not None:
            train_config.update(strategy.clock.round_entries())
        if snapshots:
            train_config.update({**snapshots, protocol.RESUMED_AFTER_ROUND: first_round - 1})
        strategy.prepare_round(server_round, arrays, grid)  # a method's exchange before training (MIME's)
        replies = send_and_receive(
            grid, strategy.configure_train(server_round, arrays, train_config, grid),
            round_timeout(config, first_contact=server_round == first_round and clients_unasked),
        )
        aggregated, metrics = strategy.aggregate_train(server_round, replies)
        for failure in strategy.round_failures:
            log.warning(f"round {server_round}: client failed: {failure}")
        lost = infrastructure_loss(strategy.round_failures, aggregated is not None)
        if lost:  # not the clients' fault: the round is not recorded nor checkpointed; the run stops
            raise ClientProcessesDied(
                f"round {server_round}: clients failed because their processes died ({lost}); the round is not "
                f"counted and the run stops: start the same command again to resume from its last checkpoint "
                f"(written every {config['checkpoint-every']} rounds)"
            )
        lost_state = [f for f in strategy.round_failures if protocol.CLIENT_STATE_LOST in f.reason]
        if lost_state:  # its method cannot go on as its paper's without it: refuse, naming the node
            raise ClientStateLost(f"round {server_round}: {lost_state[0]}")
        out_of_memory = out_of_gpu_memory(strategy.round_failures)
        if out_of_memory:  # every later round would fail the same way: stop, resumable
            raise ClientOutOfGpuMemory(
                f"round {server_round}: a client process ran out of GPU memory ({out_of_memory}); the round is not "
                f"counted and the run stops: let fewer client processes share the GPU (a larger --gpus-per-client), "
                f"then start the same command again to resume from its last checkpoint (written every "
                f"{config['checkpoint-every']} rounds)"
            )
        if aggregated is not None:
            arrays = aggregated
        else:
            log.warning(f"round {server_round} {strategy.round_status}; the global model is unchanged")
        trained = time.perf_counter()
        evaluation = evaluator(grid, strategy, arrays, server_round, model)
        test_accuracy = evaluation["test-accuracy"]
        round_metrics: Mapping[str, Any] = metrics or {}
        recorder.append({
            "round": server_round,
            "lr": train_config["lr"],
            "local-epochs": train_config["local-epochs"],
            **evaluation,
            "train-loss": round_metrics.get("train-loss", float("nan")),
            "local-steps": round_metrics.get("local-steps", float("nan")),
            "client-state-norm": round_metrics.get("client-state-norm", float("nan")),
            "round-seconds": time.perf_counter() - started,
            "train-seconds": trained - started,
            "eval-seconds": time.perf_counter() - trained,
            **strategy.round_clients,
            **simulated_time(recorder.rows, strategy.round_clients),
            "bytes-sent": TRAFFIC.sent,
            "bytes-received": TRAFFIC.received,
            **traffic_per_client(strategy.round_clients),
            "round-status": strategy.round_status,
            "failures": "; ".join(map(str, strategy.round_failures)),
            # round-indicators needs the server's test set: central evaluation's (strategies/config.py)
            **(indicators_of_round(strategy, model, evaluator.cka_inputs)
               if config["round-indicators"] and isinstance(evaluator, CentralEvaluation) else {}),
        })
        if protocol.CHANNELS_LAST in round_metrics and not clients_layout_recorded:  # the first round that has replies
            recorder.record_clients_layout(float(round_metrics[protocol.CHANNELS_LAST]))
            clients_layout_recorded = True
        if config["client-evaluation"]:
            recorder.append_client_evaluation(server_round, evaluator.client_rows(strategy))
        if saves_round(config, server_round) and aggregated is not None:
            save_models_of_round(config, recorder.directory, server_round, strategy, arrays)
        if config["checkpoint-every"] and (
            server_round % config["checkpoint-every"] == 0 or server_round == config["num-rounds"]
        ):
            write_checkpoint(recorder.directory, config, server_round, arrays, strategy, recorder.rows, client_state_run,
                             federation.names)
        log.info(f"round {server_round}/{config['num-rounds']} accuracy {test_accuracy:.4f} "
                 f"({time.perf_counter() - started:.2f} s)")
    never = nothing_trained_reason(recorder.rows, config)
    if never:  # the untrained model's accuracy is no result
        raise NothingTrained(never)
    torch.save(strategy.final_arrays(arrays).to_torch_state_dict(), recorder.directory / "final_model.pt")
    if snapshots:  # the run is complete: no resume will need them
        remove_run_snapshots(run_snapshots)


def indicators_of_round(strategy, model, cka_inputs) -> dict[str, float]:
    """IMA's locality and client-model CKA of the round's accepted client models."""
    clients = strategy.round_client_models()
    states = [state for state, _ in clients.values()]
    weights = [n for _, n in clients.values()]
    return round_indicators(model, states, weights, cka_inputs)


def save_models_of_round(config: dict[str, Any], directory: Path, server_round: int, strategy: RoundStrategy,
                         sent: ArrayRecord) -> None:
    """models/round-RRRR.pt: the base model, the average (if any) and capped client models."""
    base, averaged = strategy.round_models(sent)
    clients = strategy.round_client_models(config["save-client-models"])
    save_round_models(
        directory, server_round, to_numpy(base), None if averaged is None else to_numpy(averaged),
        {pid: state for pid, (state, _) in clients.items()}, {pid: n for pid, (_, n) in clients.items()},
    )


def client_state_snapshots(config: dict[str, Any], directory: Path, run_token: str) -> dict[str, Any]:
    """What stateful clients need to snapshot their state for checkpoints (none: {})."""
    if not method(config["strategy"]).client_state or not config["checkpoint-every"]:
        return {}
    return {
        protocol.CLIENT_STATE_ROOT: str(directory / CLIENT_STATE_DIR),
        protocol.CLIENT_STATE_RUN: run_token,
        protocol.CLIENT_STATE_ATTEMPT: secrets.token_hex(8),  # this start's: a restarted node skips a killed run's
        protocol.CHECKPOINT_EVERY: config["checkpoint-every"],
    }


def partition_statistics(config: dict[str, Any], data, directory: Path) -> PartitionStatistics:
    """Refuse a partition with an empty client now; return the thread that writes
    partition.csv (class counts per client) and partition.png (the heterogeneity to look
    at), to start once training starts: at 10⁶ clients, counting 3·10⁸ labels and drawing
    take ~20 s of this process's interpreter, which then overlap the rounds (the client
    processes' work) instead of slowing the simulation engine's start (its registration of
    the nodes, Ray) in the same interpreter before round 1."""
    indices = partition_indices(config["dataset"], config["data-dir"], config["normalize"], partition_settings(config))
    # Hub sets are partitioned here first (the launcher cannot read their labels): an
    # empty client fails the run now, before round 1, instead of in every round.
    check_no_empty_clients(indices)
    title = (f"{config['dataset']}: {partition_notation(config)} over {config['num-clients']} clients, "
             "samples per class and client")
    return PartitionStatistics(data, indices, directory, title)


class PartitionStatistics(threading.Thread):
    """partition.csv, then partition.png, written in a thread (see partition_statistics)."""

    def __init__(self, data, indices, directory: Path, title: str):
        super().__init__(name="partition statistics")
        self.data, self.indices, self.directory, self.title = data, indices, directory, title
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            table = class_count_table(self.data.y_train.numpy(), self.indices, self.data.num_classes,
                                      self.data.columns.get("domain"), self.data.domain_names)
            table.to_csv(self.directory / "partition.csv")
        except BaseException as error:  # raised by finish(), in the ServerApp's thread
            self.error = error
            return
        try:
            plot_class_counts(table, self.directory / "partition.png", title=self.title)
        except Exception as error:  # a figure that fails must not fail the run, nor pass unsaid
            log.warning(f"partition.png was not drawn: {type(error).__name__}: {error}")

    def finish(self, raise_error: bool = True) -> None:
        """Wait for the files (written now if the thread was never started: a run that ended
        before training started); raise what writing partition.csv raised (a full disk, …)."""
        if self.ident is None:
            self.start()
        self.join()
        if self.error is not None and raise_error:
            raise self.error


def traffic_per_client(round_clients: Mapping[str, float]) -> dict[str, float]:
    """The round's bytes each way over its sampled clients (clients-ok + clients-failed)."""
    sampled = round_clients.get("clients-ok", 0) + round_clients.get("clients-failed", 0)
    if not sampled:
        return {}
    return {"bytes-sent-per-client": TRAFFIC.sent / sampled, "bytes-received-per-client": TRAFFIC.received / sampled}
