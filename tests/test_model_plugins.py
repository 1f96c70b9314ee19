"""A researcher's model from their own package (entry points ``basin.models``): found, checked
against the data set and the method before Flower starts, built by the clients, trained with
IMA on the researcher's own image folder (``dataset = "hf:<folder>"``); when broken, one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from clients.declarations import ImplementedIn
from clients.model_plugins import MODEL_PLUGINS, ModelSpec, load_model_plugins
from clients.models import build_model
from clients.options import ConfigError
from experiments.measurement.in_process_grid import InProcessGrid
from experiments.runtime.run_config import APP_DIR, resolve_config
from partitions import load_dataset
from strategies.model_store import load_round_models
from strategies.server_work import train_rounds
from tests.test_compositions import Rows

SMALL_CNN = APP_DIR / "examples" / "small-cnn"
GOOD = '''
from clients.declarations import ImplementedIn
from clients.model_plugins import ModelSpec

MODELS = (ModelSpec("{name}", ImplementedIn("basin_small_cnn.model:small_cnn"){extra}),)
'''


@pytest.fixture
def small_cnn(monkeypatch) -> ModelSpec:
    """examples/small-cnn's model, as its entry point would register it."""
    monkeypatch.syspath_prepend(str(SMALL_CNN))
    spec = ModelSpec("small-cnn", ImplementedIn("basin_small_cnn.model:small_cnn"))
    monkeypatch.setitem(MODEL_PLUGINS, "small-cnn", spec)
    return spec


