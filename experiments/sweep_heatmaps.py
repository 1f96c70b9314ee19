"""Heat maps of a sweep that crosses data heterogeneity with another axis (a participation
model, a straggler policy, a speed spread): accuracy and averaging's paired gain per method,
row value and column setting, written by experiments/sweep_report.py's report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# The heat maps' row axis: the first of these the sweep varies (data heterogeneity first).
HEATMAP_ROW_KEYS = ("alpha", "classes-per-client", "participation", "clients-per-round", "local-epochs", "num-clients")
HEATMAP_UNITS = ("Last-k test accuracy (percent) and the paired gain of averaging over its base method (percentage "
                 "points), means over seeds, per method, row value and column setting.")


def heatmap_data(labelled: pd.DataFrame, gains: pd.DataFrame, setting_keys: list[str]) -> pd.DataFrame | None:
    """The 2-D view of a sweep crossing a heterogeneity key (the rows: :data:`HEATMAP_ROW_KEYS`)
    with other settings (the columns: the remaining ``setting_keys``, e.g. a participation model):
    one row per method, row value and column, with ``acc-last-k`` and ``gain`` (means over
    seeds, fractions) and the seeds of each; None where the sweep varies one axis or none.
    ``labelled``: the completed runs with their ``method`` (experiments/sweep_report.label_runs);
    ``gains``: each averaged run's paired ``gain``."""
    row_key = next((k for k in HEATMAP_ROW_KEYS if k in setting_keys), None)
    column_keys = [k for k in setting_keys if k not in (row_key, "partition")]
    if row_key is None or not column_keys:
        return None
    labelled = labelled.assign(row=labelled[row_key], column=column_labels(labelled, column_keys))
    labelled = labelled.merge(gains[["run", "gain"]], on="run", how="left")
    table = (labelled.groupby(["method", "row", "column"], sort=False)
             .agg(**{"acc-last-k": ("acc-last-k", "mean"), "seeds": ("acc-last-k", "size"),
                     "gain": ("gain", "mean"), "gain-seeds": ("gain", "count")}).reset_index())
    table.insert(1, "row-key", row_key)
    return table


def value_text(v: object) -> str:
    """A config value as a label shows it (floats without trailing zeros)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def column_labels(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    """Each run's column as its sweep file would say it: a key that rides along with the first
    (a table axis: ``{participation-model = "cyclic", cyclic-groups = 4}``) is named only where it
    differs from its most common value."""
    primary, riding = keys[0], []
    for key in keys[1:]:
        if frame.groupby(primary, sort=False)[key].nunique(dropna=False).max() == 1:
            riding.append(key)
    usual = {key: frame[key].mode(dropna=False).iloc[0] for key in riding}
    labels = []
    for _, row in frame.iterrows():
        parts = [f"{k}={value_text(row[k])}" for k in keys if k not in riding or row[k] != usual[k]]
        labels.append(", ".join(parts))
    return labels


def plot_heatmaps(table: pd.DataFrame | None, out: Path) -> list[Path]:
    """``heatmap-accuracy.png`` (one panel per method) and ``heatmap-gain.png`` (one per averaged
    method, a diverging scale centred on 0) of :func:`heatmap_data`'s ``table``, with
    ``heatmap.csv``; nothing for a sweep without two crossed axes (``table`` None)."""
    if table is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    row_key = table["row-key"].iloc[0]
    rows, columns = sorted(table["row"].unique()), list(dict.fromkeys(table["column"]))
    table.to_csv(out / "heatmap.csv", index=False)
    paths = [out / "heatmap.csv"]
    for value, name, unit, methods in (
        ("acc-last-k", "accuracy", "last-k test accuracy (%)", list(dict.fromkeys(table["method"]))),
        ("gain", "gain", "gain over the base method (points)",
         list(dict.fromkeys(table.loc[table["gain"].notna(), "method"]))),
    ):
        if not methods:
            continue
        grids = []
        for method in methods:
            cells = table[table["method"] == method].set_index(["row", "column"])[value]
            grids.append(np.array([[100 * cells.get((r, c), np.nan) for c in columns] for r in rows]))
        if value == "gain":
            bound = max(np.nanmax(np.abs(np.stack(grids))), 1e-9)
            scale = {"cmap": "RdBu", "vmin": -bound, "vmax": bound}
        else:
            scale = {"cmap": "viridis", "vmin": np.nanmin(np.stack(grids)), "vmax": np.nanmax(np.stack(grids))}
        primary = columns[0].split("=")[0]  # every column starts with the first column key
        ticks = [c.replace(f"{primary}=", "", 1).replace(", ", "\n") for c in columns]
        fig, axes = plt.subplots(1, len(methods), figsize=(1.8 + 2.2 * len(columns) * len(methods), 1.8 + 0.8 * len(rows)),
                                 squeeze=False)
        middle = (scale["vmin"] + scale["vmax"]) / 2
        for ax, method, grid in zip(axes[0], methods, grids):
            image = ax.imshow(grid, aspect="auto", **scale)
            for (i, j), cell in np.ndenumerate(grid):
                if np.isfinite(cell):  # dark text on the light half of the scale
                    light = abs(cell) < 0.6 * scale["vmax"] if value == "gain" else cell > middle
                    ax.text(j, i, f"{cell:+.1f}" if value == "gain" else f"{cell:.1f}", ha="center", va="center",
                            fontsize="small", color="black" if light else "white")
            ax.set_xticks(range(len(columns)), ticks, fontsize="x-small")
            ax.set_yticks(range(len(rows)), [value_text(r) for r in rows])
            ax.set_xlabel(primary)
            ax.set_ylabel(row_key)
            ax.set_title(f"{name} of {method}", fontsize="medium")
        fig.colorbar(image, ax=list(axes[0]), label=unit)
        path = out / f"heatmap-{name}.png"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
