"""Estimates before a run starts (experiments/reproduction/estimates.py): client steps × the
model's measured step, scaled by what a whole Flower run took per step."""

from __future__ import annotations

import pytest

from experiments.reproduction.estimates import REFERENCE_RUN, Estimate, estimate, step_costs
from experiments.runtime.run_config import load_preset, resolve_config


def test_a_run_is_its_steps_times_its_models_step_scaled_by_the_measured_run():
    costs = {REFERENCE_RUN["key"]: 0.01, ("resnet20-gn", "cifar100", 20): 0.05}
    shards = resolve_config(load_preset("ima-fmnist-shards"), {})
    reference = estimate(shards, costs)
    # the 300-round Fashion-MNIST cell is the measured run: 17 min 24 s, and 44 s at 4,127 steps/s on the H100
    assert reference.client_steps == 180_000 and reference.cpu_seconds == pytest.approx(1044.0)
    assert reference.gpu_seconds == pytest.approx(180_000 / 4127.0) and "H100" in reference.gpu
    assert not reference.gpu_advised
    # a model whose step takes 5× as long, over 10 rounds of 10 × 5 local epochs × 50 batches of 20
    other = resolve_config({}, {"dataset": "cifar100", "model": "resnet20-gn", "batch-size": 20, "num-clients": 50,
                                "participation": 0.2, "local-epochs": 5, "num-rounds": 10, "data-dir": ""})
    expected = estimate(other, costs)
    assert expected.client_steps == 10 * 10 * 5 * 50
    assert expected.cpu_seconds == pytest.approx(expected.client_steps * 0.05 * 1044.0 / 180_000 / 0.01)
    assert expected.gpu_seconds is None and "GPU not measured" in expected.text()
    # another batch: from the measured ones; another model: none
    # (batch 40: half the steps, each twice batch 20's one measured step)
    assert estimate({**other, "batch-size": 40}, costs).cpu_seconds == pytest.approx(expected.cpu_seconds)
    assert "no measured step of vgg11-gn on cifar100" in estimate({**other, "model": "vgg11-gn"}, costs).why


def test_a_step_at_an_unmeasured_batch_is_on_the_line_through_the_nearest_two():
    from experiments.reproduction.estimates import step_at_batch

    costs = {("m", "d", 50): 0.010, ("m", "d", 100): 0.016, ("m", "d", 200): 0.030, ("n", "d", 10): 0.002}
    assert step_at_batch(costs, "m", "d", 100) == 0.016
    assert step_at_batch(costs, "m", "d", 75) == pytest.approx(0.013)  # between 50 and 100
    assert step_at_batch(costs, "m", "d", 32) == pytest.approx(0.010 - 0.006 * 18 / 50)  # beyond: the same line
    assert step_at_batch(costs, "m", "d", 1) == pytest.approx(0.010 - 0.006 * 49 / 50)
    steep = {("k", "d", 10): 0.001, ("k", "d", 20): 0.010}
    assert step_at_batch(steep, "k", "d", 1) == pytest.approx(0.001 / 20)  # never below per-example scaling
    assert step_at_batch(costs, "n", "d", 20) == pytest.approx(0.004)  # one measurement: scaled
    assert step_at_batch(costs, "x", "d", 20) is None


def test_gpu_advised_over_an_hour_on_the_cpu_or_by_steps_where_the_step_is_unmeasured():
    assert Estimate(10, 3601.0, None).gpu_advised and not Estimate(10, 3599.0, None).gpu_advised
    assert Estimate(200_000, None, None).gpu_advised and not Estimate(199_999, None, None).gpu_advised
    assert not Estimate(None, None, None, why="unknown size").gpu_advised


def test_every_shipped_model_on_a_built_in_set_has_a_measured_step():
    from experiments.reproduction.step_costs import shipped_configs

    costs = step_costs()
    for config in shipped_configs():
        found = estimate(config, costs)
        assert found.client_steps is None or found.cpu_seconds is not None, found.why
