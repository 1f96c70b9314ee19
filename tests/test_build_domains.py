"""experiments.build_domains: a Digit-Five or PACS copy built from the sources' image folders,
on tiny fake inputs, loads as the presets' hub-style set, and its sources are checked."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

from experiments.build_domains import check, main
from partitions import load_dataset


def _image(path, value: int, size=(6, 6), mode="L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = size if mode == "L" else (*size, 3)
    Image.fromarray(np.full(shape, value, dtype=np.uint8), mode).save(path)


def test_a_copy_of_named_class_folders_loads_with_one_label_per_name_in_every_domain(tmp_path, capsys):
    # PACS-like: classes by name; one domain with its own train and test folders
    for i in range(3):
        _image(tmp_path / "src" / "photo" / "dog" / f"{i}.png", 10 + i, mode="RGB")
        _image(tmp_path / "src" / "photo" / "horse" / f"{i}.jpg", 200, mode="RGB")
        _image(tmp_path / "src" / "sketch" / "train" / "horse" / f"{i}.png", 100)
    _image(tmp_path / "src" / "sketch" / "test" / "dog" / "t.png", 50)
    out = tmp_path / "pacs"
    assert main(["--out", str(out), "--domain", f"photo={tmp_path / 'src' / 'photo'}",
                 "--domain", f"sketch={tmp_path / 'src' / 'sketch'}"]) == 0
    assert "2 classes; images per domain: photo 6, sketch 4" in capsys.readouterr().out
    data = load_dataset(f"hf:{out}")
    assert data.num_classes == 2 and data.x_train.shape[1:] == (3, 6, 6)  # grey sketches in colour, as the first
    assert sorted(data.y_train.tolist()) == [0, 0, 0, 1, 1, 1, 1, 1, 1]  # dog = 0, horse = 1 in both domains
    assert data.domain_names is not None and set(data.domain_names) == {"photo", "sketch"}
    assert data.y_test.tolist() == [0]  # the sketch domain's test dog
    assert check(out) == []
    _image(tmp_path / "src" / "sketch" / "train" / "horse" / "0.png", 101)  # a source file changed
    recorded = json.loads((out / "sources.json").read_text())["domains"]["sketch"]["sha256"]
    assert check(out) == [f"domain sketch: the files in {tmp_path / 'src' / 'sketch'} are not the ones the copy was "
                          f"built from (SHA-256 {recorded[:12]}…)"]
    assert main(["--check", str(out)]) == 1


def test_a_folder_without_class_folders_is_one_line(tmp_path, capsys):
    _image(tmp_path / "loose" / "a.png", 1)
    _image(tmp_path / "ok" / "0" / "a.png", 1)
    assert main(["--out", str(tmp_path / "x"), "--domain", f"a={tmp_path / 'loose'}", "--domain",
                 f"b={tmp_path / 'ok'}"]) == 2
    assert f"domain folder {tmp_path / 'loose'}: expected class folders" in capsys.readouterr().err


def test_a_hub_id_with_a_revision_pins_it(monkeypatch):
    """``hf:ID@REVISION``: flwr-datasets (and so datasets.load_dataset) gets the repository and its revision."""
    import flwr_datasets

    from partitions.hub import load_hub_dataset

    asked = {}

    class Captured(Exception):
        pass

    def federated_dataset(**kwargs):
        asked.update(kwargs)
        raise Captured

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", federated_dataset)
    for hub_id, pinned in (("uoft-cs/cifar10@v1.0-example", True), ("uoft-cs/cifar10", False)):
        asked.clear()
        try:
            load_hub_dataset(hub_id)
        except Captured:
            pass
        assert asked["dataset"] == "uoft-cs/cifar10"
        assert asked.get("revision") == ("v1.0-example" if pinned else None)
