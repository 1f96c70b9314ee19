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
# The noise inside (on each base model) and outside (on what the rule returns), and the
# clipping alone (σ = 0, with averaging none: the bound on the update). The norm binds.
CLIPPING_NORM = 0.5
PRIVACY = {
    "off": {},
    "inside": {"dp-clipping-norm": CLIPPING_NORM, "dp-noise-multiplier": 0.3, "dp-order": "inside"},
    "outside": {"dp-clipping-norm": CLIPPING_NORM, "dp-noise-multiplier": 0.3, "dp-order": "outside"},
    "clip-only": {"dp-clipping-norm": CLIPPING_NORM, "dp-noise-multiplier": 0.0, "dp-order": "inside"},
}

# The compositions Basin must refuse, by name (not read from the declarations the code reads),
# each with its reason's key phrase: a refusal not in the table, or a composition in it that
# runs, fails the test. DP refuses what it cannot make private (strategies/privacy.py).
SENDS_MORE_THAN_THE_MODEL = ("scaffold", "fedmoswa", "mime", "mimelite", "fedfa")
OWN_AGGREGATE = ("adabest", "fedacg", "fedavg-clip", "fedcm", "feddyn", "fedgma", "fednova", "fedswa", "mofedsam")
SERVER_STEP = ("fedavgm", "fedadam", "fedyogi", "fedadagrad")
SHADOW_AVERAGES = ("wima", "swa", "ema")  # their average is never sent (AVERAGING sets no avg-feedback)


def refusal_phrase(method: str, averaging: str, privacy: str) -> str | None:
    """The key phrase of the reason a composition must be refused for; None: it must run."""
    if privacy == "off":
        return None
    if method in SENDS_MORE_THAN_THE_MODEL:
        return f"strategy = '{method}' also sends"
    if method in OWN_AGGREGATE:
        return f"strategy = '{method}' aggregates by its own rule"
    if privacy != "outside" or averaging == "none":
        return None
    if method in SERVER_STEP:
        return f"after strategy = '{method}''s server step"
    if averaging in SHADOW_AVERAGES:
        return "an average of noise-free base models that no client receives"
    return None


class Rows(list):
    """The part of strategies/results.RunRecorder that the round loop writes to."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory, self.rows = directory, self

    def extend_columns(self, extra: tuple[str, ...]) -> None:
        pass

    def describe(self, **entries: Any) -> None:
        self.described = {**getattr(self, "described", {}), **entries}

    def training_starts(self) -> None:
        pass

    def record_clients_layout(self, channels_last: float) -> None:
        self.clients_layout = channels_last

    def append_client_evaluation(self, server_round: int, clients: list[dict[str, Any]]) -> None:
        self.client_rows = [*getattr(self, "client_rows", []), *({"round": server_round, **c} for c in clients)]


def compositions() -> list[tuple[str, str, str]]:
    """(method, averaging, privacy) for every declared method and rule (AVERAGING must name each);
    the clipping alone with averaging none only."""
    return [(method, averaging, privacy)
            for method, averaging, privacy in itertools.product(METHODS_BY_NAME, ["none", *AVERAGINGS_BY_NAME], PRIVACY)
            if privacy != "clip-only" or averaging == "none"]


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


def clipped_mean(sent: dict[str, torch.Tensor], clients: dict[int, dict[str, torch.Tensor]], m: int) -> dict[str, torch.Tensor]:
    """By hand: sent + (1/m)·Σ_k Δ_k·min(1, C/‖Δ_k‖₂), Δ_k = client k's model − sent."""
    total = {key: torch.zeros_like(value, dtype=torch.float64) for key, value in sent.items()}
    for model in clients.values():
        update = {key: model[key].double() - value.double() for key, value in sent.items()}
        norm = float(torch.sqrt(sum((u * u).sum() for u in update.values())))
        for key, u in update.items():
            total[key] += u * min(1.0, CLIPPING_NORM / norm)
    return {key: (value.double() + total[key] / m).float() for key, value in sent.items()}


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(((a[key].double() - b[key].double()) ** 2).sum() for key in a)))


