"""A job's folders: each run's folder name within the job (its compared values), the job's
output folder and its name; a comparison whose runs would share a folder or a name is
refused."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.runtime.cli import UsageError
from experiments.runtime.output_dir import create_output_dir, unique_output_dir


def check_distinct_labels(points: Sequence[Mapping[str, Any]], runs: Mapping[str, Mapping[str, Any]],
                          compare: Mapping[str, Sequence[Any]] | None) -> None:
    """Refuse a comparison two of whose runs would share a folder or a name in the table
    and the figure (UsageError naming them): one run's results would overwrite the other's."""
    from experiments.runtime.finished_runs import method_label

    folders = Counter(label_of(point) for point in points)
    extra = [key for key in compare or {} if key not in ("strategy", "averaging")]
    names = Counter(method_label(config, extra) for config in runs.values())
    clash = next((f"folder {label!r}" for label, count in folders.items() if count > 1), None) or next(
        (f"name {name!r}" for name, count in names.items() if count > 1 and len(runs) == len(points)), None)
    if clash:
        raise UsageError(f"compare = {dict(compare or {})!r} gives two runs the same {clash}; allowed: values "
                         f"that differ once written out (each value once)")


def label_of(point: Mapping[str, Any]) -> str:
    """A run's folder name within its job: the compared values ("none", "fedprox-ima")."""
    return "-".join(f"{value}" for value in point.values()) or "run"


def output_name(preset: str | None, main_job: bool, config: Mapping[str, Any], compared: Sequence[str] = ()) -> str:
    """The output folder's name: the preset, "main" for the main job, the compared keys
    ("compare-strategy"; ``compared`` holds keys or ``KEY=V1,V2`` specs) for a comparison
    without a preset, else what ran."""
    if preset:  # a name ("ima-fmnist-dir0.1", whose ".1" is not a suffix) or a TOML path
        return Path(preset).stem if preset.endswith(".toml") else Path(preset).name
    if main_job:
        return "main"
    if compared:  # not the first run's method: the comparison's
        return "compare-" + "-".join(dict.fromkeys(spec.partition("=")[0] for spec in compared))
    from experiments.runtime.finished_runs import method_label

    return re.sub(r"[^A-Za-z0-9.+=-]+", "-", method_label(config).lower()).strip("-")


def job_output_dir(out: Path | None, configs: list[Mapping[str, Any]], name: str) -> Path:
    """The job's output folder, created: ``out``, else the configs' ``output-dir``, else a
    new ``runs/<name>-<time>``; ``out`` and an ``output-dir`` naming another folder are refused."""
    requested = sorted({config["output-dir"] for config in configs} - {""})
    if len(requested) > 1:
        raise UsageError(f"run config key 'output-dir' takes {len(requested)} values {requested}; allowed: one folder")
    if requested and out is not None and Path(requested[0]).expanduser().resolve() != out.expanduser().resolve():
        raise UsageError(
            f"run config key 'output-dir' = {requested[0]!r} and --out {out} name different folders; "
            f"allowed: one of them (or both naming the same folder)"
        )
    if out is None and requested:
        return create_output_dir(Path(requested[0]), "run config key 'output-dir' =")
    return create_output_dir(out) if out is not None else unique_output_dir(Path("runs"), name)
