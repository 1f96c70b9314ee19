"""The papers' tables as data (experiments/reproduction/table_cells.py, experiments/paper_tables/):
every table and cell the papers have, with their numbers and settings; the values' parsing;
the cells that cannot run say why; and the counts the docs give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.reproduction.table_cells import PaperValue, TableError, cell_status, load_table, select, table_names
from experiments.runtime.machine import ClientResources, check_machine

# Cells per table, counted in the papers: rows × columns × values per column.
PAPER_CELLS = {
    "ima-table1": 8 * 12 * 2, "ima-table2": 6 * 5 * 2, "ima-table3": 8 * 5,
    "wima-table2": 11 * 7 * 2, "wima-table3": 2 * 2, "wima-table4": 5 * 2, "wima-table5": 4 * 3,
    "fedalign-table1": 6 * 5, "fedalign-table2": 6 * 4, "fedalign-table3": 6 * 3, "fedalign-table4": 6 * 5,
    "fedalign-table5": 10 * 4, "fedalign-table6": 1 * 9, "fedalign-table7": 8 * 8,
    "fedswa-table3": 10 * 6 * 2,
}


def cell(table, key: str):
    return next(c for c in table.cells if c.key == key)


@pytest.fixture(scope="module")
def tables():
    return {name: load_table(name) for name in table_names()}


def test_every_table_the_papers_have_is_there_with_every_cell(tables):
    assert {name: len(table.cells) for name, table in tables.items()} == PAPER_CELLS


def test_cells_hold_the_papers_numbers(tables):
    ima = tables["ima-table1"]
    assert cell(ima, "FedAvg | FMNIST (CNN), #C = 2").paper.value == 81.17
    assert cell(ima, "FedAvg | FMNIST (CNN), #C = 2 | + IMA").paper.value == 84.68
    assert cell(ima, "FedGMA | PACS (AlexNet), α = 0.1 (+FS) | + IMA").paper.value == 47.46
    wima = tables["wima-table2"]
    assert cell(wima, "SCAFFOLD | CIFAR100, α = 0").paper.value == 45.65
    assert cell(wima, "FedDyn | CIFAR10, α = 0 | w/ WIMA").paper.missing
    swa = tables["fedswa-table3"]
    rounds = cell(swa, "FedAvg | CIFAR100, Dirichlet-0.1 | Rounds").paper
    assert (rounds.value, rounds.censored) == (1000, True)
    assert cell(swa, "FedMoSWA | CIFAR100, Dirichlet-0.1 | Rounds").paper.value == 577
    accuracy = cell(swa, "FedMoSWA | CIFAR100, Dirichlet-0.1 | Acc.(%)").paper
    assert (accuracy.value, accuracy.spread) == (61.9, 0.5)
    assert cell(tables["fedalign-table5"], "FedAlign | MFLOPs").paper.value == 89.1
    assert cell(tables["ima-table2"], "FedProx | t_s = 150 | speed-up").paper.value == 1.96


def test_no_two_cells_of_a_table_run_the_same_setup_unless_the_paper_prints_the_same_number(tables):
    """A cell mapped onto another cell's setup cannot reproduce both of the paper's numbers
    (wima-table2's FedAvg on CIFAR100/PAM once ran FedAvgM's setup: 47.41 against 55.96).
    A speed-up is derived from its rounds cell's run, and a cost cell's two metrics come
    from one measurement: they are compared as (setup, metric)."""
    shared = []
    for table in tables.values():
        seen: dict[str, object] = {}
        for c in table.cells:
            if c.config is None or c.metric == "speed-up":
                continue
            setup = json.dumps({**c.config, "metric": c.metric}, sort_keys=True)
            other = seen.setdefault(setup, c)
            if other is not c and other.paper.text != c.paper.text:
                shared.append(f"{table.name}: {other.key} ({other.paper.text}) and {c.key} ({c.paper.text})")
    assert not shared, "cells with one setup and different printed numbers:\n" + "\n".join(shared)


def test_each_cell_runs_the_papers_setting(tables):
    ima = tables["ima-table1"]
    with_ima = cell(ima, "FedProx | FMNIST (CNN), α = 0.1 | + IMA").config
    assert (with_ima["strategy"], with_ima["averaging"], with_ima["alpha"], with_ima["prox-mu"]) == ("fedprox", "ima", 0.1, 0.01)
    assert cell(ima, "FedProx | FMNIST (CNN), α = 0.1").config["averaging"] == "none"
    assert cell(ima, "FedAvg | CIFAR-10 (ResNet), #C = 2").config["model"] == "resnet18-gn"
    ts = cell(tables["ima-table2"], "FedAdam | t_s = 150 | rounds").config
    assert (ts["avg-start"], ts["target-accuracy"], ts["dataset"]) == (150, 0.6161, "cifar10")
    window = cell(tables["wima-table4"], "W = 50 | CIFAR100").config
    assert (window["window"], window["dataset"], window["alpha"]) == (50, "cifar100", 0.0)
    assert cell(tables["wima-table5"], "CIFAR10, α = 0.05 | WIMA clf").config["avg-subset"] == "classifier"
    pam = cell(tables["wima-table2"], "FedAvg | CIFAR100, PAM").config
    # §4.1.3's FedAvg (η_s = 1, momentum 0), not FedAvgM's setup: the paper prints other numbers for the two.
    assert (pam["strategy"], pam["server-momentum"]) == ("fedavg", 0.0)
    assert cell(tables["wima-table2"], "FedAvg | CIFAR100, PAM").note.startswith("UNCONFIRMED mapping")
    sampled = cell(tables["fedalign-table4"], "MOON | C = 64 × 0.25 (100)").config
    assert (sampled["num-clients"], sampled["participation"], sampled["num-rounds"]) == (64, 0.25, 100)
    assert cell(tables["fedalign-table5"], "GradAug (n = 3) | MFLOPs").config["gradaug-subnets"] == 3


def test_every_mapped_cell_passes_the_launchers_checks(tables):
    """load_table resolved and validated every config (partitions included); the machine
    check is the launcher's last one before Flower starts."""
    configs = [c.config for table in tables.values() for c in table.cells if c.config is not None]
    assert len(configs) == 659  # 901 cells, less 224 unsupported and 18 the papers do not report
    check_machine(configs, ClientResources(1, 0.0))


