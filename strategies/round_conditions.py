"""Who takes part and how fast, for one run: its participation model (strategies/participation.py)
built with the client data it needs, the simulated clock's columns and summary entries
(strategies/system_clock.py), and the run's simulated time after each round."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from clients.data import partition_indices
from clients.options import ConfigError
from partitions.feasibility import partition_settings
from strategies.methods.method_spec import PARTIAL_WORK_RULES
from strategies.methods.registry import method
from strategies.participation import ParticipationModel, build_participation
from strategies.results import RunRecorder
from strategies.system_clock import SystemClock


def describe_participation_and_clock(config: dict[str, Any], recorder: RunRecorder) -> None:
    """results.csv's columns and summary.json's entries of a participation model and the clock."""
    if config["participation-model"] != "uniform":
        recorder.extend_columns(("clients-available",))
    if config["system-speeds"] != "none":
        recorder.extend_columns(("simulated-seconds", "simulated-time", "clients-late", "clients-partial"))
        rule = method(config["strategy"]).partial_work_rule(config)  # its declaration's
        recorder.describe(clock={**SystemClock(config).describe(config), "partial-work": rule,
                                 "partial-work-means": PARTIAL_WORK_RULES[rule]})


def participation_of(config: dict[str, Any], data) -> ParticipationModel:
    """The run's participation model, with the partition sizes or label counts it needs (``data``
    None: federated evaluation, where strategies/config.py refuses the models that need them)."""
    model = config["participation-model"]
    if data is None or not (model == "data-correlated" or (model == "availability"
                                                           and config["availability-source"] == "data-size")):
        return build_participation(config)
    indices = partition_indices(config["dataset"], config["data-dir"], config["normalize"], partition_settings(config))
    if model == "availability":
        return build_participation(config, np.array([len(part) for part in indices]))
    if config["correlated-classes"] > data.num_classes:
        raise ConfigError(
            f"run config key 'correlated-classes' = {config['correlated-classes']} exceeds {config['dataset']}'s "
            f"{data.num_classes} classes; allowed: 0..{data.num_classes}")
    labels = data.y_train.numpy()
    return build_participation(config, None, np.stack([np.bincount(labels[part], minlength=data.num_classes)
                                                            for part in indices]))


def simulated_time(rows: Sequence[Mapping[str, Any]], round_clients: Mapping[str, float]) -> dict[str, float]:
    """The run's simulated time after this round: the rows' last (a resume's too) plus this round's seconds."""
    if "simulated-seconds" not in round_clients:
        return {}
    before = float(rows[-1]["simulated-time"]) if rows else 0.0
    return {"simulated-time": before + float(round_clients["simulated-seconds"])}
