"""Tables and figures of a sweep: many federated runs over a grid of configs.

    .venv/bin/python -m experiments.sweep_report SWEEP_DIR [--out DIR]

Reads ``SWEEP_DIR/results.parquet`` and ``curves.parquet`` and writes to
``SWEEP_DIR/report/`` the views the IMA and WIMA papers show: the accuracy table with
each averaging method's gain over its base run (the same seed, split and settings), the
gains, gain against α, participation, local epochs and clients, rounds to target against
the averaging start, the window ablation, the heat maps of a sweep crossing two axes
(experiments/sweep_heatmaps.py), and the accuracy curves.

In detail: docs/command-lines.md (``.venv/bin/python -m experiments.sweep_report``)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from experiments.runtime.cli import exit_command, guarded, nonempty_path
from experiments.runtime.finished_runs import save_figure
from experiments.seed_intervals import SeedInterval, seed_interval
from experiments.sweep_heatmaps import heatmap_data, plot_heatmaps, value_text

AVERAGING_KEYS = ("averaging", "window", "avg-start", "avg-feedback", "avg-subset", "ima-exploration", "ima-decay",
                  "swa-cycle")
SUMMARY_COLUMNS = ("acc-last-k", "last-k", "acc-best", "best-round", "acc-final", "rounds-to-target", "time-to-target",
                   "simulated-time", "rounds",
                   "wall-seconds", "run-seconds")
# Columns that describe a run but are not part of its config (paths differ per run).
NOT_CONFIG = {"run", "status", "error", "run-dir", "output-dir", "data-dir", *SUMMARY_COLUMNS}
PARTITION_KEYS = ("partition", "alpha", "classes-per-client")
GAIN_KEYS = ("alpha", "participation", "local-epochs", "num-clients")
DASHES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v")


def load_results(directory: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Results (one row per run) and curves (per-round rows; empty if the sweep has none)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"sweep directory {directory} not found")

    def read(name: str) -> pd.DataFrame | None:
        for path, reader in ((directory / f"{name}.parquet", pd.read_parquet), (directory / f"{name}.csv", pd.read_csv)):
            if path.is_file():
                return reader(path)
        return None

    results = read("results")
    if results is None:
        raise FileNotFoundError(f"{directory / 'results.parquet'} (or results.csv) not found")
    if "status" not in results.columns:
        raise ValueError(
            f"{directory} holds one run's per-round results, not a sweep's table of runs; allowed: a sweep folder "
            f"(experiments.sweep --out); a run's own figure is accuracy.png, its summary summary.json"
        )
    curves = read("curves")
    return results, curves if curves is not None else pd.DataFrame(columns=["run", "round"])


def config_columns(frame: pd.DataFrame) -> list[str]:
    """The run-config columns of a results-like frame (no ids, statuses, summaries or paths)."""
    return [c for c in frame.columns if c not in NOT_CONFIG]


def varied_keys(frame: pd.DataFrame) -> list[str]:
    """Config columns with more than one distinct value in ``frame``."""
    return [c for c in config_columns(frame) if frame[c].nunique(dropna=False) > 1]


def setting_label(row: pd.Series, keys: Iterable[str], exclude: Iterable[str] = ()) -> str:
    """Human-readable setting: the partition in paper notation (always: a sweep on one
    partition still says which, e.g. ``#C=2``), other varied keys as key=value. An
    ``exclude``d partition key (a figure's x-axis) is left symbolic: ``Dir(α)``, ``#C=k``,
    so that its values are points of one line, not lines of one point."""
    keys, exclude = list(keys), set(exclude)
    parts = []
    if "partition" in row:
        alpha = "α" if "alpha" in exclude else value_text(row.get("alpha"))
        classes = "k" if "classes-per-client" in exclude else value_text(row.get("classes-per-client"))
        notation = {"dirichlet": f"Dir({alpha})", "dirichlet-client": f"client-wise Dir({alpha})",
                    "shards": f"#C={classes}", "iid": "IID"}
        parts.append(notation.get(row["partition"], str(row["partition"])))
        keys = [k for k in keys if k not in PARTITION_KEYS]
    parts += [f"{k}={value_text(row[k])}" for k in keys]
    return ", ".join(parts) or "all"


def label_runs(completed: pd.DataFrame, exclude: Iterable[str] = ()) -> pd.DataFrame:
    """Copy with ``method`` (strategy[+averaging] and its varied averaging keys) and ``setting``
    columns; what varies is judged within ``completed``, ``exclude``d keys are left out of both."""
    exclude = set(exclude)
    averaged = completed[completed["averaging"] != "none"]
    method_keys = [k for k in varied_keys(averaged) if k in AVERAGING_KEYS[1:] and k not in exclude]
    setting_keys = [k for k in varied_keys(completed) if k not in {"strategy", "seed", *AVERAGING_KEYS, *exclude}]

    def method(row: pd.Series) -> str:
        if row["averaging"] == "none":
            return row["strategy"]
        suffix = ", ".join(f"{k}={value_text(row[k])}" for k in method_keys)
        return f"{row['strategy']}+{row['averaging']}" + (f" ({suffix})" if suffix else "")

    labelled = completed.copy()
    labelled["method"] = [method(row) for _, row in completed.iterrows()]
    labelled["setting"] = [setting_label(row, setting_keys, exclude) for _, row in completed.iterrows()]
    return labelled


def seed_stats(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean, std (ddof=0) and count of ``value`` over seeds per group, groups in order of first
    appearance; a group with a NaN (e.g. a seed that never reached the target) has mean NaN."""
    return (frame.groupby(by, sort=False, dropna=False)[value]
            .agg(mean=lambda s: s.mean(skipna=False), std=lambda s: s.std(ddof=0), n="size").reset_index())


def _completed(results: pd.DataFrame) -> pd.DataFrame:
    return results[results["status"] == "completed"].reset_index(drop=True)


def paired_gains(results: pd.DataFrame) -> pd.DataFrame:
    """One row per completed averaged run: its config, method, setting, accuracy, its base run's
    accuracy and rounds-to-target (and time-to-target, on the simulated clock), and ``gain`` =
    acc-last-k − base acc-last-k (NaN if unpaired)."""
    labelled = label_runs(_completed(results))
    pair_keys = [c for c in config_columns(results) if c not in AVERAGING_KEYS]
    # A repeated base config (a re-run) pairs once, with its first completed run.
    # runs on the simulated clock (system-speeds) also have their simulated time to target
    targets = ["rounds-to-target", *(["time-to-target"] if "time-to-target" in labelled else [])]
    base = (labelled[labelled["averaging"] == "none"].drop_duplicates(pair_keys)
            [[*pair_keys, "run", "acc-last-k", *targets]]
            .rename(columns={"run": "base-run", "acc-last-k": "base-acc-last-k",
                             **{target: f"base-{target}" for target in targets}}))
    averaged = labelled[labelled["averaging"] != "none"]
    columns = ["run", *config_columns(results), "method", "setting", "acc-last-k", *targets]
    gains = averaged[columns].merge(base, on=pair_keys, how="left")
    gains["gain"] = gains["acc-last-k"] - gains["base-acc-last-k"]
    return gains


def accuracy_data(results: pd.DataFrame) -> pd.DataFrame:
    """One row per method and setting, in fractions like every file a run writes:
    ``acc-last-k`` (mean over seeds), ``acc-last-k-std`` (ddof 0), ``seeds``, the 95 % Student-t
    interval of the mean (``acc-last-k-ci95-low``/``-high``: experiments/seed_intervals.py,
    NaN with one seed), and ``gain``, the mean over paired seeds of acc-last-k − its base run's
    (NaN for a base method or no pair), with ``gain-seeds`` (the pairs) and the interval of
    those paired differences (``gain-ci95-low``/``-high``)."""
    labelled = label_runs(_completed(results))
    accuracy = seed_stats(labelled, ["method", "setting"], "acc-last-k")
    # Unpaired seeds (e.g. a base run still pending) leave the gain to the paired ones.
    gains = paired_gains(results).dropna(subset=["gain"])
    accuracy_intervals = {key: seed_interval(group["acc-last-k"])
                          for key, group in labelled.groupby(["method", "setting"], sort=False)}
    gain_intervals = {key: seed_interval(group["gain"]) for key, group in gains.groupby(["method", "setting"], sort=False)}
    keys = list(zip(accuracy["method"], accuracy["setting"]))
    no_pairs = SeedInterval(float("nan"), float("nan"), float("nan"), 0)
    return pd.DataFrame({
        "method": accuracy["method"], "setting": accuracy["setting"], "acc-last-k": accuracy["mean"],
        "acc-last-k-std": accuracy["std"], "seeds": accuracy["n"],
        "acc-last-k-ci95-low": [accuracy_intervals[k].low for k in keys],
        "acc-last-k-ci95-high": [accuracy_intervals[k].high for k in keys],
        "gain": [gain_intervals.get(k, no_pairs).mean for k in keys],
        "gain-seeds": [gain_intervals.get(k, no_pairs).seeds for k in keys],
        "gain-ci95-low": [gain_intervals.get(k, no_pairs).low for k in keys],
        "gain-ci95-high": [gain_intervals.get(k, no_pairs).high for k in keys],
    })


INTERVALS_UNITS = ("Last-k test accuracy in percent over seeds: the mean, its 95 % Student-t interval "
                   "[low, high] and the seeds (n); the gain of averaging over its base method in percentage "
                   "points, paired over the seeds both ran (each seed's averaged run minus the same seed's base "
                   "run), with its interval. One seed: no interval.")


def intervals_table(results: pd.DataFrame) -> pd.DataFrame:
    """One row per method and setting: accuracy and paired gain with their 95 % intervals, in
    percent (``INTERVALS_UNITS``; the fractions: :func:`accuracy_data`)."""
    data = accuracy_data(results)

    def text(mean: float, low: float, high: float, seeds: int) -> str:
        if seeds == 0:
            return ""
        return SeedInterval(100 * mean, 100 * low, 100 * high, int(seeds)).text()

    table = pd.DataFrame({
        "setting": data["setting"].tolist(),
        "accuracy (95 % CI)": [text(r["acc-last-k"], r["acc-last-k-ci95-low"], r["acc-last-k-ci95-high"], r["seeds"])
                               for _, r in data.iterrows()],
        "paired gain (95 % CI)": [text(r["gain"], r["gain-ci95-low"], r["gain-ci95-high"], r["gain-seeds"])
                                  for _, r in data.iterrows()],
    }, index=pd.Index(data["method"], name="method"))
    return table


ACCURACY_TABLE_UNITS = ("Last-k test accuracy in percent: mean ± std over seeds (ddof 0; one seed: no ±), and in "
                        "brackets the gain of averaging over its base method in percentage points.")


def accuracy_table(results: pd.DataFrame) -> pd.DataFrame:
    """Methods (each strategy's base row, then its averaged rows) × settings, cells like
    ``85.30 ± 0.41 (+1.18)``: accuracy in percent, ± std over seeds if several, gain in
    points (``ACCURACY_TABLE_UNITS``); the numbers in fractions: :func:`accuracy_data`."""
    labelled = label_runs(_completed(results))
    accuracy = accuracy_data(results)

    def cell(row: pd.Series) -> str:
        text = f"{100 * row['acc-last-k']:.2f}" + (f" ± {100 * row['acc-last-k-std']:.2f}" if row["seeds"] > 1 else "")
        return text + (f" ({100 * row['gain']:+.2f})" if pd.notna(row["gain"]) else "")

    accuracy["cell"] = accuracy.apply(cell, axis=1)
    strategy_rank = {s: i for i, s in enumerate(labelled["strategy"].unique())}
    methods = labelled.drop_duplicates("method").reset_index(drop=True)
    order = sorted(methods.index,
                   key=lambda i: (strategy_rank[methods.at[i, "strategy"]], methods.at[i, "averaging"] != "none", i))
    table = accuracy.pivot(index="method", columns="setting", values="cell").fillna("")
    table = table.reindex(index=methods.loc[order, "method"], columns=labelled["setting"].unique())
    table.index.name, table.columns.name = "method", None
    return table


def markdown(table: pd.DataFrame) -> str:
    """A Markdown table of a DataFrame with its index as first column."""
    header = [table.index.name or "", *map(str, table.columns)]
    rows = [[str(index), *map(str, values)] for index, values in zip(table.index, table.to_numpy())]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, ["---"] * len(header), *rows]) + "\n"