def test_cells_that_cannot_run_say_why(tables):
    for table in tables.values():
        for c in table.cells:
            assert (c.config is None) == bool(c.reason), c.key
    assert "GLDv2" in cell(tables["wima-table3"], "FedAvg | GLDV2 | w/ WIMA").reason
    assert "RTX-2080Ti" in cell(tables["fedalign-table5"], "MOON | Time (s)").reason
    assert cell_status(cell(tables["fedalign-table2"], "FedAvg | α = 0.1")) == "not reported"
    assert cell_status(cell(tables["fedalign-table5"], "MOON | MFLOPs")) == "cost"


@pytest.mark.parametrize("text, value, spread, censored", [
    ("81.17", 81.17, None, False), ("52.9±0.1", 52.9, 0.1, False), ("45.8 ± 0.3", 45.8, 0.3, False),
    ("1000+", 1000, None, True), ("1", 1, None, False),
])
def test_paper_values_parse(text, value, spread, censored):
    parsed = PaperValue.parse(text)
    assert (parsed.value, parsed.spread, parsed.censored, parsed.missing) == (value, spread, censored, "")


def test_missing_and_malformed_values():
    assert "N/A" in PaperValue.parse("N/A").missing
    assert "lost" in PaperValue.parse("lost").missing
    with pytest.raises(TableError, match="allowed: a number"):
        PaperValue.parse("81.17(84.68)")


def test_only_keeps_the_named_rows_and_columns(tables):
    kept = select(tables["ima-table1"], ["FMNIST", "FedAvg,FedProx"])
    assert len(kept.cells) == 2 * 2 * 2  # 2 rows × 2 FMNIST columns × without/with IMA
    assert {c.row for c in kept.cells} == {"FedAvg", "FedProx"}
    with pytest.raises(TableError, match="matches no cell"):
        select(tables["ima-table1"], ["ImageNet"])


