"""pyproject.toml's block of method keys, generated from the declarations: Basin's own in the
repository's pyproject.toml (``.venv/bin/python -m experiments.method_list --write-pyproject``
rewrites it after a method is added), and with the installed plug-ins' in the pyproject.toml
of a run's staged app (experiments/runtime/launch.py), since Flower accepts overrides only of
keys that pyproject.toml declares."""

from __future__ import annotations

import re
from pathlib import Path

import tomli_w

from strategies.methods.registry import REGISTRY, declarations

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
BLOCK_START = ("# -- method keys: generated from the methods' declarations by "
               "`.venv/bin/python -m experiments.method_list --write-pyproject`")
BLOCK_END = "# -- end of method keys"


def pyproject_block(with_plugins: bool = False) -> str:
    """The method keys of ``[tool.flwr.app.config]``, from the declarations (Flower accepts
    overrides only of keys that pyproject.toml declares): Basin's own, or with the installed
    plug-ins' too (the pyproject.toml of a run's staged app)."""
    lines, seen = [BLOCK_START], set()
    for spec in declarations():
        if spec.name in REGISTRY.plugins and not with_plugins:
            continue
        own = [key for key in spec.options if key not in seen]
        seen.update(own)
        if own:
            lines.append(f"# {spec.display_name}" + (f" ({REGISTRY.plugins[spec.name].describe()})"
                                                     if spec.name in REGISTRY.plugins else ""))
            lines += tomli_w.dumps({key: spec.options[key].default for key in own}).splitlines()
    return "\n".join([*lines, BLOCK_END])


def write_pyproject(path: Path = PYPROJECT, with_plugins: bool = False) -> bool:
    """Replace the generated block of ``path``; True when it changed."""
    text = path.read_text()
    pattern = re.compile(re.escape(BLOCK_START) + r".*?" + re.escape(BLOCK_END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{path} has no generated block of method keys ({BLOCK_START!r} … {BLOCK_END!r})")
    new = pattern.sub(lambda _: pyproject_block(with_plugins), text)
    if new != text:
        path.write_text(new)
    return new != text
