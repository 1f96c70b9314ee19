"""Partial work on the simulated clock (clients/system_speed.py), by hand: what a straggler
policy lets a client do, and how each method family counts the τ of K planned steps it ran
(its declaration's ``partial_work``: strategies/methods/method_spec.PARTIAL_WORK_RULES)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from clients import protocol
from clients.client_info import ClientInfo
from clients.local_round import LocalRound, training_config
from clients.system_speed import simulated_work
from clients.training import LocalTrainingConfig, in_round_lrs, train_local
from experiments.runtime.run_config import resolve_config
from strategies.methods.registry import METHODS_BY_NAME

# 8 examples, batches of 2: K = 4 planned steps per epoch.
X = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
Y = torch.tensor([0, 1, 0, 1, 1, 0, 1, 0])
LR, BUDGET, PLANNED = 0.1, 2, 4


def clock(policy: str, speed: float, bandwidth: float, deadline: float, step_seconds: float = 0.5) -> dict:
    return {protocol.CLIENT_SPEED: speed, protocol.CLIENT_BANDWIDTH: bandwidth, protocol.STEP_SECONDS: step_seconds,
            protocol.STRAGGLER_POLICY: policy, protocol.ROUND_DEADLINE: deadline}


def test_a_clients_simulated_time_and_what_each_policy_lets_it_do():
    # 10 steps of 0.5 s at speed 2: 2.5 s; 1,000 bytes both ways at 1,000 B/s: 2 s. T = 4.5 s.
    assert simulated_work({}, 10, 1000) is None  # no clock
    wait = simulated_work(clock("wait", 2.0, 1000.0, 0.0), 10, 1000)
    assert (wait.steps, wait.planned, wait.seconds) == (10, 10, 4.5)
    on_time = simulated_work(clock("deadline", 2.0, 1000.0, 4.5), 10, 1000)
    assert (on_time.steps, on_time.seconds) == (10, 4.5)
    dropped = simulated_work(clock("deadline", 2.0, 1000.0, 4.0), 10, 1000)
    assert dropped.late and dropped.seconds == 4.5
    # partial, deadline 3.6 s: 1.6 s after the transfers, ⌊1.6 · 2 / 0.5⌋ = 6 steps in 1.5 s, 3.5 s in all
    cut = simulated_work(clock("partial", 2.0, 1000.0, 3.6), 10, 1000)
    assert (cut.steps, cut.planned) == (6, 10) and math.isclose(cut.seconds, 3.5)
    # the transfers alone exceed the deadline: nothing fits, late
    assert simulated_work(clock("partial", 2.0, 1000.0, 1.9), 10, 1000).late


def test_partial_work_runs_the_first_steps_of_the_planned_lrs():
    """τ = 2 of K = 4 with FedSWA's in-round decay (1 → 0.5): the lrs are η·(1, 0.875), the
    first two of the planned four, not a decay squeezed into two steps."""
    config = LocalTrainingConfig(lr=LR, local_epochs=1, batch_size=2, step_lr_start=1.0, step_lr_end=0.5,
                                 step_budget=BUDGET)
    model = nn.Linear(3, 2)
    result = train_local(model, X, Y, config, torch.Generator().manual_seed(1), graphs=False)
    assert result.num_steps == BUDGET
    assert math.isclose(result.lr_sum, LR * (1.0 + 0.875))
    assert in_round_lrs(LR, PLANNED, 1.0, 0.5)[:BUDGET] == [LR, LR * 0.875]


def _round(content_records: dict, config_entries: dict, state: RecordDict | None = None, seed: int = 0):
    """One LocalRound on a tiny linear model: (model before, model after, metrics, records)."""
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    entries = {"lr": LR, "local-epochs": 1, "batch-size": 2, "momentum": 0.0, "weight-decay": 0.0, "grad-clip": 0.0,
               "augment": "none", protocol.CUDA_GRAPHS: False, **config_entries}
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": ConfigRecord(entries),
                          **content_records})
    state = RecordDict() if state is None else state
    local = LocalRound(model, content, state, np.random.default_rng(0), ClientInfo.of(Y, 2))
    result = local.train(model, X, Y, torch.Generator().manual_seed(1))
    metrics, records = local.finish(model, result)
    return before, {k: v.detach().clone() for k, v in model.named_parameters()}, metrics, records, state


def _zeros_like_params(seed: int = 0) -> ArrayRecord:
    torch.manual_seed(seed)
    return ArrayRecord({k: torch.zeros_like(v) for k, v in nn.Linear(3, 2).state_dict().items()})


def test_steps_taken_scaffold_divides_its_control_update_by_the_lrs_of_the_steps_it_ran():
    """SCAFFOLD, option II with c = c_i = 0: c_i⁺ = (x − y_τ)/(τ·η), y_τ the model after the τ steps."""
    before, after, metrics, records, state = _round({protocol.SCAFFOLD_SERVER_CONTROL: _zeros_like_params()},
                                                    {protocol.STEP_BUDGET: BUDGET})
    assert metrics["local-steps"] == BUDGET
    delta = records[protocol.SCAFFOLD_DELTA_CONTROL].to_torch_state_dict()
    for name in before:
        torch.testing.assert_close(delta[name], (before[name] - after[name]) / (BUDGET * LR))
    stored = state[protocol.SCAFFOLD_CLIENT_CONTROL].to_torch_state_dict()
    torch.testing.assert_close(stored["weight"], delta["weight"])


def test_steps_taken_fednova_reports_tau_and_its_a_norm():
    """FedNova's τ_i and ‖a_i‖₁ with momentum ρ = 0.5 over τ = 2 steps: 1 + (1 + 0.5) = 2.5."""
    _, _, metrics, _, _ = _round({}, {protocol.STEP_BUDGET: BUDGET, "momentum": 0.5})
    assert metrics["local-steps"] == BUDGET
    assert metrics[protocol.SOLVER_A_NORM] == pytest.approx(2.5)


