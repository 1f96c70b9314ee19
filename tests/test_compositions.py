"""Every composition Basin offers, run or refused: each declared method (plug-ins included)
× each averaging rule and none × server-side DP off, inside and outside. Each either is
refused by the launcher's validation in one line before Flower starts, or runs two real
rounds in this process: the ServerApp's round loop (strategies/server_work.train_rounds)
sends its messages through the ClientApp's real handlers (experiments/measurement/in_process_grid.py) on the
8×8 digits, and the rounds' models are finite, their accounting is right (clients, the
failed one, bytes both ways) and the averaging's invariant holds."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from clients.options import ConfigError
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import resolve_config
from partitions import load_dataset
from strategies.methods.registry import AVERAGINGS_BY_NAME, METHODS_BY_NAME
from strategies.model_store import load_round_models
from strategies.server_work import train_rounds

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

# 12 clients of ~120 examples, 3 a round; one client of both rounds' cohorts raises in each
# (FAULTY): each round has one failure to account for.
SMALL = {
    "dataset": "digits", "num-clients": 12, "participation": 0.25, "num-rounds": 2, "local-epochs": 1,
    "batch-size": 64, "momentum": 0.0, "min-partition-size": 1, "save-models-every": 1, "checkpoint-every": 0,
    "torch-threads": 1, "server-torch-threads": 1, "device": "cpu",
}


def _in_both_cohorts() -> int:
    """A partition that the seeded sampling puts in rounds 1 and 2 (it depends only on seed and round)."""
    from strategies.methods.strategy_builder import build_strategy

    config = resolve_config({}, {**SMALL, "strategy": "fedavg"})
    strategy = build_strategy(config)
    strategy.bind_partitions({100 + p: p for p in range(config["num-clients"])}, 3, config["seed"])
    return min(set(strategy.sample_partitions(1)) & set(strategy.sample_partitions(2)))


FAULTY = _in_both_cohorts()
SMALL["fault-injection"] = f"raise:{FAULTY}"
# Each rule's averages from round 2 over a window of 2 (SWA: every round from round 1, EMA from round 1).
AVERAGING = {
    "none": {},
    "ima": {"averaging": "ima", "window": 2, "avg-start": 2},
    "wima": {"averaging": "wima", "window": 2},
    "swa": {"averaging": "swa", "avg-start": 1, "swa-cycle": 1},
    "ema": {"averaging": "ema", "avg-start": 1, "ema-decay": 0.5},
}
# Noise inside, where the window then holds noisy base models (its mean is still theirs);
# none outside, where it would be added to the average the invariant reads. The norm binds.
PRIVACY = {
    "off": {},
    "inside": {"dp-clipping-norm": 0.5, "dp-noise-multiplier": 0.3, "dp-order": "inside"},
    "outside": {"dp-clipping-norm": 0.5, "dp-noise-multiplier": 0.0, "dp-order": "outside"},
}


class Rows(list):
    """The part of strategies/results.RunRecorder that the round loop writes to."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory, self.rows = directory, self

    def extend_columns(self, extra: tuple[str, ...]) -> None:
        pass

    def training_starts(self) -> None:
        pass


def compositions() -> list[tuple[str, str, str]]:
    """(method, averaging, privacy) for every declared method and rule (AVERAGING must name each)."""
    return list(itertools.product(METHODS_BY_NAME, ["none", *AVERAGINGS_BY_NAME], PRIVACY))


def run_config(method: str, averaging: str, privacy: str) -> dict[str, Any]:
    """The validated run config of a composition (ConfigError where the launcher refuses it),
    on the digits' MLP or, for a method that needs one, a slimmable residual network."""
    model = {"model": "resnet20-gn"} if METHODS_BY_NAME[method].model_needs == "slimmable-residual" else {}
    return resolve_config({}, {**SMALL, **model, "strategy": method, **AVERAGING[averaging], **PRIVACY[privacy]})


def expected_average(config: dict[str, Any], bases: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor] | None:
    """What the rule's round-2 average must be, from the rounds' base models."""
    rule = config["averaging"]
    if rule in ("ima", "wima", "swa"):  # the mean of the last P base models (SWA: of every one since its start)
        return {k: (bases[0][k] + bases[1][k]) / 2 for k in bases[1]}
    if rule == "ema":
        beta = config["ema-decay"]
        return {k: beta * bases[0][k] + (1 - beta) * bases[1][k] for k in bases[1]}
    return None