@pytest.mark.parametrize("method", list(METHODS_BY_NAME))
def test_every_composition_runs_two_rounds_through_the_client_handlers_or_is_refused_in_one_line(method, tmp_path,
                                                                                                 record_property,
                                                                                                 monkeypatch):
    from clients.models import build_run_model
    from clients.training import evaluate
    from strategies.privacy import ServerSideDP

    assert set(AVERAGING) == {"none", *AVERAGINGS_BY_NAME}, "a declared averaging rule has no setting here"
    data = load_dataset("digits", "", True)
    # Every private mean DP computes: (model sent, the mean), to bound the clipped update where a server step follows.
    private_means: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
    computed = ServerSideDP.private_mean

    def recorded(self, server_round, contents):
        mean = computed(self, server_round, contents)
        private_means.append(({k: v.numpy() for k, v in self.current_arrays.items()},
                              {k: v.numpy() for k, v in mean.items()}))
        return mean

    monkeypatch.setattr(ServerSideDP, "private_mean", recorded)
    ran, refused, saved_of = [], {}, {}
    for _, averaging, privacy in [c for c in compositions() if c[0] == method]:
        what = f"{method} × {averaging} × DP {privacy}"
        phrase = refusal_phrase(method, averaging, privacy)
        try:
            config = run_config(method, averaging, privacy)
        except ConfigError as error:
            assert "\n" not in str(error)
            assert phrase is not None, f"{what} is refused but must run: {error}"
            assert phrase in str(error), f"{what} is refused for another reason than {phrase!r}: {error}"
            refused[(averaging, privacy)] = str(error)
            continue
        assert phrase is None, f"{what} runs but must be refused ({phrase!r})"
        directory = tmp_path / f"{averaging}-{privacy}"
        directory.mkdir()
        grid = InProcessGrid(config, config["num-clients"])
        rows = Rows(directory)
        del private_means[:]
        train_rounds(grid, config, rows, None, data, torch.device("cpu"))
        assert [row["round"] for row in rows] == [1, 2], what
        sent_bytes = received_bytes = 0
        for row in rows:
            assert np.isfinite(row["test-loss"]), what
            assert (row["clients-ok"], row["clients-failed"], row["round-status"]) == (2, 1, "aggregated"), what
            assert row["failures"].startswith(f"partition {FAULTY} (node {100 + FAULTY}): client error: InjectedFault"), what
            sent_bytes, received_bytes = sent_bytes + row["bytes-sent"], received_bytes + row["bytes-received"]
        # discovery's queries carry no arrays: the rounds' columns hold every array that went each way
        assert (sent_bytes, received_bytes) == (grid.bytes_sent, grid.bytes_received), what
        saved = saved_of[(averaging, privacy)] = [load_round_models(directory, r) for r in (1, 2)]
        for model in saved:
            assert all(torch.isfinite(t).all() for t in model["base"].values()), what
        check_privacy(config, privacy, saved, saved_of.get((averaging, "off")), private_means, what)
        average = expected_average(config, [saved[0]["base"], saved[1]["base"]])
        fma_target = config["averaging"] == "ima" and hasattr(METHODS_BY_NAME[method], "build") and _steps_toward_a_target(config)
        noise_on_average = privacy == "outside"
        if average is not None and not fma_target:
            for key, value in average.items():
                if noise_on_average:  # outside: the noise is on the average, not on the base models it averages
                    assert not torch.allclose(saved[1]["averaged"][key], value, rtol=1e-5, atol=1e-6), what
                else:
                    torch.testing.assert_close(saved[1]["averaged"][key], value, rtol=1e-5, atol=1e-6, msg=what)
        check_the_evaluated_models(config, rows, saved, directory, data, build_run_model, evaluate, what)
        ran.append((averaging, privacy))
    record_property("compositions", {"ran": len(ran), "refused": refused})
    print(f"{method}: {len(ran)} ran, {len(refused)} refused: " + "; ".join(sorted(set(refused.values()))))
    assert ran, f"{method}: no composition runs"


def check_privacy(config: dict[str, Any], privacy: str, saved: list[dict[str, Any]],
                  without_dp: list[dict[str, Any]] | None, private_means: list, what: str) -> None:
    """DP's effect on round 2 (sent: round 1's released model, 2 of the m = 3 sampled replied):
    the clipping alone bounds the update by (2/3)·C, and for a method whose model is the mean
    it is the hand-computed clipped mean of the saved client models; the noise inside is in
    the base model (it differs from the run without DP and moves it further than C); outside
    it is not (the base model is the noise-free clipped mean)."""
    if privacy == "off":
        assert not private_means, f"{what}: DP ran without dp-clipping-norm"
        return
    assert len(private_means) == 2, f"{what}: {len(private_means)} private means in 2 rounds: DP did not aggregate"
    bound = 2 / 3 * CLIPPING_NORM * (1 + 1e-5)
    mean_is_the_model = METHODS_BY_NAME[config["strategy"]].dp_aggregate == "mean"
    sent, base = saved[0]["base"], saved[1]["base"]
    if privacy == "clip-only":
        for sent_arrays, mean in private_means:
            update = float(np.sqrt(sum(np.sum((mean[k].astype(np.float64) - sent_arrays[k]) ** 2) for k in mean)))
            assert update <= bound, f"{what}: the private mean moved {update:.4f} > (2/3)·C"
        if mean_is_the_model:
            assert distance(base, sent) <= bound, what
            for key, value in clipped_mean(sent, saved[1]["clients"], 3).items():
                torch.testing.assert_close(base[key], value, rtol=1e-5, atol=1e-6, msg=what)
        return
    assert without_dp is not None, what
    assert any(not torch.equal(base[key], without_dp[1]["base"][key]) for key in base), f"{what}: round 2 has no noise"
    if mean_is_the_model and config["averaging"] in ("none", "ima"):
        noisy = privacy == "inside" or config["averaging"] == "none"
        assert (distance(base, sent) > CLIPPING_NORM) == noisy, f"{what}: the noise is not where dp-order puts it"