def test_a_budget_of_the_planned_steps_or_more_changes_nothing():
    _, full, metrics, _, _ = _round({}, {})
    _, budgeted, again, _, _ = _round({}, {protocol.STEP_BUDGET: PLANNED + 3})
    assert metrics["local-steps"] == again["local-steps"] == PLANNED
    for name in full:
        assert torch.equal(full[name], budgeted[name])


def test_fixed_count_fedmoswa_divides_by_eta_times_50_whatever_ran():
    """FedMoSWA's official code: c_i⁺ = c_i − m + (x − y)/(50·η), with c_i = m = 0, after τ = 2 steps."""
    before, after, metrics, records, _ = _round(
        {protocol.MOSWA_SERVER_CONTROL: _zeros_like_params()},
        {protocol.STEP_BUDGET: BUDGET, protocol.CONTROL_STEP_COUNT: 50})
    assert metrics["local-steps"] == BUDGET
    new = records[protocol.MOSWA_NEW_CONTROL].to_torch_state_dict()
    for name in before:
        torch.testing.assert_close(new[name], (before[name] - after[name]) / (50 * LR))


def test_planned_steps_fedcm_scales_its_direction_by_the_steps_it_planned():
    """FedCM per client: Δ_t = D/(η·K_i) with K_i = 4 planned, though only τ = 2 run."""
    direction = ArrayRecord({k: torch.ones_like(v) for k, v in nn.Linear(3, 2).state_dict().items()})
    content = RecordDict({protocol.FEDCM_DIRECTION: direction, "config": ConfigRecord({
        "lr": LR, "local-epochs": 1, "batch-size": 2, "momentum": 0.0, "weight-decay": 0.0, "grad-clip": 0.0,
        protocol.FEDCM_ALPHA: 0.1, protocol.FEDCM_SCALE: "client",
        protocol.STEP_BUDGET: BUDGET})})
    from clients.fedcm import momentum_direction

    model = nn.Linear(3, 2)
    component = momentum_direction(model, content, RecordDict())
    config = training_config(content["config"])
    assert (config.planned_steps(len(Y)), config.num_steps(len(Y))) == (PLANNED, BUDGET)
    (term,) = component.gradient_terms(config, len(Y))
    for scaled in term.inputs:
        torch.testing.assert_close(scaled, torch.full_like(scaled, 1.0 / (LR * PLANNED)))


def test_feddyn_updates_its_linear_term_from_where_the_tau_steps_ended():
    """FedDyn: ∇L_k ← ∇L_k − α(θ_k − θ^{t−1}) with ∇L_k = 0 before, θ_k after τ = 2 steps."""
    before, after, metrics, _, state = _round({}, {protocol.STEP_BUDGET: BUDGET, protocol.FEDDYN_ALPHA: 0.01})
    assert metrics["local-steps"] == BUDGET
    linear = state[protocol.FEDDYN_CLIENT_GRADIENT].to_torch_state_dict()
    for name in before:
        torch.testing.assert_close(linear[name], -0.01 * (after[name] - before[name]))


def test_mimes_full_batch_gradient_does_not_depend_on_the_cut():
    """MIME's c is the mean gradient over all of the client's examples at the received model,
    computed before any local step: partial work cuts the steps, not that gradient."""
    from clients.mime import full_gradient

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    gradient = full_gradient(model, X, Y)
    loss = nn.functional.cross_entropy(model(X), Y)
    by_hand = torch.autograd.grad(loss, [model.weight])[0]
    torch.testing.assert_close(gradient["weight"], by_hand)


def test_every_declared_method_names_a_partial_work_rule():
    for name, spec in METHODS_BY_NAME.items():
        overrides = {"model": "resnet20-gn"} if spec.model_needs == "slimmable-residual" else {}
        config = resolve_config({}, {"dataset": "digits", "strategy": name, "momentum": 0.0, **overrides})
        assert spec.partial_work_rule(config) in ("steps-taken", "planned-steps", "fixed-count"), name
    official = resolve_config({}, {"dataset": "digits", "strategy": "fedmoswa", "momentum": 0.0,
                                   "fedswa-variant": "official-code"})
    assert METHODS_BY_NAME["fedmoswa"].partial_work_rule(official) == "fixed-count"
    assert METHODS_BY_NAME["fedcm"].partial_work_rule(resolve_config({}, {
        "dataset": "digits", "strategy": "fedcm", "momentum": 0.0})) == "planned-steps"
