"""Reproduction reports (experiments/reproduction/table_cells.py, verdicts.py,
reproduction_report.py and reproduction.py; python -m experiments.reproduce): the papers'
tables as data, every cell's run, the comparison and its verdicts, the report's files, and
a real run of a small table on the digits (slow tier)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments.reproduction.report_files import basin_text, figure_panels, plotted, report_markdown, tolerance_bars, write_report
from experiments.reproduction.runner import build_sweep
from experiments.reproduction.table_cells import Cell, PaperValue, TableError, cell_status, load_table, select, table_names
from experiments.reproduction.verdicts import Measured, Tolerances, compare, gain_verdict, headline, verdict
from experiments.runtime.machine import ClientResources, check_machine

REPO = Path(__file__).resolve().parents[1]

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


# ---- the papers' tables as data ---------------------------------------------------------------

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


# ---- values, filters, verdicts -------------------------------------------------------------

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


def test_accuracy_tolerance():
    tolerances = Tolerances()
    assert tolerances.accuracy(None, 5.0) == 3.0  # no ± in the paper: 3 points
    assert tolerances.accuracy(0.1, 0.0) == 1.0  # never tighter than 1 point
    assert tolerances.accuracy(0.6, 0.8) == pytest.approx(2.0)  # 2·√(0.36 + 0.64)


def test_gain_verdicts():
    assert gain_verdict(3.5, 4.5) == "gain match"
    assert gain_verdict(3.5, 5.5) == "same sign"
    assert gain_verdict(3.5, -0.2) == "opposite sign"


FAKE_TABLE = """
paper = "A fake paper"
table = "Table 9"
caption = "accuracy without / with IMA, and rounds"
seeds = 2
variants = ["", "+ IMA"]
pair = true
[set]
dataset = "digits"
model = "mlp"
num-clients = 4
participation = 0.5
num-rounds = 3
local-epochs = 1
batch-size = 16
[variant-set]
"" = {averaging = "none"}
"+ IMA" = {averaging = "ima", avg-start = 2, window = 2}
[columns."Dir(0.5)"]
set = {alpha = 0.5}
[columns."Dir(5)"]
set = {alpha = 5.0}
[columns."Rounds"]
metric = "rounds-to-target"
set = {alpha = 0.5, target-accuracy = 0.5}
[columns."Far away"]
unsupported = "needs a data set nobody has"
[rows]
FedAvg = {strategy = "fedavg"}
FedProx = {strategy = "fedprox"}
[values]
FedAvg = ["80.0", "84.0", "70.0±0.5", "71.0±0.5", "300+", "2", "1", "2"]
FedProx = ["80.0", "N/A", "70.0", "71.0", "3", "2", "1", "2"]
"""


@pytest.fixture
def fake_table(tmp_path):
    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    return load_table(str(path))


def fake_results(table, values: dict[str, list[float]], rounds: dict[str, list[float | None]] | None = None):
    """The sweep table the runs would give: acc-last-k (fraction) per seed for each cell."""
    sweep, runs_of = build_sweep(table, 2)
    rows = []
    for key, run_ids in runs_of.items():
        for seed, run_id in enumerate(run_ids):
            row = {"run": run_id, "status": "completed", "error": "", "rounds": 3, "acc-last-k": float("nan"),
                   "rounds-to-target": float("nan")}
            if key in values:
                row["acc-last-k"] = values[key][seed] / 100
            if rounds and key in rounds:
                row["rounds-to-target"] = rounds[key][seed]
            rows.append(row)
    return pd.DataFrame(rows), runs_of


def test_the_comparison_gives_values_differences_gains_and_verdicts(fake_table, tmp_path):
    values = {
        "FedAvg | Dir(0.5)": [80.5, 81.5],  # mean 81: +1, match (3 points)
        "FedAvg | Dir(0.5) | + IMA": [88.0, 88.0],  # 88: +4, differs; gain 7 vs 4: same sign
        "FedAvg | Dir(5)": [70.8, 71.2],  # 71 ± 0.28: +1 within max(1, 2·√(0.25 + 0.08)) = 1.15
        "FedAvg | Dir(5) | + IMA": [70.0, 70.0],  # gain −1 against +1: opposite sign
        "FedProx | Dir(0.5)": [80.0, 80.0],
        "FedProx | Dir(5)": [70.0, 70.0],
        "FedProx | Dir(5) | + IMA": [71.5, 71.5],  # gain +1.5 against +1: gain match
    }
    rounds = {"FedAvg | Rounds": [None, None], "FedProx | Rounds": [3, 3], "FedProx | Rounds | + IMA": [2, 2],
              "FedAvg | Rounds | + IMA": [2, 3]}
    results, runs_of = fake_results(fake_table, values, rounds)
    report = compare(fake_table, results, runs_of).set_index(["row", "column", "variant"])

    first = report.loc[("FedAvg", "Dir(0.5)", "")]
    assert (first["basin"], first["difference"], first["verdict"], first["seeds"]) == (pytest.approx(81.0), pytest.approx(1.0), "match", 2)
    assert first["basin std"] == pytest.approx(math.sqrt(0.5))
    with_ima = report.loc[("FedAvg", "Dir(0.5)", "+ IMA")]
    assert (with_ima["verdict"], with_ima["paper gain"], with_ima["basin gain"]) == ("differs", 4.0, pytest.approx(7.0))
    assert with_ima["gain verdict"] == "same sign"
    spread = report.loc[("FedAvg", "Dir(5)", "")]
    assert (spread["verdict"], spread["tolerance"]) == ("match", pytest.approx(2 * math.hypot(0.5, math.sqrt(0.08))))
    assert report.loc[("FedAvg", "Dir(5)", "+ IMA")]["gain verdict"] == "opposite sign"
    assert report.loc[("FedProx", "Dir(5)", "+ IMA")]["gain verdict"] == "gain match"
    # Rounds: both never reaching the target match; a reached cell is compared within 15 %.
    never = report.loc[("FedAvg", "Rounds", "")]
    assert (never["basin censored"], never["verdict"]) == (True, "match")
    assert report.loc[("FedProx", "Rounds", "")]["verdict"] == "match"
    assert report.loc[("FedAvg", "Rounds", "+ IMA")]["basin"] == pytest.approx(2.5)
    assert report.loc[("FedAvg", "Rounds", "+ IMA")]["verdict"] == "differs"  # 2.5 against 2: 25 %
    # Cells that are not run say why.
    assert report.loc[("FedProx", "Dir(0.5)", "+ IMA")]["verdict"].startswith("not reported")
    assert report.loc[("FedAvg", "Far away", "")]["verdict"] == "unsupported: needs a data set nobody has"

    text = headline(report.reset_index())
    assert text == ("9 of 11 cells run match the paper (16 cells in the table; 0 not run, 4 unsupported, 1 not reported); "
                    "gains: 1 of 3 within 1.5 points, 2 of the same sign")  # gains of accuracy cells only

    # The figure: a panel per metric, each point with its own tolerance, and the gains.
    flat = report.reset_index()
    assert figure_panels(flat) == ["acc-last-k", "rounds-to-target", "gain"]
    points = plotted(flat).set_index(["row", "column", "variant"])
    bars = dict(zip(points.index, tolerance_bars(points.reset_index())))
    assert bars[("FedAvg", "Dir(5)", "")] == pytest.approx(2 * math.hypot(0.5, math.sqrt(0.08)))  # its paper ±
    assert bars[("FedAvg", "Dir(0.5)", "")] == 3.0 and bars[("FedProx", "Rounds", "")] == pytest.approx(0.45)
    assert ("FedAvg", "Rounds", "") not in bars  # never reached: no point

    files = write_report(fake_table, report.reset_index(), tmp_path / "out")
    assert [f.name for f in files] == ["report.md", "report.csv", "report.png"]
    markdown = files[0].read_text()
    assert "9 of 11 cells run match the paper" in markdown
    assert "| FedAvg | Dir(0.5) | + IMA | 84.0 | 88.00 ± 0.00 | 4.00 | differs | 4.00 | 7.00 | same sign |" in markdown
    assert len(pd.read_csv(files[1])) == 16


def test_a_half_done_table_reports_what_finished(fake_table):
    results, runs_of = fake_results(fake_table, {"FedAvg | Dir(0.5)": [80.0, 82.0]})
    half = results[results["run"].isin(runs_of["FedAvg | Dir(0.5)"][:1]) | ~results["run"].isin(runs_of["FedAvg | Dir(0.5)"])]
    half.loc[half["run"].isin(runs_of["FedProx | Dir(0.5)"]), "status"] = "pending"
    failed = runs_of["FedProx | Dir(5)"]
    half.loc[half["run"].isin(failed), ["status", "error"]] = ["failed", "RunFailed: boom"]
    report = compare(fake_table, half, runs_of).set_index(["row", "column", "variant"])
    assert (report.loc[("FedAvg", "Dir(0.5)", "")]["basin"], report.loc[("FedAvg", "Dir(0.5)", "")]["seeds"]) == (80.0, 1)
    assert report.loc[("FedProx", "Dir(0.5)", "")]["verdict"] == "not run: not run yet"
    assert report.loc[("FedProx", "Dir(5)", "")]["verdict"] == "not run: failed: RunFailed: boom"


def test_a_rounds_cell_where_a_seed_missed_the_target_is_a_lower_bound_and_never_a_match(fake_table):
    """The mean over the seeds that reached the target alone is biased low: it once said
    "match" for a cell where half the seeds never got there."""
    rounds = {"FedProx | Rounds": [3, None],  # the missed seed counts its 3 rounds: ≥ 3, paper 3
              "FedAvg | Rounds | + IMA": [2, None]}  # ≥ 2.5 against the paper's 2: more than 15 % over
    results, runs_of = fake_results(fake_table, {}, rounds)
    report = compare(fake_table, results, runs_of).set_index(["row", "column", "variant"])
    open_cell = report.loc[("FedProx", "Rounds", "")]
    assert open_cell["verdict"] == "open: 1 of 2 seeds reached the target" and pd.isna(open_cell["difference"])
    assert basin_text(open_cell.to_dict() | {"metric": "rounds-to-target"}) == "≥ 3 (1 of 2 seeds reached)"
    assert report.loc[("FedAvg", "Rounds", "+ IMA")]["verdict"] == "differs"
    assert report.loc[("FedAvg", "Rounds", "+ IMA")]["basin"] == pytest.approx(2.5)
    markdown = report_markdown(fake_table, report.reset_index())
    assert "| FedProx | Rounds |  | 3 | ≥ 3 (1 of 2 seeds reached) |  | open: 1 of 2 seeds reached the target |" in markdown


def test_an_interrupted_cell_says_where_it_stopped_and_how_to_go_on(fake_table):
    results, runs_of = fake_results(fake_table, {"FedAvg | Dir(0.5)": [80.0, 82.0]})
    stopped = runs_of["FedProx | Dir(0.5)"]
    results.loc[results["run"].isin(stopped), ["status", "error"]] = [
        "pending", "interrupted at round 2 of 3 — run the same command to resume"]
    report = compare(fake_table, results, runs_of).set_index(["row", "column", "variant"])
    assert report.loc[("FedProx", "Dir(0.5)", "")]["verdict"] == \
        "interrupted at round 2 of 3 — run the same command to resume"
    not_run = report["verdict"].str.startswith(("not run", "interrupted")).sum()
    assert f"; {not_run} not run," in headline(report.reset_index())


def test_where_the_data_lives_does_not_make_a_report_another_setup(tmp_path):
    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    placed = load_table(str(path), {"data-dir": str(tmp_path), "device": "cpu", "checkpoint-every": 5})
    results, runs_of = fake_results(placed, {})
    markdown = report_markdown(placed, compare(placed, results, runs_of))
    assert "Not the paper's setup" not in markdown
    assert f"Run with --set data-dir = '{tmp_path}', device = 'cpu', checkpoint-every = 5" in markdown
    changed = load_table(str(path), {"lr": 0.5, "data-dir": str(tmp_path)})
    markdown = report_markdown(changed, compare(changed, *fake_results(changed, {})))
    assert "**Not the paper's setup**: every run was changed by --set lr = 0.5." in markdown


def test_reproduce_from_python_returns_the_report_and_refuses_bad_input_first(tmp_path):
    from experiments.api import reproduce
    from experiments.runtime.cli import UsageError

    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    done = reproduce(str(path), out=tmp_path / "out", report_only=True, progress=False)
    assert isinstance(done.report, pd.DataFrame) and len(done.report) == 16
    assert list(done.report.columns[:5]) == ["row", "column", "variant", "metric", "paper"]
    assert done.headline.startswith("0 of 0 cells run match the paper (16 cells in the table")
    assert [f.name for f in done.files] == ["report.md", "report.csv"] and all(f.is_file() for f in done.files)
    cells = reproduce(str(path), only=["FedAvg"], dry_run=True)
    assert isinstance(cells, pd.DataFrame) and set(cells["cell"].str.split(" | ").str[0]) == {"FedAvg"}
    with pytest.raises(UsageError, match="seeds = 0 is not allowed"):
        reproduce(str(path), seeds=0)
    with pytest.raises(UsageError, match=r"only = 'FedAvg' is not allowed; allowed: a list of filters"):
        reproduce(str(path), only="FedAvg")
    with pytest.raises(TableError, match="matches no cell"):
        reproduce(str(path), only=["ImageNet"], report_only=True)


def test_cells_with_one_config_share_their_runs(tmp_path):
    table = load_table("ima-table2")
    sweep, runs_of = build_sweep(table, 3)
    # Rounds and speed-up cells of a column are one run per seed; 6 rows × 5 columns × 3 seeds.
    assert len(sweep.runs) == 6 * 5 * 3
    assert "FedAvg | t_s = 150 | speed-up" not in runs_of


# ---- the command line ----------------------------------------------------------------------

def reproduce(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.reproduce", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_list_names_every_table_with_its_counts(capsys, monkeypatch):
    from experiments.reproduce import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, cells in PAPER_CELLS.items():
        line = next(line for line in lines if line.split() and line.split()[0] == name)
        assert line.split()[-7] == str(cells), line  # the cells column, before the six counts


def test_dry_run_prints_every_cell_with_the_papers_value(capsys):
    from experiments.reproduce import main

    assert main(["ima-table1", "--dry-run", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert out.count(" acc-last-k ") == 192
    assert "FedFA | FMNIST (CNN), #C = 2 | + IMA 88.06" in " ".join(out.split())
    assert "192 run cells × 3 seeds:" in out


def test_usage_errors_are_named_before_anything_starts():
    done = reproduce("ima-table9")
    assert done.returncode == 2 and "not found (did you mean 'ima-table" in done.stderr
    done = reproduce("ima-table1", "--only", "ImageNet", "--dry-run")
    assert done.returncode == 2 and "matches no cell" in done.stderr
    done = reproduce("ima-table1", "--set", "lr=-1", "--dry-run")
    assert done.returncode == 2 and "'lr'" in done.stderr


# ---- a real table, run (slow tier) ----------------------------------------------------------

REAL_TABLE = """
paper = "A tiny paper"
table = "Table 1"
caption = "FedAvg without / with IMA on the digits and on a FEMNIST-like miniature"
seeds = 1
variants = ["", "+ IMA"]
pair = true
[set]
model = "mlp"
num-rounds = 2
local-epochs = 1
batch-size = 16
[variant-set]
"" = {{averaging = "none"}}
"+ IMA" = {{averaging = "ima", avg-start = 1, window = 2}}
[columns.digits]
set = {{dataset = "digits", num-clients = 4, participation = 0.5}}
[columns.femnist]
set = {{dataset = "hf:{femnist}", partition = "natural", num-clients = 6, participation = 0.5}}
[rows]
FedAvg = {{strategy = "fedavg"}}
[values]
FedAvg = ["80.0", "84.0", "60.0", "62.0"]
"""


@pytest.mark.slow
def test_a_table_runs_resumes_and_reports_the_runs_numbers(tmp_path, miniature_hub):
    path = tmp_path / "tiny.toml"
    path.write_text(REAL_TABLE.format(femnist=miniature_hub["femnist"]))
    out = tmp_path / "out"
    # Half of the table first: the digits column.
    done = reproduce(str(path), "--only", "digits", "--out", str(out), "--no-progress", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    first = {run.name: (run / "outcome.json").stat().st_mtime_ns for run in (out / "runs").iterdir()}
    assert sorted(first) == ["fedavg_digits_ima_seed=0", "fedavg_digits_seed=0"]
    assert "of 2 cells run match the paper (4 cells in the table; 2 not run" in done.stdout

    # The whole table: the digits runs are reused, the miniature's run.
    done = reproduce(str(path), "--out", str(out), "--no-progress", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = {run.name: (run / "outcome.json").stat().st_mtime_ns for run in (out / "runs").iterdir()}
    assert len(runs) == 4 and all(runs[name] == first[name] for name in first)
    report = pd.read_csv(out / "report.csv", keep_default_na=False, na_values={"basin": [""]})
    report = report.set_index(["column", "variant"])
    for (column, variant), run_name in {("digits", ""): "fedavg_digits_seed=0",
                                        ("femnist", "+ IMA"): "fedavg_femnist_ima_seed=0"}.items():
        summary = json.loads((out / "runs" / run_name / "summary.json").read_text())
        expected = summary["acc-last-k"] * 100
        assert report.loc[(column, variant), "basin"] == pytest.approx(expected)
    assert report["seeds"].eq(1).all() and report["verdict"].isin(["match", "differs"]).all()
    assert (out / "report.md").is_file() and (out / "report.png").is_file()

    # A third call only reports.
    done = reproduce(str(path), "--out", str(out), "--no-progress", timeout=300)
    assert done.returncode == 0 and {r.name: (r / "outcome.json").stat().st_mtime_ns for r in (out / "runs").iterdir()} == runs


def _verdict_of(metric: str, paper: str, basin: Measured) -> str:
    cell = Cell("A method", "A column", "", PaperValue.parse(paper), metric, config={})
    return verdict(cell, basin)[0]


# Every branch of the verdict rules (experiments/reproduction/verdicts.py), each with the verdict
# it must give: a branch that returned another would fail its case.
@pytest.mark.parametrize("metric, paper, basin, expected", [
    # accuracy: 3 points without the paper's ±; with it, 2·√(± ² + std²), at least 1 point
    ("acc-last-k", "80.0", Measured(82.9, 0.0, 1), "match"),
    ("acc-last-k", "80.0", Measured(83.1, 0.0, 1), "differs"),
    ("acc-last-k", "80.0±0.3", Measured(80.9, 0.0, 2), "match"),
    ("acc-last-k", "80.0±0.3", Measured(81.1, 0.0, 2), "differs"),
    # rounds to target, both reached: within 15 %
    ("rounds-to-target", "100", Measured(114.0, 0.0, 2), "match"),
    ("rounds-to-target", "100", Measured(116.0, 0.0, 2), "differs"),
    # neither reached it within its rounds: a match; only one side reached it: differs, either side
    ("rounds-to-target", "1000+", Measured(300.0, 0.0, 2, censored=True), "match"),
    ("rounds-to-target", "1000+", Measured(120.0, 0.0, 2), "differs"),
    ("rounds-to-target", "100", Measured(300.0, 0.0, 2, censored=True), "differs"),
    # some seeds missed it: a lower bound, never a match; too many rounds even so: differs
    ("rounds-to-target", "100", Measured(105.0, 0.0, 2, reached=1), "open: 1 of 2 seeds reached the target"),
    ("rounds-to-target", "100", Measured(130.0, 0.0, 2, reached=1), "differs"),
    # a speed-up within 15 %, costs within 5 %
    ("speed-up", "2.0", Measured(2.25, 0.0, 1), "match"),
    ("speed-up", "2.0", Measured(2.35, 0.0, 1), "differs"),
    ("mflops", "100", Measured(104.0, 0.0, 1), "match"),
    ("mflops", "100", Measured(106.0, 0.0, 1), "differs"),
])
def test_every_branch_of_the_verdict_rules_gives_its_verdict(metric, paper, basin, expected):
    assert _verdict_of(metric, paper, basin) == expected


def test_a_cell_without_a_number_on_either_side_gets_no_verdict():
    assert _verdict_of("acc-last-k", "80.0", Measured(note="not run yet")) == ""
    assert _verdict_of("acc-last-k", "N/A", Measured(80.0, 0.0, 1)) == ""


def test_the_cell_counts_in_docs_reproducing_are_the_tables():
    """docs/reproducing.md's count of each table's cells, and their total, are the table files'."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "reproducing.md").read_text()
    counts = {name: int(count) for name, count in re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| (\d+) \|", text, re.M)}
    assert counts == {name: len(load_table(name).cells) for name in table_names()}
    assert re.search(r"^\| \*\*all\*\* \| \| \*\*(\d+)\*\* \|", text, re.M).group(1) == str(sum(counts.values()))