def _line_names(frame: pd.DataFrame) -> pd.Series:
    return frame["method"] + frame["setting"].map(lambda s: "" if s == "all" else f", {s}")


def plot_gain_vs(results: pd.DataFrame, key: str, path: Path) -> Path | None:
    """Gain (points) vs a numeric key, one line per method and remaining setting; None if the
    key takes fewer than two values among the paired runs (alpha: among Dirichlet runs)."""
    completed = _completed(results)
    if key == "alpha":
        completed = completed[completed["partition"].isin(["dirichlet", "dirichlet-client"])]
    # Labels are judged among the plotted runs, without the key itself (it is the x-axis).
    gains = label_runs(completed, exclude=[key]).merge(paired_gains(results)[["run", "gain"]].dropna(), on="run")
    if key not in gains or gains[key].nunique() < 2:
        return None
    gains = gains.assign(line=_line_names, points=lambda f: 100 * f["gain"])
    stats = seed_stats(gains, ["line", key], "points").sort_values(key, kind="stable")

    def draw(ax) -> None:
        if key == "alpha":
            ax.set_xscale("log")
        _errorbar_lines(ax, stats, key, {line: f"C{i}" for i, line in enumerate(stats["line"].unique())})
        ax.axhline(0, color="black", linewidth=0.8)

    xlabel = "Dirichlet α (log scale)" if key == "alpha" else key
    return save_figure(path, f"gain of averaging vs {key}", xlabel, "gain in last-k accuracy (percentage points)", draw)


