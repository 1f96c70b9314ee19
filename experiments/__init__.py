"""Basin's command-line tools (``.venv/bin/python -m experiments.<tool>``) and its Python
API: ``from experiments.api import run, sweep, reproduce, load_run`` (docs/python-api.md).

Run by a Python without Basin's dependencies (the system's ``python`` instead of the
environment ``experiments/setup.sh`` creates), a tool would fail on its first import
with a traceback that does not say why; this package says it in one line instead (exit
2) when a command starts, and raises ModuleNotFoundError with that line when imported
from Python (the API never exits the interpreter).
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
    _message = (f"this Python ({sys.executable}) lacks Basin's dependencies ({', '.join(missing)}); create the "
                f"environment with `bash experiments/setup.sh` and run the tools with "
                f"`.venv/bin/python -m experiments.<tool>`")
    # `python -m experiments.<tool>` imports this package while sys.argv[0] is still "-m".
    if sys.argv[:1] == ["-m"]:
        from clients.log import log  # the standard library only

        log.error(f"error: {_message}", extra={"bare": True})
        sys.exit(2)
    raise ModuleNotFoundError(_message, name=missing[0])
