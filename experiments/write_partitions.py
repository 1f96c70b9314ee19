"""Write a Basin partition to one folder per node, as nodes that hold their own data read it.

    .venv/bin/python -m experiments.write_partitions --set dataset=digits --set alpha=0.3 \\
        --set num-clients=10 --out nodes/

Any partition Basin builds (Dirichlet, shards, Pachinko, client-wise Dirichlet, feature +
label skew, natural …: the run config's keys) of any data set it loads: ``nodes/node-K/``
holds partition K's training examples, in order, as ``datasets.save_to_disk`` writes them
(an ``image`` and a ``label`` column; for next-character text, string columns ``x`` and
``y``), and ``basin-node.json`` (its partition id, the data set, the images' largest
value, the federation's per-channel mean and std, the number of classes), which a SuperNode
started with ``--node-config "data-path=nodes/node-K"`` reads (partitions/node_data.py);
``nodes/partition.csv`` and ``partition.png`` are the partition's statistics. Flower's
``flwr-datasets create`` writes IID partitions only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def write_partitions(config: Mapping[str, Any], out: Path) -> list[Path]:
    """Write each partition of the validated run config ``config`` to ``out``/node-K; return the folders."""
    import datasets
    import torch

    from clients.data import partition_indices
    from partitions.datasets import channel_statistics, load_dataset
    from partitions.feasibility import partition_settings
    from partitions.node_data import NODE_FILE, NODE_FOLDER
    from strategies.server_work import partition_statistics

    datasets.disable_progress_bars()
    scaled = load_dataset(config["dataset"], config["data-dir"], False)  # the scaled images, before standardising
    indices = partition_indices(config["dataset"], config["data-dir"], config["normalize"], partition_settings(config))
    out.mkdir(parents=True, exist_ok=True)
    described: dict[str, Any] = {"num-partitions": len(indices), "dataset": config["dataset"],
                                 "num-classes": scaled.num_classes, "partition": {
                                     key: config[key] for key in ("partition", "alpha", "num-clients", "seed")}}
    if scaled.is_text:
        folders = [write_text_node(out, partition_id, np.array(members), scaled, described)
                   for partition_id, members in enumerate(indices)]
        statistics = partition_statistics(dict(config), scaled, out)
        statistics.run()
        statistics.finish()
        return folders
    # The federation's per-channel mean and std, as load_dataset standardises (float32, exact in JSON).
    mean, std = channel_statistics(scaled.x_train)
    described.update({"max-value": scaled.max_value, "mean": mean.flatten().tolist(), "std": std.flatten().tolist()})
    # Back to the decoded integers: x = pixel / max-value in float32 rounds to the pixel exactly.
    pixels = (scaled.x_train * scaled.max_value).round().to(dtype=torch.uint8).numpy()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    folders = []
    for partition_id, members in enumerate(indices):
        folder = out / NODE_FOLDER.format(partition_id)
        members = np.array(members)  # a copy: the cached partition is a read-only mapped view
        images = pixels[members]
        images = images[:, 0] if images.shape[1] == 1 else images.transpose(0, 2, 3, 1)  # as images are stored
        columns = {"image": list(images), "label": scaled.y_train[members].numpy().tolist()}
        datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(folder))
        (folder / NODE_FILE).write_text(json.dumps({**described, "partition-id": partition_id,
                                                    "examples": len(members)}, indent=1))
        folders.append(folder)
    statistics = partition_statistics(dict(config), scaled, out)
    statistics.run()
    statistics.finish()
    return folders


def write_text_node(out: Path, partition_id: int, members: np.ndarray, data, described: Mapping[str, Any]) -> Path:
    """Partition ``partition_id`` of a next-character text set: its snippets and next
    characters as string columns ``x`` and ``y`` (which encode to its ids again)."""
    import datasets

    from partitions.node_data import NODE_FILE, NODE_FOLDER
    from partitions.text import decode_text

    folder = out / NODE_FOLDER.format(partition_id)
    snippets, following = decode_text(data.x_train[members].numpy(), data.y_train[members].numpy())
    datasets.Dataset.from_dict({"x": snippets, "y": following}).save_to_disk(str(folder))
    (folder / NODE_FILE).write_text(json.dumps({**described, "partition-id": partition_id,
                                                "examples": len(members)}, indent=1))
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    from clients.log import log
    from experiments.runtime.run_config import parse_overrides, resolve_config

    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.write_partitions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run-config key")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write node-0, node-1, … into")
    args = parser.parse_args(argv)
    try:
        config = resolve_config(parse_overrides(args.set))
    except ValueError as error:  # ConfigError included: one line, before anything is written
        print(f"error: {error}", file=sys.stderr)
        return 2
    folders = write_partitions(config, args.out)
    log.info(f"wrote {len(folders)} node folders to {args.out} (partition.csv: their statistics)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
