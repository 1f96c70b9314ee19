"""The verdict rules (experiments/reproduction/verdicts.py): Basin's number against the paper's,
for accuracies, gains and rounds to a target, each branch with the verdict it gives."""

from __future__ import annotations

import pytest

from experiments.reproduction.table_cells import Cell, PaperValue
from experiments.reproduction.verdicts import Measured, Tolerances, gain_verdict, verdict


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
