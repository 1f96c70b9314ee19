"""Tables and figures of finished runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def summary_table(summaries: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run label: last-k, best and final accuracy, round reaching target, rounds
    (run and skipped), failed client replies over the run, the run's wall time (Flower's
    start-up included) and the start-up before round 1."""
    import pandas as pd  # here: a launcher imports this module before Flower starts

    from strategies.results import current_summary

    rows = []
    for label, summary in summaries.items():
        s = current_summary(summary)
        k = s.get("last-k", 10)
        # The names of summary.json (docs/outputs.md); accuracies are fractions in [0, 1].
        rows.append({
            "run": label,
            "acc-last-k": s.get("acc-last-k"),
            # A run shorter than the requested k averages all its rounds: "5 of 10".
            "last-k": f"{k} of {s['last-k-requested']}" if "last-k-requested" in s else k,
            "acc-best": s.get("acc-best"),
            "best-round": s.get("best-round"),
            "acc-final": s.get("acc-final"),
            "rounds-to-target": s.get("rounds-to-target"),
            # with the simulated clock (system-speeds): simulated seconds to the target, and in all
            "time-to-target": s.get("time-to-target"),
            "simulated-time": s.get("simulated-time"),
            "target-accuracy": s.get("target-accuracy"),
            "rounds": s.get("rounds"),
            "rounds-skipped": s.get("rounds-skipped"),
            "client-failures": s.get("client-failures"),
            "run-seconds": s.get("run-seconds", s.get("wall-seconds")),
            "startup-seconds": s.get("startup-seconds"),
        })
    return pd.DataFrame(rows).set_index("run")




def method_label(config: Mapping[str, Any], extra_keys: Iterable[str] = ()) -> str:
    """What ran, as the papers write it: "FedAvg+IMA", then ``extra_keys`` as key=value."""
    from strategies.methods.registry import AVERAGINGS_BY_NAME, METHODS_BY_NAME  # every method's declaration: only when asked for

    name = METHODS_BY_NAME[config["strategy"]].display_name if config["strategy"] in METHODS_BY_NAME else config["strategy"]
    if config["averaging"] != "none":
        rule = AVERAGINGS_BY_NAME.get(config["averaging"])
        name += "+" + (rule.display_name if rule else config["averaging"])
    extras = [f"{k}={_config_value(config[k])}" for k in extra_keys]
    return ", ".join([name, *extras])


def _config_value(value: Any) -> str:
    """A run-config value as the user writes it (0.1, true, 'iid' → iid)."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def setup_title(config: Mapping[str, Any]) -> str:
    """Data set, partition, clients and participation of a run config."""
    from partitions.stats import partition_notation

    return (f"{config['dataset']}, {partition_notation(config)}, {config['num-clients']} clients, "
            f"{config['participation']:.0%} per round")


def averaging_start(config: Mapping[str, Any]) -> int | None:
    """The first round whose reported model is an average (None without averaging)."""
    from strategies.methods.registry import AVERAGINGS_BY_NAME

    if config["averaging"] == "none":
        return None
    return AVERAGINGS_BY_NAME[config["averaging"]].first_average(config)


def accuracy_figure(curves: Mapping[str, pd.DataFrame], title: str = "", starts: Mapping[str, int | None] | None = None):
    """Central test accuracy (%) per round, one colour per run: the reported model solid and,
    where a run also has an averaged model, its base model dashed and thinner on top (visible
    where the two coincide); a dotted vertical line where a run's averaging starts; integer
    round ticks. Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    starts = starts or {}
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    for index, (label, frame) in enumerate(curves.items()):
        # Each later run is drawn thinner, so runs that coincide (e.g. before averaging starts)
        # stay visible as a line inside a line.
        width = max(1.2, 3.0 - 0.6 * index)
        (line,) = ax.plot(frame["round"], 100 * frame["test-accuracy"], linewidth=width, label=label)
        if "averaged-accuracy" in frame and frame["averaged-accuracy"].notna().any():
            ax.plot(frame["round"], 100 * frame["base-accuracy"], linestyle=(0, (2, 2)), linewidth=1.0, zorder=3,
                    color=line.get_color(), alpha=0.9, label=f"{label}: base model")
        if starts.get(label):
            ax.axvline(starts[label], color=line.get_color(), linestyle=":", linewidth=1.2,
                       label=f"{label}: averaging from round {starts[label]}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title or "central test accuracy per round")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")  # as in the sweep reports
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncols=min(3, max(1, len(ax.lines))), fontsize="small")
    return fig


def plot_accuracy(curves: Mapping[str, pd.DataFrame], path: Path, title: str = "",
                  starts: Mapping[str, int | None] | None = None) -> Path:
    """Save :func:`accuracy_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = accuracy_figure(curves, title, starts)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def save_figure(path: Path, title: str, xlabel: str, ylabel: str, draw: Callable) -> Path:
    """Shared figure frame: ``draw(ax)`` adds the data; titles, grid, legend, saving here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    draw(ax)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