def _module(tmp_path: Path, monkeypatch, name: str, text: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_each_kind_of_broken_model_plugin_is_one_line_naming_it_and_the_good_one_loads(tmp_path, monkeypatch):
    good = _module(tmp_path, monkeypatch, "model_good", GOOD.format(name="good-cnn", extra=""))
    exits = _module(tmp_path, monkeypatch, "model_exits", "raise SystemExit(2)\n")
    other = _module(tmp_path, monkeypatch, "model_other", GOOD.format(name="other-cnn", extra=""))
    malformed = _module(tmp_path, monkeypatch, "model_malformed", GOOD.format(name="bad", extra=", inputs='audio'"))
    models, broken = load_model_plugins([("good-cnn", good, "d-a"), ("exits", exits, "d-b"), ("mlp", good, "d-c"),
                                         ("misnamed", other, "d-d"), ("bad", malformed, "d-e")])
    assert list(models) == ["good-cnn"] and models["good-cnn"].inputs == "image"
    assert broken["exits"].line() == ("model plug-in 'exits' (distribution d-b, module model_exits) cannot be used: "
                                      "importing it failed: SystemExit: 2")
    assert broken["mlp"].line().endswith("its name is one of Basin's own models")
    assert broken["misnamed"].line().endswith("its module declares no model named 'misnamed' (it declares 'other-cnn')")
    assert broken["bad"].line().endswith("malformed: bad: inputs = 'audio'; allowed: image, sequence")


def test_the_launcher_checks_a_model_plugin_against_the_data_set_and_the_method(small_cnn, monkeypatch):
    assert resolve_config({}, {"model": "small-cnn", "averaging": "ima"})["model"] == "small-cnn"
    monkeypatch.setitem(MODEL_PLUGINS, "tokens", ModelSpec("tokens", small_cnn.build, inputs="sequence"))
    with pytest.raises(ConfigError, match=r"^run config key 'model' = 'tokens' \(a plug-in\) takes token sequences; "
                                          r"dataset 'digits'"):
        resolve_config({}, {"model": "tokens"})
    monkeypatch.setitem(MODEL_PLUGINS, "bare", ModelSpec("bare", small_cnn.build, offers=frozenset({"classifier"})))
    with pytest.raises(ConfigError, match=r"'model' = 'bare' \(a plug-in\) does not offer represent, but strategy = "
                                          r"'moon' works on one label per image"):
        resolve_config({}, {"model": "bare", "strategy": "moon"})
    resolve_config({}, {"model": "bare"})  # FedAvg needs nothing of it
    with pytest.raises(ConfigError, match="needs a residual network with width-slimmable stages"):
        resolve_config({}, {"model": "small-cnn", "strategy": "gradaug"})


def test_a_model_plugin_with_batchnorm_is_refused_under_dp_before_flower_starts(tmp_path, monkeypatch):
    """Basin builds the plug-in for the data set's inputs and finds its buffers (BatchNorm's)."""
    module = _module(tmp_path, monkeypatch, "model_bn", """
        import torch.nn as nn

        def bn_net(num_classes, input_shape):
            return nn.Sequential(nn.Conv2d(input_shape[0], 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(num_classes))
        """)
    monkeypatch.setitem(MODEL_PLUGINS, "bn-net", ModelSpec("bn-net", ImplementedIn(f"{module}:bn_net")))
    with pytest.raises(ConfigError, match=r"'model' = 'bn-net' holds buffers \(1.running_mean, 1.running_var, 1.num_batches_tracked\)"):
        resolve_config({}, {"model": "bn-net", "dp-clipping-norm": 1.0})
    resolve_config({}, {"model": "bn-net"})


def _image_folder(root: Path) -> Path:
    """A researcher's images, a folder per class and split (Hugging Face's image folder layout)."""
    rng = np.random.default_rng(0)
    from PIL import Image

    for split, count in (("train", 16), ("test", 5)):
        for label, name in enumerate(("cat", "dog", "owl")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                pixels = rng.normal(40 + 70 * label, 20, (10, 10, 3)).clip(0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{index}.png")
    return root


@pytest.mark.usefixtures("server_identity")
def test_a_model_plugin_trains_with_ima_on_the_researchers_own_image_folder(small_cnn, tmp_path):
    """The researcher's images (``hf:<folder>``) partitioned over 4 clients, 2 rounds of IMA on
    the plug-in's model, through the ServerApp's round loop and the ClientApp's handlers."""
    folder = _image_folder(tmp_path / "images")
    config = resolve_config({}, {"dataset": f"hf:{folder}", "model": "small-cnn", "averaging": "ima", "window": 2,
                                 "avg-start": 2, "num-clients": 4, "participation": 1.0, "num-rounds": 2,
                                 "local-epochs": 1, "batch-size": 8, "alpha": 1.0, "min-partition-size": 1,
                                 "save-models-every": 1, "checkpoint-every": 0})
    data = load_dataset(config["dataset"], "", True)
    assert (data.x_train.shape, data.num_classes, len(data.y_test)) == ((48, 3, 10, 10), 3, 15)
    assert type(build_model("small-cnn", data.input_shape, 3)).__name__ == "SmallCnn"
    (tmp_path / "run").mkdir()
    rows = Rows(tmp_path / "run")
    train_rounds(InProcessGrid(config, 4), config, rows, None, data, torch.device("cpu"))
    assert [(row["round"], row["clients-ok"], row["round-status"]) for row in rows] == [(1, 4, "aggregated"),
                                                                                       (2, 4, "aggregated")]
    assert rows[1]["sent-model"] == "averaged" and np.isfinite(rows[1]["test-accuracy"])
    saved = [load_round_models(tmp_path / "run", r) for r in (1, 2)]
    for key, value in saved[1]["averaged"].items():  # IMA's window: the mean of the two base models
        torch.testing.assert_close(value, (saved[0]["base"][key] + saved[1]["base"][key]) / 2)


def test_list_keys_names_the_installed_model_plugins_and_the_broken_ones(tmp_path):
    info = tmp_path / "models_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: models-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[basin.models]\nsmall-cnn = basin_small_cnn\nhalf-done = half_done\n")
    (tmp_path / "half_done.py").write_text("raise RuntimeError('half-written')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(SMALL_CNN), str(APP_DIR)])}
    listed = subprocess.run([sys.executable, "-m", "experiments.run", "--list-keys"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=APP_DIR, check=True).stdout.splitlines()
    model = next(line for line in listed if line.startswith("model "))
    assert "'small-cnn' (plug-ins: 'small-cnn')" in model
    assert listed[-1] == ("error: model plug-in 'half-done' (distribution models-dist, module half_done) cannot be "
                          "used: importing it failed: RuntimeError: half-written")
    asked = subprocess.run([sys.executable, "-m", "experiments.run", "--set", "model=half-done", "--out",
                            str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120, cwd=APP_DIR)
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert asked.stderr.strip().endswith("run config key 'model' = 'half-done': model plug-in 'half-done' (distribution "
                                         "models-dist, module half_done) cannot be used: importing it failed: "
                                         "RuntimeError: half-written")


def test_a_model_plugin_that_does_not_fit_the_data_or_lies_about_what_it_offers_is_named_as_it_is_built(small_cnn,
                                                                                                      monkeypatch):
    """An image plug-in on the Shakespeare hub set is refused by the launcher; on any set whose
    kind is known once loaded, and for what it offers, the first build names the plug-in."""
    from clients.models import build_model

    with pytest.raises(ConfigError, match=r"'model' = 'small-cnn' \(a plug-in\) takes images; dataset "
                                          r"'hf:flwrlabs/shakespeare' holds next-character text"):
        resolve_config({}, {"model": "small-cnn", "dataset": "hf:flwrlabs/shakespeare", "partition": "natural"})
    with pytest.raises(ValueError, match=r"model plug-in 'small-cnn' declares inputs = 'image', but the data set holds "
                                         r"token sequences"):
        build_model("small-cnn", (80,), 82)
    assert build_model("small-cnn", (1, 8, 8), 10) is not None  # it offers both, and has both
    monkeypatch.setattr("basin_small_cnn.model.SmallCnn.represent", None, raising=False)
    with pytest.raises(ValueError, match=r"model plug-in 'small-cnn' declares offers = \{classifier, represent\}, but "
                                         r"the model it builds \(SmallCnn\) has no represent"):
        build_model("small-cnn", (1, 8, 8), 10)


def test_a_second_plugin_of_the_same_name_keeps_the_first_ones_own_problem(tmp_path, monkeypatch):
    exits = _module(tmp_path, monkeypatch, "model_exits_first", "raise SystemExit(3)\n")
    good = _module(tmp_path, monkeypatch, "model_good_second", GOOD.format(name="twin", extra=""))
    models, broken = load_model_plugins([("twin", exits, "d-a"), ("twin", good, "d-b")])
    assert not models
    assert broken["twin"].line() == (
        "model plug-in 'twin' (distribution d-b, module model_good_second) cannot be used: its name is also the model "
        "plug-in of module model_exits_first (distribution d-a); that one's own problem: importing it failed: "
        "SystemExit: 3")


def test_the_method_listing_names_the_broken_model_plugins(monkeypatch):
    from clients.model_plugins import BrokenModel
    from experiments import method_list

    monkeypatch.setitem(method_list.BROKEN_MODELS, "half-done",
                        BrokenModel("half-done", "half_done", "d-x", "importing it failed: SyntaxError: bad"))
    assert method_list.listing().splitlines()[-1] == (
        "half-done          error: model plug-in 'half-done' (distribution d-x, module half_done) cannot be used: "
        "importing it failed: SyntaxError: bad")