def check_the_evaluated_models(config: dict[str, Any], rows: list[dict[str, Any]], saved: list[dict[str, Any]],
                               directory: Path, data, build_run_model, evaluate, what: str) -> None:
    """The round loop's test-loss is the model the rule reports, scored here from the saved
    models: IMA's average from t_s on (also what its clients receive next), the base model
    before; WIMA's, SWA's and EMA's average (a shadow: their clients receive the base, whose
    score is base-loss), which is also the final model; the base model without a rule."""
    model = build_run_model(config, data.input_shape, data.num_classes)

    def loss(state: dict[str, torch.Tensor]) -> float:
        model.load_state_dict(state)
        return evaluate(model, data.x_test, data.y_test)[0]

    rule = config["averaging"]
    for row, models in zip(rows, saved):
        assert row["base-loss"] == pytest.approx(loss(models["base"]), rel=1e-6), what
        reported = models["averaged"] if rule != "none" and models["averaged"] is not None else models["base"]
        assert row["test-loss"] == pytest.approx(loss(reported), rel=1e-6), what
    if rule != "none":
        assert rows[1]["sent-model"] == ("averaged" if rule == "ima" else "base"), what
        assert loss(torch.load(directory / "final_model.pt")) == pytest.approx(loss(saved[1]["averaged"]), rel=1e-6), what


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


# Heterogeneity beyond the data (strategies/participation.py, strategies/system_clock.py):
# clients available with their own probabilities, speeds and bandwidths spread over two
# orders of magnitude, a deadline that cuts some short (partial) or drops them (deadline),
# and local epochs drawn from 1–2 per client and round. The deadline is the median client's
# full round at 1 epoch: some finish, some do not.
# A fast link (1 Gbit/s median): the cut falls on the steps, for the MLP and the ResNet alike.
SYSTEMS = {
    "partial": {"participation-model": "availability", "availability-min": 0.5, "system-speeds": "lognormal",
                "speed-sigma": 1.5, "straggler-policy": "partial", "round-deadline": 0.2, "step-seconds": 0.05,
                "local-epochs-range": "1-2", "participation": 0.5, "fault-injection": "", "bandwidth-mbps": 1000.0},
    "deadline": {"participation-model": "cyclic", "cyclic-groups": 2, "system-speeds": "lognormal", "speed-sigma": 1.5,
                 "straggler-policy": "deadline", "round-deadline": 0.2, "step-seconds": 0.05, "participation": 0.5,
                 "bandwidth-mbps": 1000.0,
                 "fault-injection": ""},
}


@pytest.mark.parametrize("method", list(METHODS_BY_NAME))
def test_every_method_and_averaging_rule_runs_under_partial_participation_and_stragglers(method, tmp_path):
    """Each declared method × each averaging rule (and none) under partial work, and with averaging
    none under the deadline: two real rounds through the client handlers, every sampled client
    accounted for (accepted, partial among them, or dropped late; none failed), the rounds'
    simulated time the deadline at most, and finite models."""
    data = load_dataset("digits", "", True)
    runs = [("partial", averaging) for averaging in AVERAGING] + [("deadline", "none")]
    cut = dropped = 0
    for system, averaging in runs:
        what = f"{method} × {averaging} × {system}"
        model = {"model": "resnet20-gn"} if METHODS_BY_NAME[method].model_needs == "slimmable-residual" else {}
        config = resolve_config({}, {**SMALL, **model, "strategy": method, **AVERAGING[averaging], **SYSTEMS[system]})
        directory = tmp_path / f"{averaging}-{system}"
        directory.mkdir()
        rows = Rows(directory)
        train_rounds(InProcessGrid(config, config["num-clients"]), config, rows, None, data, torch.device("cpu"))
        assert [row["round"] for row in rows] == [1, 2], what
        for row in rows:
            assert row["clients-failed"] == 0, (what, row["failures"])
            sampled = min(6, row["clients-available"])
            assert row["clients-ok"] + row["clients-late"] == sampled, what
            assert 0 < row["simulated-seconds"] <= 0.2 + 1e-12, what
            cut, dropped = cut + row["clients-partial"], dropped + row["clients-late"]
            if system == "deadline":
                assert row["clients-partial"] == 0, what
            if row["round-status"] == "aggregated":
                assert np.isfinite(row["test-loss"]), what
        saved = [load_round_models(directory, r) for r in (1, 2)]
        for models in saved:
            assert all(torch.isfinite(t).all() for t in models["base"].values()), what
    assert cut and dropped, f"{method}: the deadline cut no client short ({cut}) or dropped none ({dropped})"
