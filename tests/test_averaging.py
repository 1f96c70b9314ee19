"""The averaging component (IMA, WIMA, SWA) on tiny numpy models, by hand."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from strategies.arrays import to_arrays, to_numpy
from strategies.averaging import ModelAveraging, window_mean
from strategies.checkpoint import load_checkpoint, load_strategy_state, save_checkpoint, strategy_state
from strategies.fedavg import FedAvg
from strategies.fedavgm import FedAvgM
from strategies.fedopt import FedAdam
from strategies.schedules import ClientSchedule
from tests.fakes import COHORT, FakeGrid

pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py


class ScriptedBase:
    """A base strategy whose round-r global model is given (the 'replies' are the model)."""

    def configure_train(self, server_round, arrays, config, grid):
        return []

    def aggregate_train(self, server_round, replies):
        return replies, None


def model(*values, head=None) -> ArrayRecord:
    arrays = {"features.w": np.asarray(values, dtype=np.float32)}
    if head is not None:
        arrays["classifier.w"] = np.asarray(head, dtype=np.float32)
    return to_arrays(arrays)


def run_rounds(component, outputs, first_round=1):
    sent = []
    for r, base_model in enumerate(outputs, start=first_round):
        arrays, _ = component.aggregate_train(r, base_model)
        sent.append(to_numpy(arrays)["features.w"].tolist())
    return sent


def test_the_window_mean_is_the_elementwise_mean_of_its_models():
    mean = window_mean([{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 6.0])}, {"w": np.array([2.0, 1.0])}])
    assert mean["w"].tolist() == [2.0, 3.0]


def test_ima_fills_from_ts_minus_p_plus_1_and_feeds_back_from_ts():
    ima = ModelAveraging(ScriptedBase(), window=3, start_round=5, feedback=True)
    assert [r for r in range(1, 9) if ima.is_sampled(r)] == [3, 4, 5, 6, 7, 8]
    sent = run_rounds(ima, [model(float(r)) for r in range(1, 8)])
    # Rounds 1-4: base model r; round 5: mean(3,4,5) = 4; 6: mean(4,5,6) = 5; 7: 6.
    assert sent == [[1.0], [2.0], [3.0], [4.0], [4.0], [5.0], [6.0]]
    assert ima.sends_average


def test_wima_is_a_shadow_model_from_round_w():
    wima = ModelAveraging(ScriptedBase(), window=2, start_round=2, feedback=False)
    sent = run_rounds(wima, [model(1.0), model(3.0), model(7.0)])
    assert sent == [[1.0], [3.0], [7.0]]  # clients keep receiving the base model
    assert to_numpy(wima.averaged_arrays)["features.w"].tolist() == [5.0]  # mean(3, 7)
    assert not wima.sends_average


def test_averaging_only_a_subset_keeps_the_rest_from_the_base():
    features = ModelAveraging(ScriptedBase(), window=2, start_round=2, feedback=False, subset="features")
    run_rounds(features, [model(1.0, head=[10.0]), model(3.0, head=[20.0])])
    averaged = to_numpy(features.averaged_arrays)
    assert averaged["features.w"].tolist() == [2.0] and averaged["classifier.w"].tolist() == [20.0]
    head = ModelAveraging(ScriptedBase(), window=2, start_round=2, feedback=False, subset="classifier")
    run_rounds(head, [model(1.0, head=[10.0]), model(3.0, head=[20.0])])
    averaged = to_numpy(head.averaged_arrays)
    assert averaged["features.w"].tolist() == [3.0] and averaged["classifier.w"].tolist() == [15.0]


def test_swa_running_average_at_cycle_ends():
    swa = ModelAveraging(ScriptedBase(), window=None, start_round=3, feedback=False, sample_every=2)
    assert [r for r in range(1, 9) if swa.is_sampled(r)] == [4, 6, 8]
    averages = []
    for r in range(1, 9):
        swa.aggregate_train(r, model(float(r)))
        averages.append(None if swa.averaged_arrays is None else to_numpy(swa.averaged_arrays)["features.w"][0])
    # n = 1: 4; n = 2: (1·4 + 6)/2 = 5; n = 3: (2·5 + 8)/3 = 6
    assert averages == [None, None, None, 4.0, 4.0, 5.0, 5.0, 6.0]
    assert swa.num_averaged == 3


def test_swa_official_code_samples_c_rounds_after_its_start_in_the_starts_phase():
    # fedsam's main.py with 0-based i, s = 2 (Basin round 3), c = 2: updates after i = 4, 6
    # (rounds 5, 7), the first with weight 1/(0 + 1) = 1: the SWA model is that round's model.
    from experiments.runtime.run_config import resolve_config
    from strategies.methods.strategy_builder import build_strategy

    config = resolve_config({"averaging": "swa", "avg-start": 3, "swa-cycle": 2, "swa-variant": "official-code",
                             "num-rounds": 8})
    swa = build_strategy(config)
    assert [r for r in range(1, 9) if swa.is_sampled(r)] == [5, 7]
    swa.base = ScriptedBase()
    averages = []
    for r in range(1, 9):
        swa.aggregate_train(r, model(float(r)))
        averages.append(None if swa.averaged_arrays is None else to_numpy(swa.averaged_arrays)["features.w"][0])
    assert averages == [None, None, None, None, 5.0, 5.0, 6.0, 6.0]
    paper = build_strategy({**config, "swa-variant": "paper"})
    assert [r for r in range(1, 9) if paper.is_sampled(r)] == [4, 6, 8]  # ends of the lr cycles


def _request(node_id):
    return Message(content=RecordDict({"config": ConfigRecord()}), dst_node_id=node_id, message_type=MessageType.TRAIN)


def _replies(client_models, sizes):
    return [
        Message(
            content=RecordDict({
                "arrays": ArrayRecord({"w": Array(np.asarray(w, dtype=np.float64))}),
                "metrics": MetricRecord({"num-examples": n}),
            }),
            reply_to=_request(100 + i),
        )
        for i, (w, n) in enumerate(zip(client_models, sizes))
    ]


def _bound(strategy, num_clients=3):
    strategy.bind_partitions({100 + i: i for i in range(num_clients)}, num_clients, 0)
    return strategy


def test_wima_equals_first_model_minus_position_weighted_pseudo_gradients():
    """METHODS.md §1.2: w_WIMA^{t'+W} = w^{t'} − Σ_{τ=t'}^{t'+W−1} ((t'+W−τ)/W) Δ^τ for FedAvg."""
    rng = np.random.default_rng(0)
    W, sizes = 4, [1, 2, 5]
    wima = ModelAveraging(_bound(FedAvg(**COHORT)), window=W, start_round=W, feedback=False)
    w = rng.normal(size=3)
    first, deltas = w.copy(), []
    for server_round in range(1, W + 1):
        clients = [w - rng.normal(scale=0.1, size=3) for _ in sizes]
        delta = sum(n / sum(sizes) * (w - c) for n, c in zip(sizes, clients))
        deltas.append(delta)
        arrays, _ = wima.aggregate_train(server_round, _replies(clients, sizes))
        w = arrays["w"].numpy()
    expected = first - sum((W - tau) / W * d for tau, d in enumerate(deltas))  # t' = 0
    np.testing.assert_allclose(to_numpy(wima.averaged_arrays)["w"], expected, rtol=1e-10, atol=1e-12)


def test_fedadam_with_ima_takes_its_pseudo_gradient_against_the_fed_back_model():
    ima = ModelAveraging(_bound(FedAdam(**COHORT, eta=0.1, eta_l=0.1)), window=2, start_round=2, feedback=True)
    sent = ArrayRecord({"w": Array(np.zeros(3))})
    for server_round in (1, 2, 3):
        ima.configure_train(server_round, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
        assert np.array_equal(ima.base.current_arrays["w"], sent["w"].numpy())
        clients = [sent["w"].numpy() + 1.0 + i for i in range(3)]
        sent, _ = ima.aggregate_train(server_round, _replies(clients, [1, 1, 1]))
    assert ima.sends_average


def test_fedavgm_pseudo_gradient_is_anchored_to_the_sent_model():
    # beta = 0, eta = 0.5: w^{t+1} = w_sent − 0.5 (w_sent − FMA) = 0.5 w_sent + 0.5 FMA.
    strategy = _bound(FedAvgM(**COHORT, server_learning_rate=0.5, server_momentum=0.0))
    strategy.configure_train(1, ArrayRecord({"w": Array(np.zeros(1))}), ConfigRecord(), FakeGrid([100, 101, 102]))
    strategy.aggregate_train(1, _replies([[2.0], [2.0], [2.0]], [1, 1, 1]))
    sent = ArrayRecord({"w": Array(np.array([10.0]))})  # e.g. an IMA average, not FedAvgM's own model
    strategy.configure_train(2, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
    result, _ = strategy.aggregate_train(2, _replies([[4.0], [4.0], [4.0]], [1, 1, 1]))
    assert result["w"].numpy().tolist() == [7.0]


def test_checkpoint_restore_continues_identically(tmp_path):
    def fresh():
        return ModelAveraging(_bound(FedAdam(**COHORT, eta=0.1, eta_l=0.1)), window=3, start_round=3, feedback=True)

    rng = np.random.default_rng(0)
    rounds = [[rng.normal(size=4) for _ in range(3)] for _ in range(6)]

    def play(component, sent, round_numbers):
        for r in round_numbers:
            component.configure_train(r, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
            sent, _ = component.aggregate_train(r, _replies([sent["w"].numpy() + d for d in rounds[r - 1]], [1, 2, 3]))
        return sent

    start = ArrayRecord({"w": Array(np.zeros(4))})
    uninterrupted = play(fresh(), start, range(1, 7))

    first = fresh()
    midway = play(first, start, range(1, 4))
    save_checkpoint(tmp_path / "ckpt.pt", {"arrays": midway, "strategy": strategy_state(first)})
    restored = fresh()
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    load_strategy_state(restored, checkpoint["strategy"])
    resumed = play(restored, checkpoint["arrays"], range(4, 7))
    assert resumed["w"].numpy().tobytes() == uninterrupted["w"].numpy().tobytes()


def test_ima_exploration_and_swa_schedules():
    base = dict(lr=0.01, decay=0.99, local_epochs=5)
    ima = ClientSchedule(**base, exploration="exponential", exploration_start=11, exploration_decay=0.97)
    assert ima(10)[0] == pytest.approx(0.01 * 0.99**9)
    assert ima(13)[0] == pytest.approx(0.01 * 0.99**10 * 0.97**2)
    assert ClientSchedule(**base, exploration="constant", exploration_start=11)(12) == (5e-5, 5)
    cyclic = ClientSchedule(**base, exploration="cyclic", exploration_start=11)
    assert cyclic(11)[0] == pytest.approx(1e-2) and cyclic(30)[0] == pytest.approx(5e-5) and cyclic(31)[0] == pytest.approx(1e-2)
    epoch = ClientSchedule(**base, exploration="epoch", exploration_start=11)
    # The IMA code: E −= 1 at t − t_s = 20, 40, … (not already at t_s).
    assert [epoch(r)[1] for r in (10, 11, 30, 31, 50, 51, 200)] == [5, 5, 5, 4, 4, 3, 1]
    # The IMA code's forms: cycles from lr_{t_s} = 0.01·0.99^10 down to 5e-5; the epoch
    # decay's lr restarts at t_s from lr_0: 0.01·0.99^(t − t_s).
    cyclic_code = ClientSchedule(**base, exploration="cyclic-official-code", exploration_start=11)
    assert cyclic_code(11)[0] == pytest.approx(0.01 * 0.99**10) and cyclic_code(30)[0] == pytest.approx(5e-5)
    assert cyclic_code(20)[0] == pytest.approx(0.01 * 0.99**10 - (0.01 * 0.99**10 - 5e-5) * 9 / 19)
    epoch_code = ClientSchedule(**base, exploration="epoch-official-code", exploration_start=11)
    assert epoch_code(11) == (pytest.approx(0.01), 5) and epoch_code(31) == (pytest.approx(0.01 * 0.99**20), 4)
    assert epoch_code(10)[0] == pytest.approx(0.01 * 0.99**9)
    swa = ClientSchedule(lr=0.1, decay=1.0, local_epochs=1, swa_start=11, swa_cycle=10)
    # t = round − 1; τ = ((t mod 10) + 1)/10; lr = (1 − τ)·0.1 + τ·0.001
    assert swa(11)[0] == pytest.approx(0.9 * 0.1 + 0.1 * 0.001)
    assert swa(20)[0] == pytest.approx(0.001)
    assert swa(5)[0] == pytest.approx(0.1)


# -- IMA on adaptive server optimisers: the IMA authors' ordering ------------------------
def _ima_on(strategy: str, **keys):
    from experiments.runtime.run_config import resolve_config
    from strategies.methods.strategy_builder import build_strategy

    config = resolve_config({"strategy": strategy, "averaging": "ima", "window": 2, "avg-start": 3, "num-rounds": 5,
                             "server-lr": 0.1, **keys})
    ima = build_strategy(config)
    _bound(ima.base)
    return ima


def _adam(m, v, delta, beta_1=0.9, beta_2=0.99):
    m = beta_1 * m + (1 - beta_1) * delta
    return m, beta_2 * v + (1 - beta_2) * delta**2


def _play_offsets(ima, offsets):
    """Round r's clients return (model sent) + offsets[r−1][i], all weighted 1."""
    sent, fmas = ArrayRecord({"w": Array(np.zeros(1))}), []
    for server_round, round_offsets in enumerate(offsets, start=1):
        ima.configure_train(server_round, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
        w = sent["w"].numpy()
        fmas.append(w + np.mean(round_offsets))
        sent, _ = ima.aggregate_train(server_round, _replies([w + o for o in round_offsets], [1, 1, 1]))
    return sent, fmas


def test_ima_on_fedadam_targets_the_window_mean_of_fma_aggregates_and_resets_the_moments():
    """IMA authors' ``fedadam+ima``: window of FMAs; from t_s, Δ = mean − w with m = v = 0 first."""
    ima = _ima_on("fedadam")
    offsets = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0], [-1.0, 0.0, 1.0]]
    eta, tau = 0.1, 1e-3
    # Rounds 1 and 2 by hand: plain FedAdam steps towards the FMA.
    w, m, v = 0.0, 0.0, 0.0
    for round_offsets in offsets[:2]:
        m, v = _adam(m, v, np.mean(round_offsets))
        w = w + eta * m / (np.sqrt(v) + tau)
    sent, fmas = _play_offsets(ima, offsets)
    fma2, fma3 = fmas[1][0], fmas[2][0]
    assert fma3 == pytest.approx(w)  # round 3's offsets average to 0: its FMA is the model sent, w2
    # Round 3 = t_s: moments reset, the step targets mean(FMA_2, FMA_3).
    delta = (fma2 + fma3) / 2 - w
    m3, v3 = _adam(0.0, 0.0, delta)
    expected = w + eta * m3 / (np.sqrt(v3) + tau)
    assert sent["w"].numpy()[0] == pytest.approx(expected, rel=1e-12)
    assert ima.base.m_t["w"][0] == pytest.approx(0.1 * delta, rel=1e-12)  # no trace of rounds 1-2's m
    assert ima.base.v_t["w"][0] == pytest.approx(0.01 * delta**2, rel=1e-12)
    assert to_numpy(ima.base_arrays)["w"][0] == pytest.approx(fma3)  # the FMA, "before moving averaging"
    assert to_numpy(ima.averaged_arrays)["w"][0] == pytest.approx(expected)  # the optimiser's output, sent
    assert ima.sends_average


def test_ima_on_fedadagrad_keeps_its_accumulator_and_output_window_is_the_older_ordering():
    offsets = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0], [-1.0, 0.0, 1.0]]
    adagrad = _ima_on("fedadagrad")
    _play_offsets(adagrad, offsets)
    # v = Σ Δ²: rounds 1 and 2 (Δ = 2, 4) are still in it (the authors' code resets FedAdam's and FedYogi's only).
    assert adagrad.base.v_t["w"][0] > 4.0 + 16.0
    older = _ima_on("fedadam", **{"ima-server-opt": "output-window"})
    outputs = []
    sent = ArrayRecord({"w": Array(np.zeros(1))})
    for server_round, round_offsets in enumerate(offsets, start=1):
        older.configure_train(server_round, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
        w = sent["w"].numpy()
        sent, _ = older.aggregate_train(server_round, _replies([w + o for o in round_offsets], [1, 1, 1]))
        outputs.append(to_numpy(older.base_arrays)["w"][0])
    # Round 3 sends the mean of FedAdam's outputs of rounds 2 and 3 (the window holds outputs).
    assert sent["w"].numpy()[0] == pytest.approx((outputs[1] + outputs[2]) / 2, rel=1e-12)
    default, _ = _play_offsets(_ima_on("fedadam"), offsets)
    assert default["w"].numpy()[0] != pytest.approx(sent["w"].numpy()[0])


def test_ima_on_fedadam_checkpoint_keeps_the_reset():
    offsets = [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0], [-1.0, 0.0, 1.0], [0.5, 0.5, 2.0], [1.0, -2.0, 0.0]]
    whole, _ = _play_offsets(_ima_on("fedadam"), offsets)
    first = _ima_on("fedadam")
    sent, _ = _play_offsets(first, offsets[:3])
    restored = _ima_on("fedadam")
    load_strategy_state(restored, strategy_state(first))
    assert restored.moments_reset
    for server_round in (4, 5):
        restored.configure_train(server_round, sent, ConfigRecord(), FakeGrid([100, 101, 102]))
        w = sent["w"].numpy()
        sent, _ = restored.aggregate_train(server_round, _replies([w + o for o in offsets[server_round - 1]], [1, 1, 1]))
    assert sent["w"].numpy().tobytes() == whole["w"].numpy().tobytes()


