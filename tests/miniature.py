"""Small local data sets laid out like the hub ones (parquet files under data/), with the same
columns and types, so tests run the real flwr-datasets loading path offline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import ClassLabel, Dataset, Features, Image, Value
from PIL import Image as PILImage

TEXT = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
        "the slings and arrows of outrageous fortune or to take arms against a sea of troubles ")


def _write(folder: Path, split: str, table: dict, features: Features | None = None) -> None:
    (folder / "data").mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(table, features=features).to_parquet(folder / "data" / f"{split}-00000-of-00001.parquet")


def _image(rng: np.random.Generator, label: int, shape: tuple[int, ...]) -> PILImage.Image:
    """A noisy image whose mean brightness encodes its label (learnable in a few steps)."""
    pixels = rng.normal(40 + 20 * label, 25, size=shape).clip(0, 255).astype(np.uint8)
    return PILImage.fromarray(pixels)


def cifar100_like(folder: Path, per_fine: int = 40, seed: int = 0) -> Path:
    """10 fine labels in 2 coarse ones (5 each), 8×8 RGB: ``img``, ``fine_label``, ``coarse_label``."""
    rng = np.random.default_rng(seed)
    features = Features({"img": Image(), "fine_label": ClassLabel(num_classes=10), "coarse_label": ClassLabel(num_classes=2)})
    for split, count in (("train", per_fine), ("test", per_fine // 4)):
        fine = np.repeat(np.arange(10), count)
        _write(folder, split, {"img": [_image(rng, f, (8, 8, 3)) for f in fine], "fine_label": fine.tolist(),
                               "coarse_label": (fine // 5).tolist()}, features)
    return folder


def digit_five_like(folder: Path, per_domain: int = 60, seed: int = 0) -> Path:
    """3 digit domains of different sizes and modes (grey 10×10, colour 12×12, grey 8×8),
    3 classes, a string ``domain`` column, a train split only (PACS-style)."""
    rng = np.random.default_rng(seed)
    shapes = {"mnist": (10, 10), "svhn": (12, 12, 3), "usps": (8, 8)}
    features = Features({"image": Image(), "label": ClassLabel(num_classes=3), "domain": Value("string")})
    table = {"image": [], "label": [], "domain": []}
    for domain, shape in shapes.items():
        for i in range(per_domain):
            table["image"].append(_image(rng, i % 3, shape))
            table["label"].append(i % 3)
            table["domain"].append(domain)
    _write(folder, "train", table, features)
    return folder


def femnist_like(folder: Path, writers: int = 6, seed: int = 0) -> Path:
    """28×28 grey images of 4 classes with a string ``writer_id``; writer w has 10 + 5·w samples."""
    rng = np.random.default_rng(seed)
    features = Features({"image": Image(), "writer_id": Value("string"), "character": ClassLabel(num_classes=4)})
    table = {"image": [], "writer_id": [], "character": []}
    for w in range(writers):
        for i in range(10 + 5 * w):
            table["image"].append(_image(rng, i % 4, (28, 28)))
            table["writer_id"].append(f"f{w:04d}_{w % 3:02d}")
            table["character"].append(i % 4)
    _write(folder, "train", table, features)
    return folder


def shakespeare_like(folder: Path, roles: int = 4, snippets: int = 40) -> Path:
    """LEAF's Shakespeare columns: ``x`` (80 characters), ``y`` (the next one), ``character_id``."""
    text = TEXT * 4
    table = {"x": [], "y": [], "character_id": []}
    for r in range(roles):
        for i in range(snippets):
            start = (7 * i + 13 * r) % (len(text) - 81)
            table["x"].append(text[start : start + 80])
            table["y"].append(text[start + 80])
            table["character_id"].append(f"PLAY_{r}_ROLE")
    _write(folder, "train", table)
    return folder


def build_all(root: Path) -> dict[str, Path]:
    """Every miniature set under ``root``: {name: folder} (``hf:<folder>`` loads it)."""
    return {
        "cifar100": cifar100_like(root / "cifar100"),
        "digit_five": digit_five_like(root / "digit-five"),
        "femnist": femnist_like(root / "femnist"),
        "shakespeare": shakespeare_like(root / "shakespeare"),
    }


def damaged_hub_sets(root: Path) -> dict[str, Path]:
    """Hub-style sets each unusable in one way: no train split, a label column of strings
    (not a ClassLabel), an empty test split."""
    rng = np.random.default_rng(0)
    images = {"image": Image(), "label": ClassLabel(num_classes=2)}
    sets = {name: root / name for name in ("no-train", "string-labels", "empty-test")}
    _write(sets["no-train"], "test", {"image": [_image(rng, i % 2, (8, 8)) for i in range(8)], "label": [i % 2 for i in range(8)]},
           Features(images))
    _write(sets["string-labels"], "train", {"image": [_image(rng, i % 2, (8, 8)) for i in range(8)],
                                            "label": [str(i % 2) for i in range(8)]},
           Features({"image": Image(), "label": Value("string")}))
    _write(sets["empty-test"], "train", {"image": [_image(rng, i % 2, (8, 8)) for i in range(8)], "label": [i % 2 for i in range(8)]},
           Features(images))
    # datasets cannot write an empty set of images to parquet; pyarrow writes its table (features kept).
    import pyarrow.parquet as pq

    empty = Dataset.from_dict({"image": [], "label": []}, features=Features(images))
    pq.write_table(empty.data.table, sets["empty-test"] / "data" / "test-00000-of-00001.parquet")
    return sets