def _errorbar_lines(ax, stats: pd.DataFrame, key: str, colours: dict[str, str]) -> None:
    """One mean ± std line per ``line`` of ``stats`` against ``key``, ticks at the data's values;
    lines sharing a colour get different markers."""
    used: dict[str, int] = {}
    for line, points in stats.groupby("line", sort=False):
        colour = colours[line]
        marker = MARKERS[used.get(colour, 0) % len(MARKERS)]
        used[colour] = used.get(colour, 0) + 1
        ax.errorbar(points[key], points["mean"], yerr=points["std"], color=colour, marker=marker, capsize=3, label=line)
    values = sorted(stats[key].unique())
    ax.set_xticks(values, [value_text(v) for v in values])
    ax.minorticks_off()


def _plot_ablation(results: pd.DataFrame, key: str, value: str, scale: float, path: Path, title: str,
                   xlabel: str, ylabel: str) -> Path | None:
    """``value`` of averaged runs vs ``key`` (mean ± std over seeds), one line per method and
    setting in the colour of its strategy and setting, whose base runs are a dashed line; where a
    point's mean is NaN (the target was not reached), an × at the top. None if ``key`` does not vary."""
    labelled = label_runs(_completed(results), exclude=[key]).assign(y=lambda f: scale * f[value])
    averaged = labelled[labelled["averaging"] != "none"].assign(line=_line_names)
    if averaged[key].nunique() < 2:
        return None
    stats = seed_stats(averaged, ["line", "strategy", "setting", key], "y").sort_values(key, kind="stable")
    base_runs = labelled[labelled["averaging"] == "none"]
    base = seed_stats(base_runs, ["strategy", "setting"], "y").set_index(["strategy", "setting"])
    groups = list(dict.fromkeys(zip(stats["strategy"], stats["setting"])))
    colour_of_group = {group: f"C{i}" for i, group in enumerate(groups)}
    colours = {line: colour_of_group[(strategy, setting)]
               for line, strategy, setting in zip(stats["line"], stats["strategy"], stats["setting"])}
    not_reached = stats[stats["mean"].isna()]

    def draw(ax) -> None:
        _errorbar_lines(ax, stats, key, colours)
        for group in groups:
            if group not in base.index:
                continue
            name = f"{group[0]} (base{'' if group[1] == 'all' else ', ' + group[1]})"
            level = base.at[group, "mean"]
            if pd.notna(level):
                ax.axhline(level, linestyle="--", color=colour_of_group[group], alpha=0.8, label=name)
            else:
                ax.plot([], [], linestyle="--", color=colour_of_group[group], label=f"{name}: not reached")
        top = ax.get_ylim()[1]
        for i, (line, points) in enumerate(not_reached.groupby("line", sort=False)):
            ax.plot(points[key], [top] * len(points), "x", color=colours[line], clip_on=False,
                    label="not reached" if i == 0 else None)

    return save_figure(path, title + (" (× = not reached)" if len(not_reached) else ""), xlabel, ylabel, draw)


