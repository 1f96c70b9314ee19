"""Every shipped preset and sweep against the papers' setups table (docs/paper-setups.md),
field by field: a preset that drifts from its paper fails here."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from experiments.runtime.run_config import PRESETS_DIR, load_preset, resolve_config
from experiments.runtime.sweep_definition import SWEEP_FILES_DIR, load_sweep

TABLE = Path(__file__).resolve().parent.parent / "docs" / "paper-setups.md"
ROW = re.compile(r"^\| `([^`]+)` \|(.*)$")
FRAGMENT = re.compile(r"`([a-z0-9][a-z0-9.-]* = [^`]+)`")


def _rows(section: str) -> dict[str, dict]:
    """{name: the row's key = value fragments, parsed as TOML} of one section's table."""
    text = TABLE.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        if match := ROW.match(line):
            rows[match.group(1)] = tomllib.loads("\n".join(FRAGMENT.findall(match.group(2))))
    return rows


PRESET_ROWS = _rows("Presets")
SWEEP_ROWS = {**_rows("Sweeps"), **_rows("Sweeps beyond the papers")}
PRESETS = sorted(path.stem for path in PRESETS_DIR.glob("*.toml"))
SWEEPS = sorted(path.stem for path in SWEEP_FILES_DIR.glob("*.toml"))


def test_every_shipped_preset_and_sweep_has_a_row():
    assert sorted(PRESET_ROWS) == PRESETS
    assert sorted(SWEEP_ROWS) == SWEEPS


@pytest.mark.parametrize("name", PRESETS)
def test_preset_matches_its_papers_setup(name):
    expected, preset = PRESET_ROWS[name], load_preset(name)
    assert not set(preset) - set(expected), f"{name} sets keys its row does not state: {set(preset) - set(expected)}"
    config = resolve_config(preset)
    drift = {key: (config[key], value) for key, value in expected.items() if config[key] != value}
    assert not drift, f"{name} differs from its paper's setup (preset, table): {drift}"


def _grid_keys(grid: dict) -> set[str]:
    keys = set()
    for name, values in grid.items():
        keys |= {k for v in values if isinstance(v, dict) for k in v} if any(isinstance(v, dict) for v in values) else {name}
    return keys


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_matches_its_papers_setup(name):
    path = SWEEP_FILES_DIR / f"{name}.toml"
    spec, row = tomllib.loads(path.read_text()), dict(SWEEP_ROWS[name])
    assert spec.get("preset") == row.pop("preset", None)
    assert spec["grid"] == row.pop("grid")
    assert spec.get("set", {}) == row
    # Every run keeps the base preset's setup where neither [set] nor the grid changes it.
    base = PRESET_ROWS[spec["preset"]] if "preset" in spec else {}
    kept = {k: v for k, v in base.items() if k not in row and k not in _grid_keys(spec["grid"])}
    for run in load_sweep(path).runs:
        drift = {key: (run.config[key], value) for key, value in kept.items() if run.config[key] != value}
        assert not drift, f"{name}, run {run.run_id}: {drift}"


def test_the_fedswa_comparison_gives_every_method_the_cosine_and_fedswas_partition():
    runs = load_sweep(SWEEP_FILES_DIR / "fedswa-cifar100.toml").runs
    assert {run.config["strategy"] for run in runs} >= {"fedavg", "scaffold", "fedswa", "fedmoswa", "mofedsam", "fedlesam"}
    assert {(run.config["lr-schedule"], run.config["partition"], run.config["samples-per-client"],
             run.config["client-dirichlet-concentration"], run.config["client-dirichlet-exhaustion"],
             run.config["model"]) for run in runs} == {("cosine", "dirichlet-client", 500, "uniform", "refill", "resnet18-bn")}


def test_one_comparison_reports_one_metric():
    for name in ("wima-cifar10", "wima-cifar100"):
        runs = load_sweep(SWEEP_FILES_DIR / f"{name}.toml").runs
        assert {run.config["summary-last-k"] for run in runs} == {100}, name  # FedAvg/SWA runs too, not only WIMA's


def test_ima_sweeps_run_fedadam_and_fedyogi_with_the_ima_authors_server_settings():
    """utils/aggregator.py, fedadam+ima / fedyogi+ima: η = 1e-2, τ = 1e-3, β1 = 0.9, β2 = 0.99,
    and the window of FMA aggregates as the step's target."""
    from strategies.methods.strategy_builder import build_strategy

    checked = 0
    for name in ("ima-fmnist-methods", "ima-cifar10", "ima-cifar100", "ima-pacs"):
        for run in load_sweep(SWEEP_FILES_DIR / f"{name}.toml").runs:
            if run.config["strategy"] not in ("fedadam", "fedyogi"):
                continue
            strategy = build_strategy(run.config)
            base = getattr(strategy, "base", strategy)
            assert (base.eta, base.tau, base.beta_1, base.beta_2) == (0.01, 0.001, 0.9, 0.99), (name, run.run_id)
            if run.config["averaging"] == "ima":
                assert strategy.optimizer_target, (name, run.run_id)
            checked += 1
    assert checked >= 8
