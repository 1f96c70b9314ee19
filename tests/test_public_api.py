"""Basin's model averaging in anyone's Flower app (strategies/__init__.py): IMA, WIMA and
ServerSWA wrap any Flower strategy, Flower's FedAvg included, in Flower's own loop
(``strategy.start``) with a stock Flower ClientApp, in a simulation and on the Deployment
Engine; a method that needs Basin's ClientApp says so when it is wrapped."""

from __future__ import annotations

import textwrap
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAdam, FedAvg

from experiments.runtime.deployment import LocalFederation
from experiments.runtime.launch import run_app
from strategies import IMA, WIMA, ServerSWA
from strategies.cohort import COHORT
from strategies.scaffold import Scaffold

# Few nodes and rounds: on the Deployment Engine every message is a new ClientApp process
# (Flower's subprocess isolation; forked from a SuperNode's warm process here) and every
# SuperNode polls the SuperLink every 3 s (4 nodes × 4 rounds took 78 s before the fork).
ROUNDS, WINDOW, START, NODES = 3, 2, 2, 2

# A stock Flower PyTorch quickstart ClientApp: its own CNN and data loader, Flower's
# message conventions only ("arrays", "metrics" with num-examples).
CLIENT_APP = '''
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 8, 3, padding=1), nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


def loader(partition, partitions):
    digits = load_digits()
    x = torch.tensor(digits.images[partition::partitions], dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(digits.target[partition::partitions])
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(partition))


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data = loader(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
    metrics = MetricRecord({"num-examples": len(data.dataset)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)
'''

# A ServerApp of ten lines: Basin's IMA around Flower's FedAvg; every round's models logged.
SERVER_APP = f'''
import torch
from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from quickstart.client_app import Net
from strategies import IMA

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = IMA(FedAvg(fraction_evaluate=0.0, min_available_nodes={NODES}), window={WINDOW}, avg_start={START})
    def log(server_round, arrays):
        base = strategy.base_arrays if server_round else arrays
        torch.save({{"sent": arrays.to_torch_state_dict(), "base": base.to_torch_state_dict()}},
                   context.run_config["log-dir"] + f"/round-{{server_round}}.pt")
    strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds={ROUNDS}, evaluate_fn=log)
'''

PYPROJECT = '''
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "quickstart"
version = "1.0.0"
dependencies = ["flwr[simulation]", "torch", "scikit-learn", "basin"]

[tool.hatch.build.targets.wheel]
packages = ["quickstart"]

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "quickstart.server_app:app"
clientapp = "quickstart.client_app:app"

[tool.flwr.app.config]
log-dir = ""
'''


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    app = tmp_path_factory.mktemp("quickstart-app")
    (app / "quickstart").mkdir()
    (app / "quickstart" / "__init__.py").write_text("")
    (app / "quickstart" / "client_app.py").write_text(textwrap.dedent(CLIENT_APP))
    (app / "quickstart" / "server_app.py").write_text(textwrap.dedent(SERVER_APP))
    (app / "pyproject.toml").write_text(PYPROJECT)
    return app


def _check_ima_arithmetic(log_dir: Path) -> None:
    """Before t_s the clients receive FedAvg's model; from t_s on the mean of the last P of
    FedAvg's models (the models the strategy produced, logged each round)."""
    rounds = [torch.load(log_dir / f"round-{r}.pt", weights_only=True) for r in range(ROUNDS + 1)]
    for r in range(1, ROUNDS + 1):
        sent, base = rounds[r]["sent"], rounds[r]["base"]
        for key, value in sent.items():
            if r < START:
                assert torch.equal(value, base[key]), (r, key)
            else:
                window = [rounds[r - i]["base"][key].double() for i in range(WINDOW)]
                by_hand = (sum(window) / WINDOW).to(value.dtype)
                np.testing.assert_allclose(value.numpy(), by_hand.numpy(), rtol=1e-6, atol=1e-7, err_msg=f"{r} {key}")
    # The clients trained on what they were sent: FedAvg's model moves every round.
    assert not torch.equal(rounds[ROUNDS]["base"]["fc.weight"], rounds[ROUNDS - 1]["base"]["fc.weight"])


def _in_a_simulation(app: Path, folder: Path) -> str:
    return run_app(app, folder / "flwr.log", num_supernodes=NODES, run_config=f"log-dir='{folder}'")


def _on_the_deployment_engine(app: Path, folder: Path) -> str:
    with LocalFederation(folder / "logs") as federation:
        federation.start_supernodes(NODES)
        return federation.run_app(app, folder / "flwr.log", run_config=f"log-dir='{folder}'")


ENGINES = {"in-a-simulation": _in_a_simulation, "on-the-deployment-engine": _on_the_deployment_engine}