def plot_rounds_to_target_vs_start(results: pd.DataFrame, path: Path) -> Path | None:
    """Mean rounds to reach the target accuracy vs avg-start; None if avg-start does not vary."""
    targets = _completed(results)["target-accuracy"].unique()
    target = f" {100 * targets[0]:g}%" if len(targets) == 1 else ""
    return _plot_ablation(results, "avg-start", "rounds-to-target", 1.0, path,
                          f"rounds to reach the target{target} vs averaging start",
                          "averaging start (fraction of rounds, or round)", "rounds to target (mean over seeds)")


def plot_window_ablation(results: pd.DataFrame, path: Path) -> Path | None:
    """Last-k accuracy (%) vs window (IMA's P, WIMA's W); None if the window does not vary."""
    return _plot_ablation(results, "window", "acc-last-k", 100.0, path, "window ablation",
                          "window (rounds averaged)", "last-k test accuracy (%)")


def slug(text: str) -> str:
    """A file-name part: ``Dir(0.1), participation=0.1`` → ``dir-0.1-participation-0.1``."""
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "all"


def plot_curves(results: pd.DataFrame, curves: pd.DataFrame, out: Path) -> list[Path]:
    """``curves-<setting>.png``: mean test accuracy per round over seeds, one colour per strategy,
    base method solid, its averaged variants dashed (one dash style each)."""
    if "test-accuracy" not in curves or curves.empty:
        return []
    labelled = label_runs(_completed(results))
    rows = curves.merge(labelled[["run", "strategy", "averaging", "method", "setting"]], on="run")
    paths = []
    for setting, frame in rows.groupby("setting", sort=False):
        mean = frame.groupby(["strategy", "averaging", "method", "round"], sort=False)["test-accuracy"].mean().reset_index()

        def draw(ax, mean=mean) -> None:
            for colour, (strategy, runs) in enumerate(mean.groupby("strategy", sort=False)):
                averaged = [m for m in runs["method"].unique() if m != strategy]
                for method, points in runs.groupby("method", sort=False):
                    style = "-" if method == strategy else DASHES[averaged.index(method) % len(DASHES)]
                    ax.plot(points["round"], 100 * points["test-accuracy"], linestyle=style, color=f"C{colour}",
                            label=method)

        title = f"test accuracy per round: {setting} (mean over seeds)"
        paths.append(save_figure(out / f"curves-{slug(setting)}.png", title, "round", "test accuracy (%)", draw))
    return paths


