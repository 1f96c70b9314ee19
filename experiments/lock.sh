#!/usr/bin/env bash
# Refresh requirements.lock, the exact version of every package of Basin's environment that
# experiments/setup.sh installs: resolve pyproject.toml's ranges afresh in a temporary
# environment and record what it holds. Run it after changing a dependency in
# pyproject.toml, then run the tests (README command 2), and commit both files.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d -t basin-lock-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
echo "[basin] resolving pyproject.toml's dependencies in a temporary environment…"
"$tmp/venv/bin/pip" install --quiet --disable-pip-version-check -e ".[test,tracking,privacy]" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
{
  echo "# Every package of Basin's environment at its exact version: experiments/setup.sh installs"
  echo "# these, then Basin itself. Written by experiments/lock.sh from pyproject.toml's ranges;"
  echo "# tests/test_lock.py fails when pyproject.toml asks for something this file does not hold."
  "$tmp/venv/bin/pip" freeze --disable-pip-version-check --exclude-editable | LC_ALL=C sort -f
} > requirements.lock
echo "[basin] wrote requirements.lock ($(grep -c '==' requirements.lock) packages)"