def test_the_cell_counts_in_docs_reproducing_are_the_tables():
    """docs/reproducing.md's count of each table's cells, and their total, are the table files'."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "reproducing.md").read_text()
    counts = {name: int(count) for name, count in re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| (\d+) \|", text, re.M)}
    assert counts == {name: len(load_table(name).cells) for name in table_names()}
    assert re.search(r"^\| \*\*all\*\* \| \| \*\*(\d+)\*\* \|", text, re.M).group(1) == str(sum(counts.values()))


def test_the_listing_reads_every_tables_cells_without_building_their_partitions(tables, monkeypatch):
    """`reproduce --list` counts the cells of every table as loading them for a run does,
    and builds no partition (building them all took 5 of its 6.7 s on 2 cores)."""
    from experiments.reproduction.runner import list_tables
    from experiments.reproduction.table_cells import table_counts
    from experiments.runtime import run_config

    built = []
    monkeypatch.setattr(run_config, "check_partition", lambda config: built.append(config["partition"]))
    listing = list_tables().set_index("table")
    assert built == []
    for name, table in tables.items():  # loaded with their partitions built (the fixture)
        counts = table_counts(table)
        assert listing.loc[name, "cells"] == counts["cells"] == len(table.cells)
        assert listing.loc[name, "runnable here"] == counts.get("runnable", 0)
        assert listing.loc[name, "needs data"] == counts.get("needs data", 0)
    load_table("ima-table1")  # a table loaded to run builds them
    assert built


NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def test_the_papers_the_docs_count_are_the_tables_papers():
    """docs/reproducing.md's "the N papers it reproduces" is the number of papers the table files hold."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "reproducing.md").read_text()
    stated = re.search(r"tables of the (\w+) papers it reproduces", text).group(1)
    assert NUMBER_WORDS[stated] == len({load_table(name, build_partitions=False).paper for name in table_names()})


def test_the_presets_the_readme_names_as_in_no_table_are_those_no_table_runs_as_they_are():
    """README: every preset holds a paper table's setup but those it names. A preset holds one
    where some table's cell runs on it with its own data set and number of rounds."""
    import re

    from experiments.runtime.run_config import load_preset

    root = Path(__file__).resolve().parents[1]
    held = set()
    for name in table_names():
        for cell in load_table(name, build_partitions=False).cells:
            if cell.config is None or not cell.recipe.startswith("preset "):
                continue
            preset = cell.recipe.split()[1]
            own = load_preset(preset)
            if all(cell.config[key] == own.get(key, cell.config[key]) for key in ("dataset", "num-rounds")):
                held.add(preset)
    presets = {path.stem for path in (root / "experiments" / "presets").glob("*.toml")}
    sentence = re.search(r"A preset holds a paper table's setup \(all but (.*?):", (root / "README.md").read_text(),
                         re.S).group(1)
    assert set(re.findall(r"`([a-z0-9.-]+)`", sentence)) == presets - held


def test_the_seeds_per_sweep_the_docs_state_are_the_sweep_files():
    """docs/sweeps.md: "The comparisons use 3 seeds (N of the M papers' files)"; the sweeps
    beyond the papers (no base preset) choose their own."""
    import re
    import tomllib

    root = Path(__file__).resolve().parents[1]
    specs = [tomllib.loads(path.read_text()) for path in sorted((root / "experiments" / "sweep_files").glob("*.toml"))]
    files = [spec for spec in specs if "preset" in spec]
    seeds = [len(spec.get("grid", {}).get("seed", [0])) for spec in files]
    stated = re.search(r"use 3 seeds \((\d+) of the (\d+) papers' files\)", (root / "docs" / "sweeps.md").read_text())
    assert (int(stated.group(1)), int(stated.group(2))) == (seeds.count(3), len(files))
    assert set(seeds) == {1, 3}  # the others, one seed: the sentence's "one (seed 0)"