def write_report(directory: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the tables and every figure that applies to ``out`` (default ``directory/report``)."""
    results, curves = load_results(directory)
    if not (results["status"] == "completed").any():
        raise ValueError(f"no completed run among the {len(results)} runs of {directory}")
    from experiments.runtime.output_dir import create_output_dir

    out = create_output_dir(Path(out) if out is not None else Path(directory) / "report")
    accuracy_data(results).to_csv(out / "accuracy-table.csv", index=False)
    (out / "accuracy-table.md").write_text(f"{ACCURACY_TABLE_UNITS}\n\n{markdown(accuracy_table(results))}")
    (out / "intervals.md").write_text(f"{INTERVALS_UNITS}\n\n{markdown(intervals_table(results))}")
    paired_gains(results).to_csv(out / "gains.csv", index=False)
    figures = [plot_gain_vs(results, key, out / f"gain-vs-{key}.png") for key in GAIN_KEYS]
    figures += [plot_rounds_to_target_vs_start(results, out / "rounds-to-target-vs-start.png"),
                plot_window_ablation(results, out / "window-ablation.png")]
    paths = [out / "accuracy-table.csv", out / "accuracy-table.md", out / "intervals.md", out / "gains.csv"]
    return (paths + [f for f in figures if f is not None] + plot_heatmaps(crossed_axes(results), out)
            + plot_curves(results, curves, out))


def crossed_axes(results: pd.DataFrame) -> pd.DataFrame | None:
    """experiments/sweep_heatmaps.heatmap_data of the sweep's completed runs: None without two crossed axes."""
    completed = _completed(results)
    setting_keys = [k for k in varied_keys(completed) if k not in {"strategy", "seed", *AVERAGING_KEYS}]
    return heatmap_data(label_runs(completed, exclude=setting_keys), paired_gains(results), setting_keys)


def main(argv: list[str] | None = None) -> int:
    """Write the report of a sweep, print its table and files; 2 on a missing input or no completed run."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="a sweep directory holding results.parquet")
    parser.add_argument("--out", type=nonempty_path, help="output directory (default SWEEP_DIR/report)")
    args = parser.parse_args(argv)
    def report() -> int:
        paths = write_report(args.sweep_dir, args.out)
        print(paths[1].read_text())
        print("written:\n" + "\n".join(f"  {p}" for p in paths))
        return 0

    return guarded(report)


if __name__ == "__main__":
    exit_command(main())