@pytest.mark.parametrize("method", list(METHODS_BY_NAME))
def test_every_composition_runs_two_rounds_through_the_client_handlers_or_is_refused_in_one_line(method, tmp_path,
                                                                                                 record_property):
    assert set(AVERAGING) == {"none", *AVERAGINGS_BY_NAME}, "a declared averaging rule has no setting here"
    data = load_dataset("digits", "", True)
    ran, refused = [], {}
    for _, averaging, privacy in [c for c in compositions() if c[0] == method]:
        try:
            config = run_config(method, averaging, privacy)
        except ConfigError as error:
            assert "\n" not in str(error)
            refused[(averaging, privacy)] = str(error)
            continue
        directory = tmp_path / f"{averaging}-{privacy}"
        directory.mkdir()
        grid = InProcessGrid(config, config["num-clients"])
        rows = Rows(directory)
        train_rounds(grid, config, rows, None, data, torch.device("cpu"))
        what = f"{method} × {averaging} × DP {privacy}"
        assert [row["round"] for row in rows] == [1, 2], what
        sent_bytes = received_bytes = 0
        for row in rows:
            assert np.isfinite(row["test-loss"]), what
            assert (row["clients-ok"], row["clients-failed"], row["round-status"]) == (2, 1, "aggregated"), what
            assert row["failures"].startswith(f"partition {FAULTY} (node {100 + FAULTY}): client error: InjectedFault"), what
            sent_bytes, received_bytes = sent_bytes + row["bytes-sent"], received_bytes + row["bytes-received"]
        # discovery's queries carry no arrays: the rounds' columns hold every array that went each way
        assert (sent_bytes, received_bytes) == (grid.bytes_sent, grid.bytes_received), what
        saved = [load_round_models(directory, r) for r in (1, 2)]
        for model in saved:
            assert all(torch.isfinite(t).all() for t in model["base"].values()), what
        average = expected_average(config, [saved[0]["base"], saved[1]["base"]])
        fma_target = config["averaging"] == "ima" and hasattr(METHODS_BY_NAME[method], "build") and _steps_toward_a_target(config)
        if average is not None and not fma_target:
            for key, value in average.items():
                torch.testing.assert_close(saved[1]["averaged"][key], value, rtol=1e-5, atol=1e-6, msg=what)
        if config["averaging"] == "ima" and not fma_target:  # IMA sends the average from t_s on, the base model before
            final = torch.load(directory / "final_model.pt")
            for key, value in average.items():
                torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6, msg=what)
        ran.append((averaging, privacy))
    record_property("compositions", {"ran": len(ran), "refused": refused})
    print(f"{method}: {len(ran)} ran, {len(refused)} refused: " + "; ".join(sorted(set(refused.values()))))
    assert ran, f"{method}: no composition runs"


def _steps_toward_a_target(config: dict[str, Any]) -> bool:
    """IMA on a server optimiser in its fma-target ordering: the window averages the FMAs
    and the step moves toward their mean (tests/test_averaging.py checks that arithmetic)."""
    from strategies.methods.strategy_builder import build_base_strategy

    return config["ima-server-opt"] == "fma-target" and hasattr(build_base_strategy(config), "step_target")


# -- the clients' schedule under each rule, through its declaration and a resolved run config --
def _round_schedule(keys: dict[str, Any], rounds: range) -> list[tuple[float, int]]:
    """(lr, local-epochs) that the ServerApp sends each round's clients for run config ``keys``."""
    from strategies.methods.strategy_builder import build_client_schedule
    from strategies.server_work import round_train_config

    config = resolve_config({}, {"num-rounds": 60, "lr": 0.1, "lr-decay": 0.9, "local-epochs": 5, **keys})
    schedule = build_client_schedule(config)
    return [(train_config["lr"], train_config["local-epochs"])
            for train_config in (round_train_config(config, schedule, r) for r in rounds)]


ROUNDS = range(1, 46)
T_S = 4  # avg-start as a round number


def _base(t: int) -> float:
    return 0.1 * 0.9 ** (t - 1)


@pytest.mark.parametrize("exploration", ["exponential", "constant", "cyclic", "epoch", "none", "cyclic-official-code",
                                         "epoch-official-code"])
def test_imas_exploration_reaches_the_clients_from_t_s_on(exploration):
    """IMA's every exploration, as the round config carries it, from round 1 to 41 rounds past
    t_s (METHODS' §1.1 and the IMA code's forms): the base schedule before t_s."""
    expected = {
        "exponential": lambda t: (_base(T_S) * 0.5 ** (t - T_S), 5),
        "constant": lambda t: (5e-5, 5),
        "cyclic": lambda t: (1e-2 - (1e-2 - 5e-5) * ((t - T_S) % 20) / 19, 5),
        "epoch": lambda t: (_base(t), 5 - (t - T_S) // 20),
        "none": lambda t: (_base(t), 5),
        "cyclic-official-code": lambda t: (_base(T_S) - (_base(T_S) - 5e-5) * ((t - T_S) % 20) / 19, 5),
        "epoch-official-code": lambda t: (0.1 * 0.9 ** (t - T_S), 5 - (t - T_S) // 20),
    }[exploration]
    got = _round_schedule({"averaging": "ima", "window": 2, "avg-start": T_S, "ima-exploration": exploration,
                           "ima-decay": 0.5}, ROUNDS)
    want = [(_base(t), 5) if t < T_S else expected(t) for t in ROUNDS]
    assert [e for _, e in got] == [e for _, e in want]
    np.testing.assert_allclose([lr for lr, _ in got], [lr for lr, _ in want], rtol=1e-12)


@pytest.mark.parametrize("variant", ["paper", "official-code"])
def test_swas_cyclic_lr_reaches_the_clients_from_its_start_round(variant):
    """Server SWA's cycles of c = 3 rounds from its start round s: lr = (1 − τ)·lr_s + τ·lr_s/100,
    τ = ((t − 1) mod c + 1)/c; the base schedule before s."""
    got = _round_schedule({"averaging": "swa", "avg-start": T_S, "swa-cycle": 3, "swa-variant": variant}, range(1, 13))
    lr_s = _base(T_S)
    want = [_base(t) if t < T_S else (1 - tau) * lr_s + tau * lr_s / 100
            for t in range(1, 13) for tau in [((t - 1) % 3 + 1) / 3]]
    assert [e for _, e in got] == [5] * 12
    np.testing.assert_allclose([lr for lr, _ in got], want, rtol=1e-12)


@pytest.mark.parametrize("averaging", ["none", "wima", "ema"])
def test_the_other_rules_leave_the_base_schedule(averaging):
    got = _round_schedule({**AVERAGING[averaging], "avg-start": T_S} if averaging == "ema" else AVERAGING[averaging],
                          range(1, 13))
    np.testing.assert_allclose([lr for lr, _ in got], [_base(t) for t in range(1, 13)], rtol=1e-12)
