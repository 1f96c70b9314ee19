"""Basin's command-line tools (``.venv/bin/python -m experiments.<tool>``) and its Python
API: ``from experiments import run, sweep, load_run`` (experiments/api.py, docs/python-api.md).

Run by a Python without Basin's dependencies (the system's ``python`` instead of the
environment ``experiments/setup.sh`` creates), a tool would fail on its first import
with a traceback that does not say why; this package says it in one line instead.
"""

import importlib.util
import sys

# What every tool imports; checked without importing them (no start-up cost).
REQUIRED = ("torch", "flwr", "pandas")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a broken package
        return False


if missing := [module for module in REQUIRED if not _installed(module)]:
    print(f"error: this Python ({sys.executable}) lacks Basin's dependencies ({', '.join(missing)}); create "
          f"the environment with `bash experiments/setup.sh` and run the tools with "
          f"`.venv/bin/python -m experiments.<tool>`", file=sys.stderr)
    sys.exit(2)

# `from experiments import run, sweep, load_run`: run and sweep are the command-line modules
# experiments/run.py and sweep.py, callable as experiments.api.run and .sweep (a function
# of the same name here would be replaced by the module the moment it is imported).
from experiments.api import load_run  # noqa: E402  (after the check above)

__all__ = ["load_run", "run", "sweep"]
