"""Real `flwr run` jobs: results written, bitwise reproducible, failures visible."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import Launched

from experiments.runtime.flower_log import startup_stage
from experiments.runtime.launch import launch
from experiments.runtime.run_config import load_preset
from experiments.runtime.run_endings import RunFailed
from strategies.methods.registry import end_to_end_runs

pytestmark = pytest.mark.slow  # real `flwr run` jobs: the second tier (.ci/run)

SMALL = {"num-clients": 4, "participation": 0.5, "num-rounds": 3, "local-epochs": 1, "device": "cpu"}

# Every declared method and averaging rule as a real `flwr run`: the smoke runs their
# declarations give (`smoke_runs`), most composed with an averaging rule; a data set
# ``hf:{name}`` is the miniature hub set of that name (tests/miniature.py).
METHOD_RUNS = end_to_end_runs()
RUNS = {
    "fedavg": {},
    "fedavg-again": {},  # the same seed: must repeat "fedavg" bit for bit
    # Each sampled client's accuracy on a held-out quarter of its partition.
    "fedavg+client-evaluation": {"client-evaluation": 0.25, "num-rounds": 2},
    **METHOD_RUNS,
    # Heterogeneity beyond label skew, on small local copies of hub sets (tests/miniature.py):
    # Pachinko over 4 × 100 CIFAR-100-like images; feature + label skew, 3 domains × 2
    # clients; next-character prediction with the LSTM, one client per speaking role.
    "pachinko": {"dataset": "hf:{cifar100}", "model": "mlp", "partition": "pachinko"},
    "feature-skew+ima": {"dataset": "hf:{digit_five}", "model": "mlp", "partition": "dirichlet", "alpha": 1.0,
                         "min-partition-size": 2, "clients-per-domain": 2, "num-clients": 6,
                         "averaging": "ima", "window": 2, "avg-start": 2},
    "char-lstm": {"dataset": "hf:{shakespeare}", "model": "char-lstm", "partition": "natural", "num-rounds": 2,
                  "batch-size": 8, "lr": 1.0, "momentum": 0.9, "grad-clip": 5.0},
    # Server-side DP: without noise (no ε, and why); with noise, in either order around IMA.
    "fedavg+dp-no-noise": {"dp-clipping-norm": 1e6, "num-rounds": 2},
    "ima+dp-inside": {"averaging": "ima", "window": 2, "avg-start": 2, "num-rounds": 2, "dp-clipping-norm": 1.0,
                      "dp-noise-multiplier": 0.5},
    "ima+dp-outside": {"averaging": "ima", "window": 2, "avg-start": 2, "num-rounds": 2, "dp-clipping-norm": 1.0,
                       "dp-noise-multiplier": 0.5, "dp-order": "outside"},
    # A valid but absurd step size: every client reply is NaN, every round is skipped, and the
    # ServerApp raises inside Flower rather than report the untrained model.
    "nothing-trained": {"lr": 1e30, "num-rounds": 2, "participation": 1.0},
    # What the analysis tools read: every 2 rounds and the last 3, all 4 clients each round.
    "fedavg+ima-saved": {"participation": 1.0, "num-rounds": 6, "averaging": "ima", "window": 2, "avg-start": 4,
                         "save-models-every": 2, "save-models-last": 3, "round-indicators": True},
}
# What `flower_runs` launches (tests/conftest.py) for this module's tests, and the IMA paper's
# Fashion-MNIST #C=2 setup as shipped, one round.
FLOWER_RUNS = {**{name: {**SMALL, **settings} for name, settings in RUNS.items()},
               "ima-fmnist-shards": {**load_preset("ima-fmnist-shards"), "num-rounds": 1, "participation": 0.02,
                                     "data-dir": "{fashion_mnist}", "device": "cpu"}}


@pytest.mark.flower_runs("fedavg")
def test_run_writes_results_config_model_and_summary(flower_runs, data_cache):
    run = flower_runs["fedavg"]
    rows, out = run.rows(), run.out
    assert run.summary["rounds"] == 3
    assert rows["round"].tolist() == [1, 2, 3]
    assert (rows["clients-ok"] == 2).all() and (rows["clients-failed"] == 0).all()
    assert rows["test-accuracy"].between(0, 1).all() and rows["round-seconds"].gt(0).all()
    assert rows["lr"].tolist() == pytest.approx([0.05, 0.05 * 0.99, 0.05 * 0.99**2])
    assert json.loads((out / "config.json").read_text())["num-clients"] == 4
    partition = pd.read_csv(out / "partition.csv", index_col=0)
    assert len(partition) == 4 and partition["total"].sum() == 1438
    assert (out / "partition.png").stat().st_size > 1000
    state = torch.load(out / "final_model.pt", weights_only=True)
    assert "classifier.weight" in state
    # Learning happened: the final model beats chance (10 classes) clearly.
    assert rows["test-accuracy"].iloc[-1] > 0.3
    # The run's real wall time includes Flower's start-up; the start-up ends at round 1.
    summary = run.summary
    assert summary["run-seconds"] > summary["wall-seconds"] and 0 < summary["startup-seconds"] < summary["run-seconds"]
    # Start-up stages as the launcher saw them in Flower's streamed log (which lags a little).
    stages = summary["startup-stages"]
    assert list(stages.values()) == sorted(stages.values()) and 0 < stages["training round 1"] < summary["run-seconds"]
    assert (summary["last-k"], summary["last-k-requested"]) == (3, 10)  # 3 rounds, k = 10 asked
    log = (out / "flwr.log").read_text()
    assert startup_stage(log) == "training round 1"
    # Every round's line and the ServerApp's last reached flwr.log before the run's processes were stopped.
    assert all(f"[basin] round {number}/3 accuracy" in log for number in (1, 2, 3)) and "[basin] completed:" in log
    assert log.index("[basin] discovering clients") < log.index("[basin] training round 1")
    # The engine hands messages out when stored (clients/simulation_engine.py), in this Flower.
    assert "[basin] simulation engine: messages reach the client processes when stored" in log
    # Basin's flwr-simulation installed its registration of the nodes before Flower's engine ran.
    assert "[basin] simulation engine: 4 nodes registered at once" in log
    # The data set and partition the ServerApp built are in the suite's cache for the clients.
    assert any(data_cache.glob("datasets/*.npz")) and any(data_cache.glob("partitions/*.npy"))


def _documented_run_files() -> set[str]:
    """The files docs/outputs.md's table says a run folder holds (its first column)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text()
    table = text[text.index("| file | content |"):].split("\n\n")[0]
    return {name for line in table.splitlines()[2:] for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])}


