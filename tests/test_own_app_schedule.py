"""IMA's and SWA's client side in a user's own ClientApp (strategies.ima_client_schedule,
swa_client_schedule): the lr Basin's own ClientApp trains with, round by round, and the
example app (examples/ima-quickstart) trains with it; its dependencies fit Basin's lock."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

from experiments.runtime.run_config import resolve_config
from strategies import ima_client_schedule, swa_client_schedule
from strategies.methods.strategy_builder import build_client_schedule
from strategies.server_work import round_train_config

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "ima-quickstart"
pytestmark = pytest.mark.usefixtures("server_identity")  # tests/conftest.py: messages need a run


def _basins(keys: dict) -> list[tuple[float, int]]:
    config = resolve_config({}, {"num-rounds": 60, "lr": 0.1, "lr-decay": 0.9, "local-epochs": 5, **keys})
    schedule = build_client_schedule(config)
    return [(c["lr"], c["local-epochs"]) for c in (round_train_config(config, schedule, r) for r in range(1, 61))]


@pytest.mark.parametrize("exploration", ["exponential", "constant", "cyclic", "epoch", "none"])
def test_imas_client_schedule_is_the_one_basins_clients_get(exploration):
    own = ima_client_schedule(lr=0.1, avg_start=7, local_epochs=5, lr_decay=0.9, exploration=exploration, ima_decay=0.5)
    basin = _basins({"averaging": "ima", "window": 2, "avg-start": 7, "ima-exploration": exploration, "ima-decay": 0.5})
    got = [own(r) for r in range(1, 61)]
    assert [e for _, e in got] == [e for _, e in basin]
    np.testing.assert_allclose([lr for lr, _ in got], [lr for lr, _ in basin], rtol=1e-12)
    if exploration == "exponential":
        assert got[6][0] == pytest.approx(0.1 * 0.9**6) and got[7][0] == pytest.approx(0.1 * 0.9**6 * 0.5)


def test_swas_client_schedule_is_the_one_basins_clients_get():
    own = swa_client_schedule(lr=0.1, avg_start=4, swa_cycle=3, local_epochs=5, lr_decay=0.9)
    basin = _basins({"averaging": "swa", "avg-start": 4, "swa-cycle": 3})
    np.testing.assert_allclose([own(r)[0] for r in range(1, 61)], [lr for lr, _ in basin], rtol=1e-12)


def test_the_quickstarts_client_trains_with_imas_exploration_lr(monkeypatch):
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

    monkeypatch.syspath_prepend(str(QUICKSTART))
    from ima_quickstart.client_app import train_message
    from ima_quickstart.task import Net

    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(),
                      run_config={"lr": 0.05, "local-epochs": 1, "avg-start": 3, "window": 2})
    schedule = ima_client_schedule(lr=0.05, avg_start=3, local_epochs=1)
    for server_round in (2, 3, 5):
        arrays = ArrayRecord({k: Array(v.numpy()) for k, v in Net().state_dict().items()})
        msg = Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})}),
                      dst_node_id=1, message_type="train")
        reply = train_message(msg, context)
        assert reply.content["metrics"]["lr"] == pytest.approx(schedule(server_round)[0])
    assert schedule(5)[0] == pytest.approx(0.05 * 0.97**2)  # two rounds of exploration after t_s = 3
    sys.modules.pop("ima_quickstart.client_app", None)


def test_the_quickstarts_dependencies_take_the_releases_basins_lock_holds():
    locked = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines()
                  if "==" in line and not line.startswith("#"))
    dependencies = tomllib.loads((QUICKSTART / "pyproject.toml").read_text())["project"]["dependencies"]
    for dependency in map(Requirement, dependencies):
        assert dependency.name in locked, f"{dependency.name} is not in Basin's lock"
        assert dependency.specifier.contains(locked[dependency.name].split(";")[0].strip()), (dependency, locked)
