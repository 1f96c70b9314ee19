"""Basin's command-line tools (``.venv/bin/python -m experiments.<tool>``) and its Python
API: ``from experiments.api import run, sweep, reproduce, load_run`` (docs/python-api.md).

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
