"""``.venv/bin/python -m experiments.analysis TOOL ARGS…``: run one analysis tool (see the package docstring)."""

from __future__ import annotations

import importlib
import sys

from experiments.runtime.cli import guarded

TOOLS = {
    "landscape": "experiments.analysis.landscape",
    "interpolate": "experiments.analysis.interpolation",
    "decompose": "experiments.analysis.decomposition",
    "hessian": "experiments.analysis.hessian",
    "stability": "experiments.analysis.stability",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in TOOLS:
        asked = bool(argv) and argv[0] in ("-h", "--help")  # asked-for help goes to stdout, as argparse's
        given = f"{argv[0]!r} is not a tool; " if argv and not asked else ""
        print(f"usage: .venv/bin/python -m experiments.analysis TOOL [--help]\n{given}tools: {', '.join(TOOLS)}",
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    tool = importlib.import_module(TOOLS[argv[0]])
    try:
        return guarded(lambda: tool.main(argv[1:]))
    except SystemExit as exit:  # argparse's refusal (one "error:" line) or --help, as an exit code
        return int(exit.code or 0)


if __name__ == "__main__":
    sys.exit(main())
