"""Server-side differential privacy (strategies/privacy.py) with Basin's averaging: the
clipping by hand, the noise's scale and seed, and where each order adds the noise."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message

from experiments.runtime.run_config import resolve_config
from strategies.averaging import ModelAveraging
from strategies.config import ConfigError, validate_run_config
from strategies.fedavg import FedAvg
from strategies.methods.strategy_builder import build_strategy
from strategies.privacy import DP_ORDERS, PrivacyNotApplied, ServerSideDP
from tests.fakes import FakeGrid, train_reply, train_request

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


def _private(base=None, sigma=0.0, norm=100.0, seed=0) -> ServerSideDP:
    return ServerSideDP(base or _fedavg(), noise_multiplier=sigma, clipping_norm=norm, num_sampled_clients=3, seed=seed)


def test_each_update_is_clipped_to_the_norm_and_the_mean_is_their_uniform_sum_over_the_m_sampled():
    # Updates from sent = (1, 1): (3, 4) has norm 5 -> (0.6, 0.8); (0.3, 0.4) is within C = 1; (0, 2) -> (0, 1);
    # the third client's weight 2 does not count: (1, 1) + ((0.6, 0.8) + (0.3, 0.4) + (0, 1)) / 3.
    _, output = _round(_private(norm=1.0), [1, 1], [[4, 5], [1.3, 1.4], [1, 3]])
    np.testing.assert_allclose(output, [1.3, 1.0 + 2.2 / 3], rtol=1e-6)


def test_weights_1_1_100_give_the_uniform_mean_not_the_weighted_one():
    """One client reporting 100 examples moves FedAvg's weighted mean to (3 + 6 + 900)/102 ≈ 8.91; the
    private mean weighs every client the same: (3 + 6 + 9)/3 = 6 (sensitivity C/m, whatever the weights)."""
    _, plain = _round(_fedavg(), [0.0], [[3.0], [6.0], [9.0]], weights=(1, 1, 100))
    assert abs(plain[0] - 909 / 102) < 1e-5
    _, private = _round(_private(), [0.0], [[3.0], [6.0], [9.0]], weights=(1, 1, 100))
    assert private.tolist() == [6.0]


def test_a_failed_reply_is_a_zero_update_in_the_denominator_m():
    """Three sampled, one fails: (3 + 6 + 0)/3 = 3 from sent = 0, not the mean of two, 4.5."""
    dp = _private()
    list(dp.configure_train(1, ArrayRecord({"w": Array(np.zeros(1, dtype=np.float32))}), ConfigRecord(),
                            FakeGrid(NODES)))
    failed = Message(Error(code=0, reason="client error"), reply_to=train_request(NODES[2]))
    output, _ = dp.aggregate_train(1, [train_reply(NODES[0], [3.0]), train_reply(NODES[1], [6.0]), failed])
    assert output["w"].numpy().tolist() == [3.0]
    assert [failure.partition_id for failure in dp.round_failures] == [2]


def test_without_noise_and_with_a_norm_no_update_reaches_the_output_has_the_bits_of_the_uniform_mean():
    rng = np.random.default_rng(3)
    sent, models = rng.normal(size=5).astype(np.float32), rng.normal(size=(3, 5)).astype(np.float32)
    _, private = _round(_private(), sent, list(models), weights=(7, 1, 2))
    uniform = sent + ((models[0] - sent) + (models[1] - sent) + (models[2] - sent)) / np.float32(3)
    assert private.dtype == np.float32 and private.tobytes() == uniform.tobytes()


def test_the_noise_has_std_sigma_c_over_m_is_seeded_by_seed_and_round_and_leaves_numpys_generator_alone():
    size = 40_000
    zeros = [np.zeros(size)] * 3

    def noise(seed, server_round):
        return _round(_private(sigma=1.5, norm=2.0, seed=seed), np.zeros(size), zeros, server_round)[1]

    state = np.random.get_state()[1].copy()
    first = noise(7, 2)
    assert np.array_equal(np.random.get_state()[1], state)  # the global generator is as it was
    assert abs(first.std() / (1.5 * 2.0 / 3) - 1) < 0.02 and abs(first.mean()) < 0.02
    assert first.tobytes() == noise(7, 2).tobytes()
    assert first.tobytes() != noise(7, 3).tobytes() and first.tobytes() != noise(8, 2).tobytes()


def test_a_server_optimiser_steps_on_the_noisy_mean():
    """FedAdam under DP: the noise is on the mean of the clipped updates, and the optimiser's
    step (Reddi et al.: m = 0.1·Δ, v = 0.01·Δ², w + η·m/(√v + τ)) takes that mean as its target."""
    from strategies.fedopt import FedAdam

    adam = FedAdam(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0, eta=0.01,
                   tau=1e-3, beta_1=0.9, beta_2=0.99)
    adam.bind_partitions({node: p for p, node in enumerate(NODES)}, len(NODES), seed=0)
    dp = _private(adam, sigma=1.0, norm=1.0)
    sent = np.array([0.5, -0.5], dtype=np.float32)
    _, output = _round(dp, sent, [[3.5, -0.5], [0.5, 0.5], [0.5, -0.5]])
    mean = dp.round_mean["w"].numpy()
    noise = mean - (sent + np.array([1.0 + 0.0 + 0.0, 0.0 + 1.0 + 0.0], dtype=np.float32) / 3)
    assert np.all(np.abs(noise) > 1e-4)  # the mean the step took is noisy …
    delta = (mean - sent).astype(np.float64)
    step = sent + 0.01 * (0.1 * delta) / (np.sqrt(0.01 * delta**2) + 1e-3)
    np.testing.assert_allclose(output, step, rtol=1e-5)  # … and the step is the output, with no noise after it


def test_a_strategy_that_aggregates_without_the_private_mean_stops_the_run():
    """A base that computes its own mean (declared dp_aggregate = "mean" in error) is caught."""

    class OwnMean(FedAvg):
        def aggregate_accepted(self, server_round, replies):
            return ArrayRecord({"w": Array(np.zeros(1, dtype=np.float32))}), None

    base = OwnMean(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=0, min_available_nodes=0)
    base.bind_partitions({node: p for p, node in enumerate(NODES)}, len(NODES), seed=0)
    with pytest.raises(PrivacyNotApplied, match="OwnMean aggregated without server-side DP's private mean"):
        _round(_private(base), [0.0], [[1.0]] * 3)


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

    noise_free = run(_ima(_fedavg()))
    inside = _ima(_private(sigma=1.0))
    inside_outputs = run(inside)
    noise = [inside_outputs[0] - [1.0, 2.0], None]
    # Round 2's base model is (3, 0) plus round 2's noise; the output averages both noisy base models.
    noise[1] = inside.base_arrays["w"].numpy() - [3.0, 0.0]
    np.testing.assert_allclose(inside_outputs[1], (np.array([1.0, 2.0]) + noise[0] + [3.0, 0.0] + noise[1]) / 2, rtol=1e-5)

    outside = _private(_ima(_fedavg()), sigma=1.0)
    outside_outputs = run(outside)
    # The same seeds: round 1's noise on the base model, round 2's on the average of noise-free base models.
    np.testing.assert_array_equal(outside_outputs[0], inside_outputs[0])
    np.testing.assert_allclose(outside_outputs[1], noise_free[1] + noise[1], rtol=1e-5)
    base, average = outside.round_models(ArrayRecord({"w": Array(outside_outputs[1])}))
    assert average["w"].numpy().tobytes() == outside_outputs[1].tobytes()  # the released average is the noisy one
    np.testing.assert_allclose(base["w"].numpy(), [3.0, 0.0], atol=1e-6)  # IMA's window holds noise-free base models


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
    # the left-out reply is a zero update in the denominator m = 3; the weights do not count
    np.testing.assert_allclose(output["w"].numpy(), 1.0 + (np.array([0.6, 0.8]) + np.array([0.0, 1.0])) / 3, rtol=1e-6)


def test_a_method_whose_aggregate_is_not_a_mean_is_refused_by_its_declaration():
    """FedNova's normalisation, FedDyn's h, FedGMA's mask, …: declared dp_aggregate = 'own', each
    refused in one line; the mean and step-on-mean methods run."""
    from strategies.methods.registry import METHODS_BY_NAME

    own = {name for name, spec in METHODS_BY_NAME.items() if spec.dp_aggregate == "own" and not spec.reply_records}
    assert {"fednova", "feddyn", "fedgma", "fedavg-clip", "fedswa", "fedacg", "adabest", "fedcm"} <= own
    for name in own:
        keys = {"strategy": name, "momentum": 0.0, "dp-clipping-norm": 1.0}
        keys.update({"model": "resnet20-gn"} if METHODS_BY_NAME[name].model_needs == "slimmable-residual" else {})
        with pytest.raises(ConfigError, match=f"strategy = '{name}' aggregates by its own rule") as refused:
            resolve_config({}, keys)
        assert "\n" not in str(refused.value) and "allowed: dp-clipping-norm = 0, or one of" in str(refused.value)
    for name in ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "moon", "fedlesam"):
        resolve_config({}, {"strategy": name, "momentum": 0.0, "dp-clipping-norm": 1.0})


@pytest.mark.parametrize(("keys", "phrase"), [
    ({"strategy": "fedadam"}, "after strategy = 'fedadam''s server step"),
    ({"strategy": "fedavgm"}, "after strategy = 'fedavgm''s server step"),
    ({"averaging": "wima"}, "an average of noise-free base models that no client receives"),
    ({"averaging": "swa"}, "an average of noise-free base models that no client receives"),
    ({"averaging": "ema"}, "an average of noise-free base models that no client receives"),
    ({"avg-subset": "classifier"}, "mixes the average's and the newest base model's parameters"),
])
def test_outside_is_refused_where_a_release_could_move_by_more_than_c_over_m(keys, phrase):
    base = {"averaging": "ima", "window": 2, "dp-clipping-norm": 1.0, "dp-order": "outside"}
    with pytest.raises(ConfigError, match=phrase):
        resolve_config({}, {**base, **keys})
    resolve_config({}, {**base, **keys, "dp-order": "inside"})


def test_outside_runs_where_the_rule_sends_its_average():
    for averaging in ("ima", "wima", "ema"):
        resolve_config({}, {"averaging": averaging, "window": 2, "avg-feedback": True, "dp-clipping-norm": 1.0,
                            "dp-order": "outside"})


@pytest.mark.parametrize(("model", "instead"), [("resnet18-bn", "resnet18-gn"), ("resnet56-bn", "resnet56")])
def test_a_batchnorm_model_is_refused_under_dp_naming_its_group_norm_counterpart(model, instead):
    keys = {"dataset": "digits", "model": model, "dp-clipping-norm": 1.0}
    with pytest.raises(ConfigError, match=f"'model' = '{model}' holds buffers") as refused:
        resolve_config({}, keys)
    assert f"allowed: the GroupNorm model '{instead}'" in str(refused.value) and "\n" not in str(refused.value)
    resolve_config({}, {**keys, "dp-clipping-norm": 0.0})
    resolve_config({}, {**keys, "model": instead})


def test_the_built_models_buffers_are_refused_as_the_server_builds_it():
    """The ServerApp's check on the model as built (a plug-in's, a hub set's): any buffer refuses."""
    from strategies.config import refuse_buffers_under_dp

    config = resolve_config({}, {"dp-clipping-norm": 1.0})
    refuse_buffers_under_dp("my-net", config, [])
    with pytest.raises(ConfigError, match=r"'model' = 'my-net' holds buffers \(bn.running_mean\).*GroupNorm in place"):
        refuse_buffers_under_dp("my-net", config, ["bn.running_mean"])


