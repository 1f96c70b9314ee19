"""Sweep report on hand-made results tables: pairing, gains, table cells, files written."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from experiments.sweep_report import (
    accuracy_data,
    accuracy_table,
    intervals_table,
    load_results,
    main,
    paired_gains,
    write_report,
)

CONSTANT = {
    "dataset": "digits", "partition": "dirichlet", "alpha": 0.1, "classes-per-client": 2, "num-clients": 10,
    "participation": 0.1, "local-epochs": 2, "num-rounds": 10, "lr": 0.05, "target-accuracy": 0.7,
    "window": 5, "avg-start": 0.75, "avg-feedback": False, "avg-subset": "all", "ima-exploration": "none",
    "ima-decay": 1.0, "swa-cycle": 1, "output-dir": "", "data-dir": "",
}
# acc-last-k per (strategy, averaging, alpha), seeds 0 and 1. Gains in points:
# fedavg Dir(0.1) 2, 4 → +3.00; fedavg Dir(0.5) +1.00; fedprox Dir(0.1) 1, 3 → +2.00; fedprox Dir(0.5) -1.00.
ACCURACY = {
    ("fedavg", "none", 0.1): (0.60, 0.62), ("fedavg", "ima", 0.1): (0.62, 0.66),
    ("fedavg", "none", 0.5): (0.80, 0.80), ("fedavg", "ima", 0.5): (0.81, 0.81),
    ("fedprox", "none", 0.1): (0.58, 0.60), ("fedprox", "ima", 0.1): (0.59, 0.63),
    ("fedprox", "none", 0.5): (0.79, 0.81), ("fedprox", "ima", 0.5): (0.78, 0.80),
}


def run_row(number: int, status: str = "completed", acc: float = 0.5, rounds_to_target: float = 5.0, **config) -> dict:
    return {
        "run": f"run-{number}", "status": status, "error": "" if status == "completed" else "boom",
        **CONSTANT, **config,
        "acc-last-k": acc, "last-k": 3, "acc-best": acc, "best-round": 9, "acc-final": acc,
        "rounds-to-target": rounds_to_target, "rounds": 10, "wall-seconds": 1.0, "run-seconds": 1.0,
        "run-dir": f"/tmp/run-{number}",
    }


def grid() -> pd.DataFrame:
    configs = [(strategy, averaging, alpha, seed, acc)
               for (strategy, averaging, alpha), accs in ACCURACY.items() for seed, acc in enumerate(accs)]
    rows = [run_row(i, acc=acc, strategy=strategy, averaging=averaging, alpha=alpha, seed=seed)
            for i, (strategy, averaging, alpha, seed, acc) in enumerate(configs)]
    # A failed run with a wild accuracy and another lr: ignored, and lr must not become a varied key.
    rows.append(run_row(99, status="failed", acc=0.0, strategy="fedavg", averaging="ima", alpha=0.1, seed=0, lr=0.3))
    return pd.DataFrame(rows)


def test_paired_gains_are_per_seed_differences_with_the_base_run():
    gains = paired_gains(grid())
    assert len(gains) == 8 and (gains["averaging"] == "ima").all()
    by_group = gains.groupby(["strategy", "alpha"])["gain"].agg(["mean", "std"])
    assert by_group.loc[("fedavg", 0.1), "mean"] == pytest.approx(0.03)
    assert by_group.loc[("fedprox", 0.1), "mean"] == pytest.approx(0.02)
    assert by_group.loc[("fedprox", 0.5), "mean"] == pytest.approx(-0.01)
    first = gains[(gains["strategy"] == "fedavg") & (gains["alpha"] == 0.1) & (gains["seed"] == 0)].iloc[0]
    assert first["base-acc-last-k"] == pytest.approx(0.60) and first["gain"] == pytest.approx(0.02)
    assert set(gains["method"]) == {"fedavg+ima", "fedprox+ima"}
    assert set(gains["setting"]) == {"Dir(0.1)", "Dir(0.5)"}


def test_a_base_run_with_another_lr_does_not_pair():
    results = grid()
    base = ((results["strategy"] == "fedprox") & (results["averaging"] == "none")
            & (results["alpha"] == 0.5) & (results["seed"] == 1))
    results.loc[base, "lr"] = 0.01
    gains = paired_gains(results).set_index(["strategy", "alpha", "seed"])
    assert math.isnan(gains.loc[("fedprox", 0.5, 1), "gain"])
    assert gains.loc[("fedprox", 0.5, 0), "gain"] == pytest.approx(-0.01)
    assert gains["gain"].notna().sum() == 7


def test_accuracy_table_cells_and_order():
    table = accuracy_table(grid())
    assert list(table.index) == ["fedavg", "fedavg+ima", "fedprox", "fedprox+ima"]
    assert list(table.columns) == ["Dir(0.1)", "Dir(0.5)"]
    assert table.loc["fedavg", "Dir(0.1)"] == "61.00 ± 1.00"
    assert table.loc["fedavg+ima", "Dir(0.1)"] == "64.00 ± 2.00 (+3.00)"
    assert table.loc["fedavg+ima", "Dir(0.5)"] == "81.00 ± 0.00 (+1.00)"
    assert table.loc["fedprox+ima", "Dir(0.1)"] == "61.00 ± 2.00 (+2.00)"
    assert table.loc["fedprox+ima", "Dir(0.5)"] == "79.00 ± 1.00 (-1.00)"


def test_setting_labels_use_paper_notation_and_single_seeds_have_no_std():
    partitions = [{"partition": "dirichlet", "alpha": 0.1}, {"partition": "shards", "classes-per-client": 2},
                  {"partition": "iid", "classes-per-client": 3}]
    methods = [("none", 0.70), ("wima", 0.73)]
    rows = [run_row(2 * i + j, acc=acc, strategy="fedavg", averaging=averaging, seed=0, **partition)
            for i, partition in enumerate(partitions) for j, (averaging, acc) in enumerate(methods)]
    table = accuracy_table(pd.DataFrame(rows))
    assert list(table.columns) == ["Dir(0.1)", "#C=2", "IID"]
    assert table.loc["fedavg", "#C=2"] == "70.00"
    assert table.loc["fedavg+wima", "IID"] == "73.00 (+3.00)"
    # Another varied key is appended as key=value; a missing combination is an empty cell.
    rows.append(run_row(9, acc=0.5, strategy="fedavg", averaging="none", seed=0, participation=0.5))
    table = accuracy_table(pd.DataFrame(rows))
    assert list(table.columns) == ["Dir(0.1), participation=0.1", "#C=2, participation=0.1", "IID, participation=0.1",
                                   "Dir(0.1), participation=0.5"]
    assert table.loc["fedavg+wima", "Dir(0.1), participation=0.5"] == ""


def write_sweep(directory, results: pd.DataFrame) -> None:
    directory.mkdir()
    results.to_parquet(directory / "results.parquet")
    rounds = np.arange(1, 11)
    curves = [pd.DataFrame({"run": row["run"], "round": rounds, "test-accuracy": row["acc-last-k"] * rounds / 10,
                            "base-accuracy": row["acc-last-k"] * rounds / 10, "averaged-accuracy": np.nan})
              for _, row in results.iterrows() if row["status"] == "completed"]
    pd.concat(curves).to_parquet(directory / "curves.parquet")


def test_write_report_writes_tables_and_the_figures_that_apply(tmp_path):
    write_sweep(tmp_path / "sweep", grid())
    paths = write_report(tmp_path / "sweep")
    report = tmp_path / "sweep" / "report"
    names = {p.name for p in paths}
    assert names == {"accuracy-table.csv", "accuracy-table.md", "intervals.md", "gains.csv", "gain-vs-alpha.png",
                     "curves-dir-0.1.png", "curves-dir-0.5.png"}
    assert all(p.parent == report and p.is_file() for p in paths)
    assert not (report / "gain-vs-participation.png").exists()
    assert all((report / n).stat().st_size > 1000 for n in names if n.endswith(".png"))
    table = (report / "accuracy-table.md").read_text()
    assert table.startswith("Last-k test accuracy in percent: mean ± std over seeds")  # the unit, said
    assert "\n\n| method | Dir(0.1) | Dir(0.5) |\n| --- | --- | --- |\n" in table
    assert "| fedavg+ima | 64.00 ± 2.00 (+3.00) | 81.00 ± 0.00 (+1.00) |" in table
    # The CSV holds the same numbers in fractions, as every file a run or a sweep writes.
    data = pd.read_csv(report / "accuracy-table.csv").set_index(["method", "setting"])
    assert list(data.columns) == ["acc-last-k", "acc-last-k-std", "seeds", "acc-last-k-ci95-low", "acc-last-k-ci95-high",
                                  "gain", "gain-seeds", "gain-ci95-low", "gain-ci95-high"]
    assert data.loc[("fedavg+ima", "Dir(0.1)"), ["acc-last-k", "acc-last-k-std", "seeds", "gain", "gain-seeds"]].tolist() \
        == pytest.approx([0.64, 0.02, 2, 0.03, 2])
    assert "| fedavg+ima | Dir(0.1) | 64.00 [38.59, 89.41] (n = 2) | 3.00 [-9.71, 15.71] (n = 2) |" in \
        (report / "intervals.md").read_text()
    assert np.isnan(data.loc[("fedavg", "Dir(0.1)"), "gain"])
    assert len(pd.read_csv(report / "gains.csv")) == 8


def test_window_and_start_ablations(tmp_path):
    rows = [run_row(0, acc=0.70, rounds_to_target=8.0, strategy="fedavg", averaging="none", seed=0),
            run_row(1, acc=0.72, rounds_to_target=7.0, strategy="fedavg", averaging="none", seed=1)]
    for window in (3, 5):
        for start in (0.5, 0.75):
            for seed in (0, 1):
                reached = float("nan") if (window, start) == (3, 0.75) else 4.0 + seed
                rows.append(run_row(len(rows), acc=0.70 + window / 100 + seed / 100, rounds_to_target=reached,
                                    strategy="fedavg", averaging="ima", window=window, seed=seed,
                                    **{"avg-start": start}))
    results = pd.DataFrame(rows)
    assert "fedavg+ima (window=3, avg-start=0.5)" in accuracy_table(results).index
    write_sweep(tmp_path / "sweep", results)
    names = {p.name for p in write_report(tmp_path / "sweep", tmp_path / "out")}
    assert {"window-ablation.png", "rounds-to-target-vs-start.png", "curves-dir-0.1.png"} <= names
    assert (tmp_path / "out" / "window-ablation.png").stat().st_size > 1000
    assert not any(n.startswith("gain-vs-") for n in names)


def test_main_reports_a_missing_results_file(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "results.parquet" in err
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_main_prints_the_table_and_the_files(tmp_path, capsys):
    write_sweep(tmp_path / "sweep", grid())
    assert main([str(tmp_path / "sweep")]) == 0
    out = capsys.readouterr().out
    assert "| fedprox+ima | 61.00 ± 2.00 (+2.00) | 79.00 ± 1.00 (-1.00) |" in out and "gain-vs-alpha.png" in out


def test_load_sweep_falls_back_to_csv_without_curves(tmp_path):
    grid().to_csv(tmp_path / "results.csv", index=False)
    results, curves = load_results(tmp_path)
    assert len(results) == 17 and list(curves.columns) == ["run", "round"] and curves.empty
    assert accuracy_table(results).loc["fedavg+ima", "Dir(0.1)"] == "64.00 ± 2.00 (+3.00)"


def test_a_single_partition_is_still_named():
    rows = [run_row(j, acc=acc, strategy="fedavg", averaging=averaging, seed=0, partition="shards",
                    **{"classes-per-client": 2}) for j, (averaging, acc) in enumerate([("none", 0.7), ("ima", 0.72)])]
    assert list(accuracy_table(pd.DataFrame(rows)).columns) == ["#C=2"]


def test_accuracy_figure_names_methods_setup_and_averaging_start():
    import matplotlib.pyplot as plt

    from experiments.runtime.finished_runs import accuracy_figure, averaging_start, method_label, setup_title
    from experiments.runtime.run_config import resolve_config

    runs = {a: resolve_config({"averaging": a, "num-rounds": 30}) for a in ("none", "ima", "wima")}
    rounds = np.arange(1, 31)
    frame = pd.DataFrame({"round": rounds, "test-accuracy": rounds / 40, "base-accuracy": rounds / 40,
                          "averaged-accuracy": rounds / 40})
    curves = {method_label(c): frame for c in runs.values()}
    assert list(curves) == ["FedAvg", "FedAvg+IMA", "FedAvg+WIMA"]
    assert method_label(resolve_config({"strategy": "scaffold", "lr": 0.1}), ["lr"]) == "SCAFFOLD, lr=0.1"
    assert method_label(resolve_config({"normalize": False}), ["normalize"]) == "FedAvg, normalize=false"
    starts = {method_label(c): averaging_start(c) for c in runs.values()}
    assert starts == {"FedAvg": None, "FedAvg+IMA": 22, "FedAvg+WIMA": 5}  # IMA t_s = round(0.75·30); WIMA W
    title = setup_title(runs["none"])
    assert title == "digits, Dir(0.3), 10 clients, 50% per round"
    fig = accuracy_figure(curves, title, starts)
    ax = fig.axes[0]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"FedAvg", "FedAvg+IMA", "FedAvg+IMA: base model", "FedAvg+IMA: averaging from round 22"} <= set(labels)
    assert not any(label in ("none", "ima", "run") for label in labels)
    assert ax.get_title() == title
    assert all(float(t).is_integer() for t in ax.get_xticks())
    # Coinciding curves stay distinguishable: later runs thinner, base models dashed.
    widths = [line.get_linewidth() for line in ax.lines if line.get_label() in curves]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 3
    assert ax.get_ylabel() == "test accuracy (%)" and max(ax.lines[0].get_ydata()) == 75.0  # % as in sweep reports
    plt.close(fig)


def test_gain_vs_alpha_draws_one_curve_per_method_across_alpha(tmp_path, monkeypatch):
    """Each method's gains at α = 0.1 and 0.5 are two points of one line, not two lines of
    one point each (the Dirichlet notation named α in every line's label)."""
    import experiments.sweep_report as report

    drawn = []

    def record_lines(ax, stats, key, colours):
        drawn.append({line: sorted(points[key]) for line, points in stats.groupby("line", sort=False)})

    monkeypatch.setattr(report, "_errorbar_lines", record_lines)
    assert report.plot_gain_vs(grid(), "alpha", tmp_path / "gain-vs-alpha.png") is not None
    assert drawn == [{"fedavg+ima, Dir(α)": [0.1, 0.5], "fedprox+ima, Dir(α)": [0.1, 0.5]}]


def test_the_accuracy_and_the_paired_gain_carry_95_percent_student_t_intervals():
    """Two seeds: mean ± t(0.975, 1) · s/√2, s the sample std (ddof 1); fedavg Dir(0.1) 0.60, 0.62:
    0.61 ± 12.7062 · 0.014142/√2 = 0.61 ± 0.12706; its +IMA gain pairs seed by seed (0.02, 0.04)."""
    data = accuracy_data(grid()).set_index(["method", "setting"])
    base, ima = data.loc[("fedavg", "Dir(0.1)")], data.loc[("fedavg+ima", "Dir(0.1)")]
    assert (base["acc-last-k-ci95-low"], base["acc-last-k-ci95-high"]) == (pytest.approx(0.482938, abs=1e-6),
                                                                           pytest.approx(0.737062, abs=1e-6))
    assert (ima["gain"], ima["gain-seeds"]) == (pytest.approx(0.03), 2)
    assert (ima["gain-ci95-low"], ima["gain-ci95-high"]) == (pytest.approx(-0.097062, abs=1e-6),
                                                             pytest.approx(0.157062, abs=1e-6))
    assert math.isnan(base["gain"]) and base["gain-seeds"] == 0
    table = intervals_table(grid())
    assert table.loc["fedavg+ima"].iloc[0].tolist() == ["Dir(0.1)", "64.00 [38.59, 89.41] (n = 2)",
                                                        "3.00 [-9.71, 15.71] (n = 2)"]


def test_the_gains_interval_is_over_the_paired_seeds_not_the_two_means():
    """Seeds that move both runs alike (0.60, 0.70, 0.80 and each + 0.01): the paired gain is
    0.01 on every seed, its interval [0.01, 0.01], where the means' spread would swamp it."""
    rows = [run_row(i, acc=acc + (0.01 if averaging == "ima" else 0.0), strategy="fedavg", averaging=averaging,
                    seed=seed)
            for i, (averaging, (seed, acc)) in enumerate((a, s) for a in ("none", "ima")
                                                         for s in enumerate((0.60, 0.70, 0.80)))]
    ima = accuracy_data(pd.DataFrame(rows)).set_index("method").loc["fedavg+ima"]
    assert ima["gain"] == pytest.approx(0.01) and ima["gain-seeds"] == 3
    assert ima["gain-ci95-low"] == pytest.approx(0.01) and ima["gain-ci95-high"] == pytest.approx(0.01)
    assert ima["acc-last-k-ci95-high"] - ima["acc-last-k-ci95-low"] > 0.4  # 0.71 ± 0.248


def test_paired_gains_carry_the_simulated_time_to_target_of_both_runs():
    """A sweep on the simulated clock: gains.csv has each run's time to target beside its base run's."""
    results = grid()
    results["time-to-target"] = range(len(results))
    gains = paired_gains(results)
    for _, row in gains.iterrows():
        base = results[results["run"] == row["base-run"]].iloc[0]
        mine = results[results["run"] == row["run"]].iloc[0]
        assert (row["time-to-target"], row["base-time-to-target"]) == (mine["time-to-target"], base["time-to-target"])
