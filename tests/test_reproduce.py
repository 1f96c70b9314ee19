"""Reproduction reports (experiments/reproduction/runner.py and report_files.py; python -m
experiments.reproduce): every cell's run, the comparison with the papers' numbers, the
report's files, the command line, and a real run of a small table on the digits (slow tier).
The tables as data: test_table_cells.py; the verdict rules: test_verdicts.py."""

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
from experiments.reproduction.table_cells import TableError, load_table
from experiments.reproduction.verdicts import compare, headline
from tests.test_table_cells import PAPER_CELLS

REPO = Path(__file__).resolve().parents[1]




# ---- the comparison ------------------------------------------------------------------------


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
    assert "| FedAvg | Dir(0.5) | + IMA | % | 84.0 | 88.00 ± 0.00 | 4.00 | differs | 4.00 | 7.00 | same sign |" in markdown
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
    assert "| FedProx | Rounds |  | rounds | 3 | ≥ 3 (1 of 2 seeds reached) |  | open: 1 of 2 seeds reached the target |" in markdown


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


def test_a_set_that_makes_several_rows_one_configuration_runs_it_once_and_reports_it_once(tmp_path):
    """--set strategy=fedavg over a table whose rows are methods: each column's rows are one
    configuration, run once and reported once, naming the rows it stands for, compared with
    none of their paper numbers; the headline counts it apart from the compared cells."""
    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    one = load_table(str(path), {"strategy": "fedavg"})
    sweep, runs_of = build_sweep(one, 2)
    assert len(sweep.runs) == 3 * 2 * 2  # the FedAvg row alone: 3 run columns × 2 variants × 2 seeds
    assert runs_of["FedAvg | Dir(0.5)"] == runs_of["FedProx | Dir(0.5)"]
    report = compare(one, *fake_results(one, {"FedAvg | Dir(0.5)": [80.0, 80.0]}))
    rows = report[report["column"].eq("Dir(0.5)") & report["variant"].eq("")]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert (row["row"], row["basin"], row["paper"]) == ("FedAvg / FedProx", pytest.approx(80.0), "")
    assert row["verdict"] == "not compared: --set strategy=fedavg makes rows FedAvg, FedProx one configuration, run once"
    assert not report["verdict"].isin(["match", "differs"]).any()
    assert headline(report).startswith("0 of 0 cells run match the paper (")
    assert "configurations not compared: --set made several rows one" in headline(report)
    plain = load_table(str(path), {"lr": 0.5})  # a --set that keeps the rows apart keeps them apart
    assert len(compare(plain, *fake_results(plain, {}))) == 16


def test_reproduce_from_python_returns_the_report_and_refuses_bad_input_first(tmp_path):
    from experiments.api import reproduce
    from experiments.runtime.cli import UsageError

    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    done = reproduce(str(path), out=tmp_path / "out", report_only=True, progress=False)
    assert isinstance(done.report, pd.DataFrame) and len(done.report) == 16
    assert list(done.report.columns[:6]) == ["row", "column", "variant", "metric", "unit", "paper"]
    units = done.report.groupby("metric")["unit"].unique().map(list).to_dict()
    assert units == {"acc-last-k": ["%"], "rounds-to-target": ["rounds"]}  # accuracy in percent, as the paper's
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


def test_the_terminal_says_not_the_papers_setup_as_the_report_does(capsys, tmp_path):
    from experiments.reproduce import main

    path = tmp_path / "fake-table.toml"
    path.write_text(FAKE_TABLE)
    assert main([str(path), "--set", "strategy=fedavg", "--report-only", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "Not the paper's setup: every run was changed by --set strategy = 'fedavg'." in out
    assert "FedAvg / FedProx" in out


def test_dry_run_prints_every_cell_with_the_papers_value(capsys):
    from experiments.reproduce import main

    assert main(["ima-table1", "--dry-run", "--no-timing"]) == 0
    out = capsys.readouterr().out
    assert out.count(" acc-last-k ") == 192
    assert "FedFA | FMNIST (CNN), #C = 2 | + IMA 88.06" in " ".join(out.split())
    assert "192 run cells × 3 seeds:" in out
    # each FMNIST cell's estimate on 2 CPU cores and on the H100 (experiments/reproduction/estimates.py)
    assert " ".join(out.split()).count("≈ 17 min on 2 CPU cores; ≈ 44 s on one H100") == 32


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
    done = reproduce(str(path), "--only", "digits", "--out", str(out), "--no-progress", "--parallel", "2", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    first = {run.name: (run / "outcome.json").stat().st_mtime_ns for run in (out / "runs").iterdir()}
    assert sorted(first) == ["fedavg_digits_ima_seed=0", "fedavg_digits_seed=0"]
    assert "of 2 cells run match the paper (4 cells in the table; 2 not run" in done.stdout

    # The whole table: the digits runs are reused, the miniature's run.
    done = reproduce(str(path), "--out", str(out), "--no-progress", "--parallel", "2", timeout=600)
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




def test_a_set_that_makes_several_rows_one_configuration_reports_its_one_cost_measurement_once():
    """fedalign-table5 --set strategy=fedavg: FedAvg's one MFLOPs and parameter measurement
    stands for every row whose config it made the same (FedAvg, FedProx, MOON, …), reported once
    and compared with none of their paper values (it was matched against each of them)."""
    one = load_table("fedalign-table5", {"strategy": "fedavg"})
    costs = {cell.key: (87.3 if cell.metric == "mflops" else 0.61) for cell in one.cells
             if cell.metric in ("mflops", "params-m")}
    report = compare(one, *fake_results(one, {}), costs)
    for metric in ("mflops", "params-m"):
        rows = report[report["metric"].eq(metric)]
        merged = rows[rows["row"].str.contains(" / ")]
        assert len(merged) == 1, rows[["row", "verdict"]]
        assert merged.iloc[0]["row"] == "FedAvg / FedProx / MOON / Mixup / StochDepth / GradAug (n = 2) / FedAlign"
        assert merged.iloc[0]["verdict"].startswith("not compared: --set strategy=fedavg makes rows FedAvg, FedProx")
        assert not rows["row"].isin(["FedProx", "MOON", "FedAlign"]).any()


def test_each_cell_carries_its_95_percent_interval_and_a_pairs_gain_its_paired_interval(fake_table):
    """FedAvg Dir(0.5): seeds 80, 82, 81 ± 12.706 (t(0.975, 1) · s/√2, s = √2): [68.29, 93.71] covers the
    paper's 80.0; + IMA 81, 84: per-seed gains 1, 2, mean 1.5 ± 6.35; the report states the verdict rules."""
    values = {"FedAvg | Dir(0.5)": [80.0, 82.0], "FedAvg | Dir(0.5) | + IMA": [81.0, 84.0],
              "FedAvg | Dir(5)": [60.0, 60.2]}
    report = compare(fake_table, *fake_results(fake_table, values)).set_index(["row", "column", "variant"])
    assert report.loc[("FedAvg", "Dir(0.5)", ""), "basin 95% CI"] == "[68.29, 93.71] covers the paper's"
    assert report.loc[("FedAvg", "Dir(5)", ""), "basin 95% CI"] == "[58.83, 61.37] excludes the paper's"
    assert report.loc[("FedAvg", "Dir(0.5)", "+ IMA"), "paired gain 95% CI"] == "1.50 [-4.85, 7.85] (n = 2)"
    markdown = report_markdown(fake_table, report.reset_index())
    assert "Verdicts: an accuracy matches within 3 points of a paper value without ±" in markdown
    assert "| [68.29, 93.71] covers the paper's |  |" in markdown