def test_the_accountant_gives_epsilon_after_each_release_where_it_applies_and_says_why_not_elsewhere():
    """Inside: Flower's RDP accountant, m = 3 of 10 without replacement (replace-one: multiplier σ/2);
    outside: no amplification (multiplier σ); σ = 0: none, and why."""
    from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    from strategies.privacy import privacy_accounting, privacy_summary

    keys = {"num-clients": 10, "participation": 0.3, "dp-clipping-norm": 1.0, "dp-noise-multiplier": 1.2}
    inside = privacy_accounting(resolve_config({}, keys), 3)
    reference = RdpAccountant(PrivacyConfig(1e-5, 10, NeighboringRelation.REPLACE_ONE, SamplingMethod.WITHOUT_REPLACEMENT))
    reference.compose(GaussianPrivacyEvent(0.6, 3, 10), count=4)
    assert inside.epsilon(4) == pytest.approx(reference.get_epsilon(1e-5), rel=1e-12)
    assert 0 < inside.epsilon(1) < inside.epsilon(4) < float("inf") and inside.epsilon(0) == 0.0
    outside = privacy_accounting(resolve_config({}, {**keys, "averaging": "ima", "window": 2, "dp-order": "outside"}), 3)
    assert (outside.sampling_method, outside.noise_multiplier) == ("no-amplification", 1.2)
    silent = privacy_accounting(resolve_config({}, {**keys, "dp-noise-multiplier": 0.0}), 3)
    assert np.isnan(silent.epsilon(4)) and "no noise is added" in silent.reason
    summary = privacy_summary(resolve_config({}, keys))
    assert summary["noise-std"] == pytest.approx(1.2 / 3) and summary["sampling"] == "without-replacement"

    dp = ServerSideDP(_fedavg(), noise_multiplier=1.2, clipping_norm=1.0, num_sampled_clients=3, seed=0,
                      accounting=inside)
    for server_round in (1, 2):
        _round(dp, [0.0], [[1.0]] * 3, server_round)
        assert dp.round_clients["dp-epsilon"] == inside.epsilon(server_round)
    restored = ServerSideDP(_fedavg(), noise_multiplier=1.2, clipping_norm=1.0, num_sampled_clients=3, seed=0,
                            accounting=inside)
    restored.load_checkpoint_state(dp.checkpoint_state())
    assert restored.releases == 2
