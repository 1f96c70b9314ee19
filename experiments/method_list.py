"""Every method and averaging rule Basin knows, with installed plug-ins and the broken ones;
and the files derived from Basin's own declarations, regenerated after a method is added:

    .venv/bin/python -m experiments.method_list                    # list them
    .venv/bin/python -m experiments.method_list --write-pyproject  # regenerate pyproject.toml's method keys
    .venv/bin/python -m experiments.method_list --write-docs       # regenerate docs/methods.md's table

How a method is added: docs/extending.md.
"""

from __future__ import annotations

import argparse

from strategies.methods import listing, write_docs, write_pyproject


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m experiments.method_list", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-pyproject", action="store_true",
                        help="rewrite pyproject.toml's generated block of method keys (Basin's own methods)")
    parser.add_argument("--write-docs", action="store_true",
                        help="rewrite docs/methods.md's generated table of methods (Basin's own methods)")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    if arguments.write_pyproject:
        print("pyproject.toml " + ("updated" if write_pyproject() else "already up to date"))
    if arguments.write_docs:
        print("docs/methods.md " + ("updated" if write_docs() else "already up to date"))
    if not (arguments.write_pyproject or arguments.write_docs):
        print(listing())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
