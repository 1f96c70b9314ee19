"""Server-side differential privacy (strategies/privacy.py) with Basin's averaging: the
clipping by hand, the noise's scale and seed, and where each order adds the noise."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from experiments.runtime.run_config import resolve_config
from strategies.averaging import ModelAveraging
from strategies.config import ConfigError, validate_run_config
from strategies.fedavg import FedAvg
from strategies.methods.strategy_builder import build_strategy
from strategies.privacy import DP_ORDERS, ServerSideDP
from tests.fakes import FakeGrid, train_reply

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py

NODES = (1000, 1001, 1002)


def _fedavg() -> FedAvg:
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    strategy.bind_partitions({node: p for p, node in enumerate(NODES)}, len(NODES), seed=0)
    return strategy


def _round(strategy, sent, models, server_round=1, weights=(1, 1, 2)):
    """One round: ``sent`` to the three nodes, ``models`` back (node order), the output."""
    sent_record = ArrayRecord({"w": Array(np.asarray(sent, dtype=np.float32))})
    list(strategy.configure_train(server_round, sent_record, ConfigRecord(), FakeGrid(NODES)))
    replies = [train_reply(node, model, n) for node, model, n in zip(NODES, models, weights)]
    output, _ = strategy.aggregate_train(server_round, replies)
    return replies, output["w"].numpy()


def test_each_update_is_clipped_to_the_norm_and_the_mean_is_of_the_clipped_models():
    # Updates from sent = (1, 1): (3, 4) has norm 5 -> (0.6, 0.8); (0.3, 0.4) is within C = 1; (0, 2) -> (0, 1).
    dp = ServerSideDP(_fedavg(), noise_multiplier=0.0, clipping_norm=1.0, num_sampled_clients=3, seed=0)
    replies, output = _round(dp, [1, 1], [[4, 5], [1.3, 1.4], [1, 3]])
    updates = [reply.content["arrays"]["w"].numpy() - 1.0 for reply in replies]
    assert all(np.linalg.norm(update) <= 1.0 + 1e-6 for update in updates)
    np.testing.assert_allclose(updates, [[0.6, 0.8], [0.3, 0.4], [0.0, 1.0]], atol=1e-6)
    np.testing.assert_allclose(output, 1.0 + (np.array([0.6, 0.8]) + [0.3, 0.4] + 2 * np.array([0.0, 1.0])) / 4, rtol=1e-6)


def test_without_noise_and_with_a_norm_no_update_reaches_the_output_has_the_plain_rounds_bits():
    models = [[0.7, -1.3], [0.1, 0.2], [5e-4, 3.0]]
    _, plain = _round(_fedavg(), [0.3, -0.1], models)
    dp = ServerSideDP(_fedavg(), noise_multiplier=0.0, clipping_norm=100.0, num_sampled_clients=3, seed=0)
    _, private = _round(dp, [0.3, -0.1], models)
    assert private.tobytes() == plain.tobytes()


def test_the_noise_has_std_sigma_c_over_m_is_seeded_by_seed_and_round_and_leaves_numpys_generator_alone():
    size = 40_000
    zeros = [np.zeros(size)] * 3

    def noise(seed, server_round):
        dp = ServerSideDP(_fedavg(), noise_multiplier=1.5, clipping_norm=2.0, num_sampled_clients=3, seed=seed)
        return _round(dp, np.zeros(size), zeros, server_round)[1]

    state = np.random.get_state()[1].copy()
    first = noise(7, 2)
    assert np.array_equal(np.random.get_state()[1], state)  # the global generator is as it was
    assert abs(first.std() / (1.5 * 2.0 / 3) - 1) < 0.02 and abs(first.mean()) < 0.02
    assert first.tobytes() == noise(7, 2).tobytes()
    assert first.tobytes() != noise(7, 3).tobytes() and first.tobytes() != noise(8, 2).tobytes()


def _ima(base) -> ModelAveraging:
    return ModelAveraging(base, window=2, start_round=2, feedback=True)


def test_inside_the_window_averages_noisy_models_outside_the_noise_is_added_to_the_average():
    """Two rounds, window 2 from round 2, noise only (C larger than any update)."""
    models = [[[1.0, 2.0]] * 3, [[3.0, 0.0]] * 3]

    def run(strategy):
        outputs, sent = [], [0.0, 0.0]
        for server_round, round_models in enumerate(models, start=1):
            sent = _round(strategy, sent, round_models, server_round)[1]
            outputs.append(sent)
        return outputs

    def dp(base):
        return ServerSideDP(base, noise_multiplier=1.0, clipping_norm=100.0, num_sampled_clients=3, seed=0)

    noise_free = run(_ima(_fedavg()))
    inside = _ima(dp(_fedavg()))
    inside_outputs = run(inside)
    noise = [inside_outputs[0] - [1.0, 2.0], None]
    # Round 2's base model is (3, 0) plus round 2's noise; the output averages both noisy base models.
    noise[1] = inside.base_arrays["w"].numpy() - [3.0, 0.0]
    np.testing.assert_allclose(inside_outputs[1], (np.array([1.0, 2.0]) + noise[0] + [3.0, 0.0] + noise[1]) / 2, rtol=1e-5)

    outside = dp(_ima(_fedavg()))
    outside_outputs = run(outside)
    # The same seeds: round 1's noise on the base model, round 2's on the average of noise-free base models.
    np.testing.assert_array_equal(outside_outputs[0], inside_outputs[0])
    np.testing.assert_allclose(outside_outputs[1], noise_free[1] + noise[1], rtol=1e-5)
    base, average = outside.round_models(ArrayRecord({"w": Array(outside_outputs[1])}))
    assert average["w"].numpy().tobytes() == outside_outputs[1].tobytes()  # the released average is the noisy one
    np.testing.assert_array_equal(base["w"].numpy(), [3.0, 0.0])  # IMA's window holds noise-free base models


def test_the_run_config_builds_either_order_and_refuses_noise_without_a_clipping_norm():
    inside = build_strategy(resolve_config({}, {"averaging": "ima", "window": 2, "dp-clipping-norm": 1.0}))
    assert isinstance(inside, ModelAveraging) and isinstance(inside.base, ServerSideDP)
    outside = build_strategy(resolve_config({}, {"averaging": "ima", "window": 2, "dp-clipping-norm": 1.0,
                                                 "dp-order": "outside"}))
    assert isinstance(outside, ServerSideDP) and isinstance(outside.strategy, ModelAveraging)
    assert not isinstance(build_strategy(resolve_config({}, {"averaging": "ima", "window": 2})), ServerSideDP)
    with pytest.raises(ConfigError, match="'dp-noise-multiplier' = 0.5 needs a clipping norm"):
        validate_run_config({**resolve_config({}, {}), "dp-noise-multiplier": 0.5})
    with pytest.raises(ConfigError, match="'dp-order' = 'around' is not allowed"):
        validate_run_config({**resolve_config({}, {}), "dp-order": "around"})


def test_flowers_accountant_counts_the_inside_orders_releases_and_refuses_the_outside_order():
    """docs/your-own-app.md's accountant, in a stock app: IMA around Flower's DP wrapper
    around Flower's FedAvg accounts one release a round; the wrapper around IMA refuses an
    accountant (it needs FedAvg's own aggregation inside)."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
    from flwr.serverapp.strategy import FedAvg as FlowersFedAvg

    from strategies import IMA

    def accountant():
        return RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=3,
                                           neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                           sampling_method=SamplingMethod.NO_AMPLIFICATION))

    def flowers_fedavg():
        return FlowersFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=3, min_train_nodes=3)

    private = DifferentialPrivacyServerSideFixedClipping(flowers_fedavg(), noise_multiplier=1.0, clipping_norm=1.0,
                                                         num_sampled_clients=3, accountant=accountant())
    strategy = IMA(private, window=2, avg_start=2)
    sent = [0.0, 0.0]
    for server_round in (1, 2):
        sent = _round(strategy, sent, [[1.0, 0.0]] * 3, server_round, weights=(1, 1, 1))[1]
    spent = private.privacy_spent()
    assert spent.num_releases == 2 and 0 < spent.epsilon < float("inf") and spent.delta == 1e-5
    with pytest.raises(ValueError, match="requires a strategy using FedAvg.aggregate_train"):
        DifferentialPrivacyServerSideFixedClipping(IMA(flowers_fedavg(), window=2, avg_start=2), noise_multiplier=1.0,
                                                   clipping_norm=1.0, num_sampled_clients=3, accountant=accountant())


