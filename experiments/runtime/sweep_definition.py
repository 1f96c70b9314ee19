"""A sweep file (experiments/sweep_files/ or the user's TOML): its fields checked, and its grid
resolved into one validated run config per point (a point that repeats an earlier one's
config is counted, not run twice)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.runtime.machine import (
    ClientResources,
)
from experiments.runtime.run_config import load_preset, named_toml, read_toml, resolve_config
from strategies.config import ConfigError

SWEEP_FILES_DIR = Path(__file__).resolve().parents[1] / "sweep_files"


SWEEP_KEYS = {"name", "description", "preset", "set", "resources", "grid"}


RESOURCE_KEYS = {"num-cpus", "num-gpus"}


class SweepError(ValueError):
    """A sweep file that cannot be run as written."""


@dataclass(frozen=True)
class SweepRun:
    run_id: str
    config: dict[str, Any]


@dataclass(frozen=True)
class Sweep:
    name: str
    runs: list[SweepRun]
    resources: ClientResources
    duplicates: int  # grid points that resolved to an earlier point's config
    gpus_auto: bool = False  # [resources] num-gpus not given: chosen on the machine (launch.client_resources)


def sweep_path(name_or_path: str) -> Path:
    """A sweep name from experiments/sweep_files/ or a TOML file path."""
    return named_toml(name_or_path, SWEEP_FILES_DIR, "sweep")


def load_sweep(path: Path, overrides: Mapping[str, Any] | None = None) -> Sweep:
    """Read and validate a sweep file: every run's config is resolved (raises SweepError/ConfigError)."""
    spec = read_toml(path, "sweep")
    unknown = sorted(set(spec) - SWEEP_KEYS)
    if unknown:
        raise SweepError(f"sweep file {path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(SWEEP_KEYS))}")
    check_sweep_schema(path, spec)
    resources = spec.get("resources", {})
    bad = sorted(set(resources) - RESOURCE_KEYS)
    if bad:
        raise SweepError(f"sweep file {path}: unknown [resources] key(s) {', '.join(bad)}; allowed: num-cpus, num-gpus")
    try:
        client_resources = ClientResources(resources.get("num-cpus", 1), resources.get("num-gpus", 0.0))
    except (TypeError, ValueError) as error:
        raise SweepError(f"sweep file {path}: [resources] {error}") from None
    grid = spec.get("grid", {})
    if not isinstance(grid, dict) or not grid:
        raise SweepError(f"sweep file {path}: [grid] is missing or empty; allowed: axes such as alpha = [0.1, 0.5]")
    axes = [_axis(path, name, values) for name, values in grid.items()]

    base = load_preset(spec["preset"]) if "preset" in spec else {}
    runs, seen, duplicates = [], {}, 0
    for point in itertools.product(*axes):
        run_id = "_".join(label for label, _ in point)
        layer = {key: value for _, values in point for key, value in values.items()}
        try:
            config = resolve_config(base, spec.get("set", {}), layer, overrides or {})
        except ConfigError as error:
            raise ConfigError(f"sweep file {path}, run {run_id}: {error}") from None
        if config["output-dir"]:
            raise SweepError(f"sweep file {path}, run {run_id}: output-dir = {config['output-dir']!r} is set by the "
                             f"sweep for each run (<out>/runs/<run id>); allowed: '' (choose the sweep's folder with --out)")
        fingerprint = json.dumps(config, sort_keys=True)
        if fingerprint in seen:
            duplicates += 1
            continue
        seen[fingerprint] = run_id
        runs.append(SweepRun(run_id, config))
    name = spec.get("name", path.stem)
    return Sweep(name, runs, client_resources, duplicates, "num-gpus" not in resources)


# A sweep's name becomes a folder under runs/: letters, digits, '.', '_', '-', not starting with '.'.
SWEEP_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,99}")


# Each top-level field of a sweep file: the type it must have, and what to say it allows.
SWEEP_FIELDS = {
    "name": (str, "a name of letters, digits, '.', '_' and '-' (it becomes the folder runs/<name>)"),
    "description": (str, "a string"),
    "preset": (str, "a preset name from experiments/presets/ or a TOML file path"),
    "set": (dict, "a table of run-config keys, e.g. [set] lr = 0.1"),
    "resources": (dict, "a table with num-cpus (a whole number >= 1) and num-gpus (a number in [0, 1])"),
    "grid": (dict, "a table of axes, each a non-empty list, e.g. [grid] alpha = [0.1, 0.5]"),
}


def check_sweep_schema(path: Path, spec: dict[str, Any]) -> None:
    """SweepError naming the file, the field and what is allowed, for any field of the
    wrong type or shape (before any run config is resolved)."""
    for field, (kind, allowed) in SWEEP_FIELDS.items():
        if field in spec and not isinstance(spec[field], kind):
            raise SweepError(f"sweep file {path}: {field} = {spec[field]!r} is not allowed; allowed: {allowed}")
    if "name" in spec and not SWEEP_NAME.fullmatch(spec["name"]):
        raise SweepError(f"sweep file {path}: name = {spec['name']!r} is not allowed; allowed: {SWEEP_FIELDS['name'][1]}")
    for key, value in spec.get("resources", {}).items():
        if key in RESOURCE_KEYS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise SweepError(f"sweep file {path}: [resources] {key} = {value!r} is not allowed; allowed: a number")
    for key, value in spec.get("set", {}).items():
        if isinstance(value, (dict, list)):
            raise SweepError(f"sweep file {path}: [set] {key} = {value!r} is not allowed; allowed: a single value "
                             f"(vary a key in [grid])")
    for name, values in spec.get("grid", {}).items():
        for value in values if isinstance(values, list) else []:
            if isinstance(value, list) or (isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values())):
                raise SweepError(f"sweep file {path}: [grid] {name} holds {value!r}; allowed: values, or tables of "
                                 f"run-config keys with single values")


def _axis(path: Path, name: str, values: Any) -> list[tuple[str, dict[str, Any]]]:
    """An axis as (label, overrides) pairs; labels become parts of run ids."""
    if not isinstance(values, list) or not values:
        raise SweepError(f"sweep file {path}: [grid] {name} = {values!r} is not allowed; allowed: a non-empty list")
    points = []
    for value in values:
        overrides = value if isinstance(value, dict) else {name: value}
        if isinstance(value, dict) and not value:
            raise SweepError(f"sweep file {path}: [grid] {name} has an empty table; allowed: tables of run-config keys")
        label = "+".join(f"{key}={_slug(v)}" for key, v in overrides.items())
        points.append((label, overrides))
    labels = [label for label, _ in points]
    if len(set(labels)) != len(labels):
        raise SweepError(f"sweep file {path}: [grid] {name} repeats a value: {values!r}")
    return points


def _slug(value: Any) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.\-]+", "-", text)
