"""The verdict rules (experiments/reproduction/verdicts.py): Basin's number against the paper's,
for accuracies, gains and rounds to a target, each branch with the verdict it gives; a cell's
measurement from its runs, the speed-ups and the headline."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.reproduction.table_cells import Cell, PaperTable, PaperValue
from experiments.reproduction.verdicts import Measured, Tolerances, compare, gain_verdict, headline, measure_cell, verdict
from experiments.runtime.run_config import resolve_config


def test_accuracy_tolerance():
    tolerances = Tolerances()
    assert tolerances.accuracy(None, 5.0) == 3.0  # no ± in the paper: 3 points
    assert tolerances.accuracy(0.1, 0.0) == 1.0  # never tighter than 1 point
    assert tolerances.accuracy(0.6, 0.8) == pytest.approx(2.0)  # 2·√(0.36 + 0.64)


def test_gain_verdicts():
    assert gain_verdict(3.5, 4.5) == "gain match"
    assert gain_verdict(3.5, 5.5) == "same sign"
    assert gain_verdict(3.5, -0.2) == "opposite sign"


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


def test_a_zero_gain_matches_only_a_zero_gain():
    assert gain_verdict(0.0, 0.0) == "gain match"
    assert gain_verdict(0.0, 0.4) == "opposite sign"  # one side has no gain, the other has one
    assert gain_verdict(0.4, 0.0) == "opposite sign"


# -- Basin's number of a cell, from its runs' rows in the sweep table -----------------------------
def _runs(*rows: dict) -> pd.DataFrame:
    base = {"status": "completed", "error": "", "rounds": 100, "acc-last-k": float("nan"), "rounds-to-target": float("nan")}
    return pd.DataFrame([{**base, **row} for row in rows])


def _measured(metric: str, results: pd.DataFrame) -> Measured:
    cell = Cell("A method", "A column", "", PaperValue.parse("80.0"), metric, config={})
    return measure_cell(cell, results, {cell.key: ["s0", "s1"]})


@pytest.mark.parametrize("results, metric, expected", [
    # failed: the first failure's error; stopped (pending with an error): that error; none: not run yet
    (_runs({"run": "s0", "status": "failed", "error": "boom"}), "acc-last-k", Measured(note="failed: boom")),
    (_runs({"run": "s0", "status": "pending", "error": "interrupted at round 7"}), "acc-last-k",
     Measured(note="interrupted at round 7")),
    (_runs({"run": "other"}), "acc-last-k", Measured(note="not run yet")),
    (_runs({"run": "s0"}, {"run": "s1"}), "acc-last-k", Measured(note="its runs' summaries hold no accuracy")),
    # accuracies in percent: the mean and the sample std over the finished seeds
    (_runs({"run": "s0", "acc-last-k": 0.8}, {"run": "s1", "acc-last-k": 0.82}), "acc-last-k",
     Measured(pytest.approx(81.0), pytest.approx(2 ** 0.5), 2, per_seed={0: pytest.approx(80.0), 1: pytest.approx(82.0)})),
    # no seed reached the target: censored at the most rounds run
    (_runs({"run": "s0", "rounds": 90}, {"run": "s1"}), "rounds-to-target", Measured(100.0, 0.0, 2, censored=True)),
    # some seeds missed it: a lower bound, each missed seed counted at its last round
    (_runs({"run": "s0", "rounds-to-target": 40.0}, {"run": "s1", "rounds": 60}), "rounds-to-target",
     Measured(50.0, 0.0, 2, reached=1)),
    (_runs({"run": "s0", "rounds-to-target": 40.0}, {"run": "s1", "rounds-to-target": 60.0}), "rounds-to-target",
     Measured(50.0, pytest.approx(200 ** 0.5), 2)),
])
def test_each_way_a_cells_runs_can_stand_gives_its_measurement(results, metric, expected):
    assert _measured(metric, results) == expected


# -- compare's speed-ups and the headline -------------------------------------------------------
def _table(*cells: Cell) -> PaperTable:
    return PaperTable("t", Path("t.toml"), "A paper", "Table 1", "", 2, "3", ("",), False, ("A",), ("C", "R"), cells)


DIGITS = resolve_config({}, {})  # a config whose data is on every machine


def _rounds_cell(column: str, paper: str = "100") -> Cell:
    return Cell("A", column, "", PaperValue.parse(paper), "rounds-to-target", config=DIGITS)


SPEED_UP = Cell("A", "C", "", PaperValue.parse("2.0"), "speed-up", config=DIGITS, reference_column="R")


@pytest.mark.parametrize("own, reference, expected", [
    ([40.0, 40.0], [80.0, 80.0], (pytest.approx(2.0), "match")),
    ([None, None], [80.0, 80.0], (None, "not run: a run never reached the target")),  # censored
    ([40.0, None], [80.0, 80.0], (None, "not run: a run never reached the target")),  # a lower bound
    (None, [80.0, 80.0], (None, "not run: its rounds are not measured yet")),  # its own column has no run yet
])
def test_a_speed_up_is_the_reference_rounds_over_its_own_when_both_reached_the_target(own, reference, expected):
    table = _table(_rounds_cell("C"), _rounds_cell("R"), SPEED_UP)
    runs_of = {"A | C": ["c0", "c1"], "A | R": ["r0", "r1"]}
    rows = [{"run": f"r{s}", "rounds-to-target": value} for s, value in enumerate(reference)]
    rows += [{"run": f"c{s}", "rounds-to-target": value} for s, value in enumerate(own or [])]
    report = compare(table, _runs(*rows), runs_of).set_index("column")
    speed_up = report[report["metric"].eq("speed-up")].iloc[0]
    value = None if pd.isna(speed_up["basin"]) else speed_up["basin"]
    assert (value, speed_up["verdict"]) == expected


def test_the_headline_counts_what_matched_of_what_ran_and_why_the_rest_did_not():
    report = pd.DataFrame({
        "basin": [81.0, 90.0, None, None, None, None],
        "verdict": ["match", "differs", "not run: not run yet", "needs data: cifar10 is not on this machine",
                    "unsupported: no such model", "not reported: N/A"],
        "gain verdict": ["gain match", "opposite sign", "", "", "", ""],
    })
    assert headline(report) == ("1 of 2 cells run match the paper (6 cells in the table; 2 not run, 1 unsupported, "
                                "1 not reported); gains: 1 of 2 within 1.5 points, 1 of the same sign")


def test_a_cell_whose_data_is_not_on_this_machine_says_so():
    cifar = Cell("A", "C", "", PaperValue.parse("100"), "rounds-to-target",
                 config=resolve_config({}, {"dataset": "cifar10", "model": "cifar-cnn"}))
    report = compare(_table(cifar), _runs({"run": "other"}), {"A | C": ["c0"]})
    assert report.iloc[0]["verdict"] == "needs data: cifar10 is not on this machine"