def test_the_methods_that_send_more_than_their_model_declare_it_and_dp_refuses_them_in_one_line_in_each_order():
    """SCAFFOLD's Δc_i, FedMoSWA's controls, MIME's full-batch gradients and FedFA's anchors
    leave the client beside the model; server-side DP clips and noises the model update
    only, so either order refuses them before Flower starts, naming the method and the tensor."""
    from strategies.methods.registry import METHODS_BY_NAME

    senders = {name: spec.reply_records for name, spec in METHODS_BY_NAME.items() if spec.reply_records}
    assert {"scaffold", "fedmoswa", "mime", "mimelite", "fedfa"} <= set(senders)
    for name, records in senders.items():
        for order in DP_ORDERS:
            with pytest.raises(ConfigError) as refused:
                resolve_config({}, {"strategy": name, "momentum": 0.0, "dp-clipping-norm": 1.0, "dp-order": order})
            line = str(refused.value)
            assert "\n" not in line and f"strategy = {name!r} also sends '{next(iter(records))}'" in line, line
            assert "unclipped and un-noised" in line
        resolve_config({}, {"strategy": name, "momentum": 0.0})  # without DP it runs


def test_only_the_model_is_clipped_and_a_reply_with_another_tensor_is_left_out_as_a_failure():
    """A reply that carries a tensor besides its model (a client whose method declares none)
    is a failure of the round, named, and the others are clipped and aggregated; the model
    record alone is clipped (Flower's wrapper clipped every ArrayRecord against the model)."""
    dp = ServerSideDP(_fedavg(), noise_multiplier=0.0, clipping_norm=1.0, num_sampled_clients=3, seed=0)
    sent_record = ArrayRecord({"w": Array(np.asarray([1.0, 1.0], dtype=np.float32))})
    list(dp.configure_train(1, sent_record, ConfigRecord(), FakeGrid(NODES)))
    extra = ArrayRecord({"w": Array(np.asarray([30.0, 40.0], dtype=np.float32))})  # as many arrays as the model
    replies = [train_reply(NODES[0], [4, 5]), train_reply(NODES[1], [1.3, 1.4], **{"objective-record": extra}),
               train_reply(NODES[2], [1, 3], 2)]
    output, _ = dp.aggregate_train(1, replies)
    assert [failure.partition_id for failure in dp.round_failures] == [1]
    assert "carries 'objective-record' besides its model" in dp.round_failures[0].reason
    np.testing.assert_allclose(output["w"].numpy(), 1.0 + (np.array([0.6, 0.8]) + 2 * np.array([0.0, 1.0])) / 3, rtol=1e-6)