@pytest.mark.flower_runs("fedavg", "fedavg+ima-saved", "fedavg+client-evaluation")
def test_a_finished_run_folder_holds_exactly_the_documented_files(flower_runs):
    """Nothing partial or temporary is left beside an atomic write, and nothing undocumented;
    the per-client file only with client-evaluation."""
    documented = _documented_run_files()
    optional = {"models/round-RRRR.pt", "client-evaluation.csv"}
    assert {"config.json", "summary.json", "checkpoint.pt"} | optional <= documented
    for name, written in (("fedavg", set()), ("fedavg+ima-saved", set()),
                          ("fedavg+client-evaluation", {"client-evaluation.csv"})):
        out = flower_runs[name].out
        found = {str(path.relative_to(out)) for path in out.rglob("*") if path.is_file()}
        saved = {path for path in found if path.startswith("models/")}
        assert found - saved == documented - optional | written, name
        assert all(re.fullmatch(r"models/round-\d{4}\.pt", path) for path in saved), saved
    assert len([path for path in (flower_runs["fedavg+ima-saved"].out / "models").iterdir()]) == 4  # rounds 2, 4, 5, 6


def _documented_names(heading: str) -> set[str]:
    """The names in the first column of docs/outputs.md's table under ``heading``."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "outputs.md").read_text()
    table = text[text.index(heading):].split("\n\n")[1]
    return {name for line in table.splitlines()[2:] for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])}


@pytest.mark.flower_runs("fedavg", "fedavg+ima-saved", "feature-skew+ima")
def test_every_column_and_key_a_run_writes_is_documented(flower_runs):
    columns = _documented_names("### The columns of `results.csv`")
    keys = _documented_names("### The keys of `summary.json`")
    for name in ("fedavg", "fedavg+ima-saved", "feature-skew+ima"):
        run = flower_runs[name]
        written = [column for column in run.rows().columns
                   if column not in columns and not (column.startswith("accuracy-") and "accuracy-<domain>" in columns)]
        assert not written, f"{name}: results.csv columns docs/outputs.md does not list: {written}"
        assert set(run.summary) - keys == set(), f"{name}: summary.json keys docs/outputs.md does not list"
        assert {"acc-last-k", "acc-best", "acc-final", "rounds-to-target"} <= set(run.summary)  # one name each


@pytest.mark.flower_runs("fedavg", "fedfa", "fedavg+client-evaluation")
def test_a_run_counts_its_traffic_and_on_request_each_clients_accuracy(flower_runs):
    from flwr.app import ArrayRecord

    fedavg = flower_runs["fedavg"]
    rows = fedavg.rows()
    model = ArrayRecord(torch.load(fedavg.out / "final_model.pt", weights_only=True))
    model_bytes = sum(len(array.data) for array in model.values())
    cohort = 2  # participation 0.5 of 4 clients
    # FedAvg: the model to each sampled client and back, every round; the run's total in the summary.
    assert (rows["bytes-sent"] == cohort * model_bytes).all() and (rows["bytes-received"] == cohort * model_bytes).all()
    assert (fedavg.summary["bytes-sent"], fedavg.summary["bytes-received"]) == (3 * cohort * model_bytes,) * 2
    # FedFA sends its class anchors beside the same model: its traffic shows them.
    fedfa = flower_runs["fedfa"].rows()
    assert (fedfa["bytes-sent"] > cohort * model_bytes).all() and (fedfa["bytes-received"] > cohort * model_bytes).all()
    # Per-client accuracy is opt-in: empty by default, filled with client-evaluation > 0.
    columns = ["client-accuracy-mean", "client-accuracy-worst-10pct", "client-accuracy-std"]
    assert rows[columns].isna().all().all()
    evaluated = flower_runs["fedavg+client-evaluation"].rows()
    assert evaluated[columns].notna().all().all() and evaluated[columns[:2]].stack().between(0, 1).all()
    assert (evaluated["client-accuracy-worst-10pct"] <= evaluated["client-accuracy-mean"]).all()
    # … and each client's own score, through Flower, one row per accepted client and round.
    clients = pd.read_csv(flower_runs["fedavg+client-evaluation"].out / "client-evaluation.csv")
    assert clients.groupby("round").size().tolist() == evaluated["clients-ok"].tolist()
    assert clients.groupby("round")["accuracy"].mean().tolist() == pytest.approx(evaluated[columns[0]].tolist())


@pytest.mark.flower_runs("fedavg")
def test_with_every_speed_up_off_flowers_own_code_gives_the_same_bits(flower_runs, tmp_path, monkeypatch):
    """BASIN_SPEEDUPS=off: Flower's own `flwr`, `flwr-simulation`, engine, Ray start and
    FedAvg mean; the speed-ups change when things happen, never what is computed."""
    monkeypatch.setenv("BASIN_SPEEDUPS", "off")
    fast = flower_runs["fedavg"]
    summary = launch(fast.config, tmp_path, progress=False)
    assert summary["status"] == "completed" and summary["warm-simulation-process"] is False
    log = (tmp_path / "flwr.log").read_text()
    assert "[basin] simulation engine" not in log and "[basin] discovering clients" in log
    columns = ["round", "lr", "test-accuracy", "test-loss", "train-loss", "clients-ok", "local-steps"]
    assert pd.read_csv(tmp_path / "results.csv")[columns].to_csv() == fast.rows()[columns].to_csv()
    ours, flowers = (torch.load(out / "final_model.pt", weights_only=True) for out in (fast.out, tmp_path))
    assert all(torch.equal(ours[name], flowers[name]) for name in ours)


def _same_bits(first: Launched, second: Launched) -> None:
    columns = ["round", "lr", "test-accuracy", "test-loss", "train-loss", "clients-ok", "local-steps"]
    assert first.rows()[columns].to_csv() == second.rows()[columns].to_csv()
    model_a = torch.load(first.out / "final_model.pt", weights_only=True)
    model_b = torch.load(second.out / "final_model.pt", weights_only=True)
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)


@pytest.mark.flower_runs("fedavg", "fedavg-again")
def test_same_seed_gives_bitwise_identical_rounds_and_model(flower_runs):
    # The two runs ran at the same time, each with its own SuperLink, on the job's Ray cluster.
    _same_bits(flower_runs["fedavg"], flower_runs["fedavg-again"])


@pytest.mark.flower_runs("fedavg+dp-no-noise", "ima+dp-inside", "ima+dp-outside")
def test_server_side_dp_runs_in_either_order_around_ima_and_accounts_its_releases(flower_runs):
    """Real `flwr run`s under DP: ε after each release in results.csv (inside: sampling without
    replacement; outside: no amplification), none and why without noise (summary.json)."""
    silent = flower_runs["fedavg+dp-no-noise"]
    assert silent.rows()["dp-epsilon"].isna().all()
    assert "no noise is added" in silent.summary["privacy"]["why-not"]
    inside, outside = flower_runs["ima+dp-inside"].rows(), flower_runs["ima+dp-outside"].rows()
    for rows in (inside, outside):
        assert rows["round"].tolist() == [1, 2] and rows["sent-model"].tolist() == ["base", "averaged"]
        assert 0 < rows["dp-epsilon"].iloc[0] < rows["dp-epsilon"].iloc[1] < float("inf")
    assert flower_runs["ima+dp-inside"].summary["privacy"]["sampling"] == "without-replacement"
    assert flower_runs["ima+dp-outside"].summary["privacy"]["sampling"] == "no-amplification"
    assert flower_runs["ima+dp-inside"].summary["dp-epsilon"] == inside["dp-epsilon"].iloc[1]
    # Round 1 is the same release in both orders (IMA passes the base model on); round 2's is
    # not (inside: the mean of two noisy models; outside: one draw of noise on the mean).
    assert inside["test-accuracy"].iloc[0] == outside["test-accuracy"].iloc[0]
    finals = [torch.load(flower_runs[name].out / "final_model.pt", weights_only=True)
              for name in ("ima+dp-inside", "ima+dp-outside")]
    assert not all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.mark.flower_runs("nothing-trained")
def test_a_run_that_trained_nothing_failed_saying_why(flower_runs):
    """What the command then prints after "error: " and exits 1 with (tests/test_run_command_endings.py)."""
    run = flower_runs["nothing-trained"]
    with pytest.raises(RunFailed) as failed:
        run.completed()
    headline = str(failed.value).splitlines()[0]
    assert headline.startswith(f"run in {run.out} failed: ")
    assert "NothingTrained: no round trained the model: all client replies were non-finite in every round from " \
           "round 1 on (round 1: partition 0 (node " in headline
    assert headline.endswith("is lr = 1e+30 too large?")
    summary = json.loads((run.out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds"] == 2 and summary["rounds-skipped"] == 2
    assert "NothingTrained" in summary["error"] and not (run.out / "final_model.pt").exists()


@pytest.mark.flower_runs("ima-fmnist-shards")
def test_fashion_mnist_ima_preset_runs_a_round(flower_runs):
    """The paper's setup as shipped (100 shard clients, 5 local epochs of batches of 50), one
    round of 2 clients (participation 0.02): 10 clients took 33 s for 2 rounds on 2 cores."""
    run = flower_runs["ima-fmnist-shards"]
    rows = run.rows()
    assert run.summary["status"] == "completed"
    assert rows["clients-ok"].tolist() == [2]
    assert (rows["local-steps"] == 5 * 600 / 50).all()  # #C=2: 300·2 samples per client
    # Two clients of two classes each: 0.208 after their round (0.114 after a second, whose
    # clients hold other classes); chance is 0.1.
    assert rows["test-accuracy"].iloc[-1] > 0.15


@pytest.mark.flower_runs("fedprox+wima")
def test_wima_on_fedprox(flower_runs):
    rows = flower_runs["fedprox+wima"].rows()
    # WIMA: a shadow model from round W = 2 on; clients keep receiving the base model.
    assert rows["sent-model"].tolist() == ["base"] * 4
    assert rows["averaged-accuracy"].isna().tolist() == [True, False, False, False]


@pytest.mark.parametrize("method", [pytest.param(method, marks=pytest.mark.flower_runs(method)) for method in METHOD_RUNS])
def test_every_method_runs_end_to_end(flower_runs, method):
    run = flower_runs[method]
    rows, config = run.rows(), run.config
    assert (rows["clients-ok"] == round(config["participation"] * 4)).all() and (rows["clients-failed"] == 0).all()
    assert rows["test-accuracy"].notna().all() and rows["train-loss"].notna().all()
    assert np.isfinite(rows[["test-loss", "train-loss"]].to_numpy()).all()
    name = config["strategy"]
    if name != "fedalign":
        # FedAlign is left out: its rescaled Lipschitz term's gradient grows like
        # CE/|σ_S − σ_F| as the two constants meet (the authors' code, clipped at 10), so it
        # dominates the first local steps of a network trained from scratch.
        assert rows["test-accuracy"].iloc[-1] > 0.15  # learning (chance is 0.1)
    if name in ("feddyn", "fedmoswa", "adabest") and config["participation"] == 1.0:
        # Stateful clients: their state is empty in round 1 and carried into every later round.
        assert rows["client-state-norm"].iloc[0] == 0.0
        assert (rows["client-state-norm"].iloc[1:] > 0).all()
    if config["fedswa-variant"] == "official-code":
        assert rows["local-steps"].tolist() == pytest.approx([50, 50])  # the authors' code: K = 50 steps
        # cosine round lr over 2 rounds: lr, then lr·(1 + cos(π/2))/2
        assert rows["lr"].tolist() == pytest.approx([0.05, 0.025])


ANALYSIS_OUTPUTS = {
    "landscape": ["landscape.csv", "landscape.png"],
    "interpolate": ["interpolation.csv", "interpolation.png"],
    "decompose": ["decomposition.csv", "error-vs-models.csv", "decomposition.png"],
    "hessian": ["hessian.csv", "hessian-block-traces.csv", "hn-hd.csv", "hn-hd-{run}.png", "eigen-surface-{run}.png"],
    "stability": ["stability.csv", "stability.png"],
}


@pytest.mark.flower_runs("fedavg+ima-saved")
def test_a_run_saves_models_and_indicators_and_every_analysis_tool_reads_them(flower_runs):
    from experiments.analysis.__main__ import main as analysis
    from strategies.model_store import load_round_models, saved_rounds

    run = flower_runs["fedavg+ima-saved"]
    rows, out = run.rows(), run.out
    assert saved_rounds(out) == [2, 4, 5, 6]
    saved = load_round_models(out, 6)
    assert list(saved["clients"]) == [0, 1, 2, 3] and saved["averaged"] is not None
    assert load_round_models(out, 2)["averaged"] is None  # IMA's average exists from t_s = 4
    final = torch.load(out / "final_model.pt", weights_only=True)
    assert all(torch.equal(final[k], saved["averaged"][k]) for k in final)
    assert np.isfinite(rows[["locality", "locality-mean", "client-cka"]].to_numpy()).all()
    assert (rows["locality"] >= rows["locality-mean"]).all() and rows["client-cka"].between(0, 1).all()

    arguments = {
        "landscape": [str(out), "--points", "7"],
        "interpolate": [str(out), "--alphas=-0.5,1.5,9"],
        "decompose": [str(out), "--repeats", "2"],
        "hessian": [str(out), "--clients", "--surface", "--surface-points", "5", "--max-iter", "15", "--batches", "2"],
        "stability": [str(out), "--last", "3", "--window", "2"],
    }
    for tool, extra in arguments.items():
        assert analysis([tool, *extra, "--device", "cpu"] if tool != "stability" else [tool, *extra]) == 0, tool
        for name in ANALYSIS_OUTPUTS[tool]:
            assert (out / "analysis" / name.format(run=out.name)).stat().st_size > 0, name
    for table in ("landscape", "interpolation", "decomposition", "error-vs-models", "hessian", "hn-hd", "stability"):
        numbers = pd.read_csv(out / "analysis" / f"{table}.csv").select_dtypes("number")
        assert len(numbers) and np.isfinite(numbers.to_numpy()).all(), table
    decomposition = pd.read_csv(out / "analysis" / "decomposition.csv").set_index("round")
    per_round = rows.set_index("round").loc[decomposition.index]
    np.testing.assert_allclose(decomposition["locality"], per_round["locality"], rtol=1e-5)  # one computation, two places
    landscape = pd.read_csv(out / "analysis" / "landscape.csv")
    assert landscape["panel"].nunique() == 4 and (landscape["model"] == "grid").sum() == 4 * 7 * 7
    assert analysis(["landscape", str(out), "--stages", "2,4"]) == 2  # three stages are needed: one line, no traceback


@pytest.mark.flower_runs("pachinko")
def test_pachinko_run_gives_every_client_its_share_once(flower_runs):
    run = flower_runs["pachinko"]
    rows = run.rows()
    partition = pd.read_csv(run.out / "partition.csv")
    assert partition["total"].tolist() == [100] * 4  # 400 training images, 4 clients
    assert rows["test-loss"].iloc[-1] < rows["test-loss"].iloc[0] and rows["test-accuracy"].iloc[-1] > 0.1  # learning


@pytest.mark.flower_runs("feature-skew+ima")
def test_feature_skew_run_reports_each_domain_and_their_mean(flower_runs):
    run = flower_runs["feature-skew+ima"]
    rows = run.rows()
    partition = pd.read_csv(run.out / "partition.csv")
    assert partition["domain"].tolist() == ["mnist", "mnist", "svhn", "svhn", "usps", "usps"]
    domains = rows[["accuracy-mnist", "accuracy-svhn", "accuracy-usps"]]
    assert domains.notna().all().all() and domains.to_numpy().min() >= 0
    np.testing.assert_allclose(rows["domain-mean-accuracy"], domains.mean(axis=1))
    # Equal test splits per domain: the union's accuracy is their mean too.
    np.testing.assert_allclose(rows["test-accuracy"], rows["domain-mean-accuracy"], atol=1e-12)


@pytest.mark.flower_runs("char-lstm")
def test_next_character_run_trains_the_lstm_on_speaking_roles(flower_runs):
    run = flower_runs["char-lstm"]
    rows = run.rows()
    partition = pd.read_csv(run.out / "partition.csv")
    assert partition["total"].tolist() == [36 * 80] * 4  # one role each: 36 snippets × 80 scored positions
    assert np.isfinite(rows[["test-loss", "train-loss"]].to_numpy()).all()
    assert rows["test-accuracy"].iloc[-1] > 0.15  # above always guessing one character (chance 1/82)