@pytest.fixture(scope="module")
def quickstart_runs(request, quickstart, tmp_path_factory) -> dict[str, tuple[Path, Future]]:
    """The quickstart app on each engine that this session's selected tests name, both at
    once: {engine: (the folder it logs its rounds to, the future of its run's log)}. One after
    the other they took 60 s, at once 38 s (2 cores, 2026-11-29): each alone leaves a core idle
    much of the time (Flower's and its SuperNodes' polling, each ClientApp's start)."""
    selected = [item.callspec.params["engine"] for item in request.session.items
                if item.originalname == "test_ima_around_flowers_fedavg"]
    with ThreadPoolExecutor(max_workers=len(ENGINES)) as pool:
        runs = {engine: (folder := tmp_path_factory.mktemp(engine), pool.submit(ENGINES[engine], quickstart, folder))
                for engine in selected}
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_ima_around_flowers_fedavg(quickstart_runs, engine):
    folder, log = quickstart_runs[engine]
    assert (folder / f"round-{ROUNDS}.pt").exists(), log.result()[-3000:]
    _check_ima_arithmetic(folder)


def test_a_method_that_needs_basins_clients_says_so_when_wrapped():
    with pytest.raises(ValueError, match="Scaffold needs Basin's ClientApp .* control variate"):
        IMA(Scaffold(**COHORT))
    assert IMA(Scaffold(**COHORT), basin_clients=True).feedback  # Basin's own clients: allowed
    for wrapper in (IMA, WIMA, ServerSWA):  # Flower's own strategies are server-only
        assert wrapper(FedAdam()).base.__class__ is FedAdam


def test_the_wrappers_are_the_papers_settings_and_checkpoint_their_window():
    ima, wima, swa = IMA(FedAvg(), window=3, avg_start=5), WIMA(FedAvg(), window=4), ServerSWA(FedAvg(), 10, swa_cycle=2)
    assert (ima.window, ima.start_round, ima.feedback) == (3, 5, True)
    assert (wima.window, wima.start_round, wima.feedback) == (4, 4, False)
    assert (swa.window, swa.start_round, swa.sample_every, swa.feedback) == (None, 10, 2, False)
    ima._sample({"w": np.ones(2, np.float32)})
    restored = IMA(FedAvg(), window=3, avg_start=5)
    restored.load_state_dict(ima.state_dict())
    assert len(restored.recent_models) == 1 and restored.recent_models[0]["w"].tolist() == [1.0, 1.0]


IMPORT_EVERYTHING = '''
import importlib, pkgutil, sys
import flwr.server.superlink.fleet.vce.vce_api as engine
from flwr.server.superlink.fleet.vce.backend import raybackend

def flowers():
    return {name: getattr(engine, name) for name in ("add_messages_to_queue", "_register_node_info_stores",
                                                      "_register_nodes")} | {
        "init_ray": raybackend.RayBackend.init_ray, "ClientAppActor": raybackend.ClientAppActor}

before = flowers()
imported = []
for package in ("partitions", "clients", "strategies", "experiments"):
    root = importlib.import_module(package)
    imported.append(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
            imported.append(module.name)
from strategies import IMA  # noqa: the public wrappers, as a user's app imports them
changed = [name for name, function in flowers().items() if function is not before[name]]
import clients.halves
changed += ["clients.halves"] if clients.halves._loader is not None else []  # no import hands the methods over
print(len(imported), "modules;", "changed:", changed)
'''


def test_importing_every_basin_module_leaves_flowers_engine_as_it_was():
    """A user's own Flower app that imports Basin keeps Flower's simulation engine: Basin's
    replacements go in only where its own simulation command runs; nor does an import
    hand the methods' client halves over (clients/halves.py)."""
    import subprocess
    import sys

    from experiments.runtime.run_config import APP_DIR

    result = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], cwd=APP_DIR, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    count, _, changed = result.stdout.strip().partition(" modules; changed: ")
    assert int(count) > 150 and changed == "[]", result.stdout


def test_the_wrappers_keywords_are_the_run_configs_keys_and_an_earlier_name_says_its_new_one():
    import inspect

    from strategies.config import SCHEMA

    for wrapper in (IMA, WIMA, ServerSWA):
        keywords = [name for name, parameter in inspect.signature(wrapper).parameters.items()
                    if parameter.kind is parameter.POSITIONAL_OR_KEYWORD and name not in ("strategy", "basin_clients")]
        assert keywords and all(name.replace("_", "-") in SCHEMA for name in keywords), (wrapper.__name__, keywords)
    with pytest.raises(TypeError, match=r"IMA\(…, start_round=…\): the keyword is avg_start now, the run config's avg-start"):
        IMA(FedAvg(), window=3, start_round=5)
    with pytest.raises(TypeError, match="ServerSWA.*cycle=….*swa_cycle"):
        ServerSWA(FedAvg(), 10, cycle=2)
    with pytest.raises(TypeError, match="no such keyword"):
        WIMA(FedAvg(), windw=3)
