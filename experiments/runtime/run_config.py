"""The run config a launch starts from: pyproject.toml's defaults, presets (TOML files),
``key=value`` overrides, layered and validated before Flower or Ray start."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from experiments.runtime.machine import check_data, local_label_directory
from partitions.feasibility import check_partition
from strategies.config import ConfigError, validate_run_config
from strategies.methods.registry import plugin_defaults

APP_DIR = Path(__file__).resolve().parents[2]
PRESETS_DIR = APP_DIR / "experiments" / "presets"


def default_run_config() -> dict[str, Any]:
    """The run-config defaults declared in pyproject.toml, and those of the installed plug-ins' keys."""
    return {**_pyproject_defaults((APP_DIR / "pyproject.toml").stat().st_mtime_ns), **plugin_defaults()}


@cache  # a table's listing resolves hundreds of configs: parsing pyproject.toml for each took 2.3 s of 8
def _pyproject_defaults(modified_ns: int) -> Mapping[str, Any]:
    """``[tool.flwr.app.config]`` of pyproject.toml as last modified at ``modified_ns``."""
    with open(APP_DIR / "pyproject.toml", "rb") as f:
        return MappingProxyType(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


def named_toml(name_or_path: str, directory: Path, kind: str) -> Path:
    """A TOML file given by path, or by name (stem) in ``directory``; a clear error if absent."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        names = sorted(p.stem for p in directory.glob("*.toml"))
        guess = difflib.get_close_matches(str(name_or_path), names, n=1)
        hint = f" (did you mean {guess[0]!r}?)" if guess else ""
        raise FileNotFoundError(f"{kind} {name_or_path!r} not found{hint}; known {kind}s: {', '.join(names)}")
    return path


def read_toml(path: Path, kind: str) -> dict[str, Any]:
    """A TOML file's content; a syntax error names the file (ConfigError)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{kind} file {path} is not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{kind} file {path} is not UTF-8 text (byte {error.start}); allowed: a TOML text file") from None
    except OSError as error:
        raise ConfigError(f"{kind} file {path} cannot be read ({error.strerror or error})") from None


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset's overrides: a name from experiments/presets/ or a TOML file path."""
    return read_toml(named_toml(name_or_path, PRESETS_DIR, "preset"), "preset")


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings with TOML value syntax (strings may be left unquoted)."""
    overrides = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"override {pair!r} is not of the form key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        overrides[key.strip()] = value
    return overrides


def tracked_in(config: Mapping[str, Any], directory: Path, group: str) -> dict[str, Any]:
    """``config`` with its trackers writing into ``directory`` under ``group`` (a comparison's
    or a sweep's folder and name, so its runs are grouped), unless it names its own."""
    if not config["track"]:
        return dict(config)
    return {**config, "track-dir": config["track-dir"] or str(directory), "track-group": config["track-group"] or group}


def resolve_config(*layers: Mapping[str, Any], build_partition: bool = True) -> dict[str, Any]:
    """Defaults, then each layer of overrides, validated, and its partition built once on
    the data set's labels (raises ConfigError: before Flower starts, not in every client);
    ``build_partition`` False leaves the partition out, for what only reads the settings."""
    config = default_run_config()
    for layer in layers:
        config.update(layer)
    config = validate_run_config(config)
    if config["speed-trace"]:  # read by the ServerApp, whose working directory is not the caller's
        config["speed-trace"] = str(Path(config["speed-trace"]).expanduser().resolve())
    if local_label_directory(config) is not None:  # the partition below reads its labels: a damaged file is named first
        check_data([config])
    if not build_partition:
        return config
    try:
        check_partition(config)
    except ValueError as error:
        keys = "'partition', 'alpha', 'classes-per-client', 'num-clients', 'min-partition-size'"
        raise ConfigError(f"run config keys {keys}: {error}") from None
    return config
