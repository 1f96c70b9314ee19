"""The client halves of server methods behind one protocol (clients/components.py): the
local round names no method, and each component is built only when its message asks."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from clients import protocol
from clients.components import ClientComponent
from clients.models import build_model
from strategies.config import STRATEGY_NAMES
from strategies.methods.registry import client_components

REPO = Path(__file__).resolve().parents[1]
# Every builder the methods declare (MethodSpec.client_components).
CLIENT_COMPONENTS = client_components()


def test_the_local_round_names_no_method():
    code = (REPO / "clients" / "local_round.py").read_text().lower()
    words = set(re.findall(r"[a-z][a-z0-9_-]*", code))
    named = {name for name in STRATEGY_NAMES if name in words or name.replace("-", "_") in words}
    named |= {word for word in ("control_variates", "feddyn", "adabest", "mime", "fedcm", "proximal") if word in code}
    assert not named


def _content(**records) -> RecordDict:
    config = ConfigRecord({"lr": 0.1, "local-epochs": 1, "batch-size": 4, "momentum": 0.0, "server-round": 1,
                           **records.pop("config", {})})
    return RecordDict({"config": config, **records})


def test_a_plain_training_message_builds_no_component_and_each_record_builds_its_own():
    model = build_model("mlp", (1, 8, 8), 10)
    assert [build(model, _content(), RecordDict()) for build in CLIENT_COMPONENTS] == [None] * len(CLIENT_COMPONENTS)
    zeros = ArrayRecord({name: p.detach().clone().zero_() for name, p in model.named_parameters()})
    asks = {
        "proximal": _content(config={"proximal-mu": 0.1}),
        "scaffold": _content(**{protocol.SCAFFOLD_SERVER_CONTROL: zeros}),
        "feddyn": _content(config={protocol.FEDDYN_ALPHA: 0.01}),
    }
    for name, content in asks.items():
        built = [c for build in CLIENT_COMPONENTS if (c := build(model, content, RecordDict())) is not None]
        assert len(built) == 1 and isinstance(built[0], ClientComponent), name
        config_terms = built[0].gradient_terms(
            __import__("clients.training", fromlist=["LocalTrainingConfig"]).LocalTrainingConfig(0.1, 1, 4), 8)
        assert len(config_terms) == 1, name


def test_a_control_variate_after_clipping_is_a_post_clip_term():
    model = build_model("mlp", (1, 8, 8), 10)
    zeros = ArrayRecord({name: torch.zeros_like(p) for name, p in model.named_parameters()})
    content = _content(config={protocol.CONTROL_AFTER_CLIP: True}, **{protocol.MOSWA_SERVER_CONTROL: zeros})
    (component,) = [c for build in CLIENT_COMPONENTS if (c := build(model, content, RecordDict())) is not None]
    from clients.training import LocalTrainingConfig

    assert component.gradient_terms(LocalTrainingConfig(0.1, 1, 4), 8) == [] and len(component.post_clip_terms()) == 1
