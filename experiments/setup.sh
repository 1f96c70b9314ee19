#!/usr/bin/env bash
# Create .venv with the exact versions requirements.lock holds (experiments/lock.sh writes
# it from pyproject.toml's ranges, with the extras test, tracking and privacy: the test
# tools, the experiment trackers and Flower's privacy accountant), then Basin itself,
# editable. Idempotent: re-runs only when pyproject.toml or requirements.lock changed. Used
# by both README commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.basin-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements.lock ]; then
  exit 0
fi
bash experiments/check-free-disk.sh 8 . "installing Basin into .venv"
echo "[basin] installing into .venv from requirements.lock (first time: about 2½ minutes on 2 cores)…"
python3 -m venv .venv
# pip's "Location … is ignored" lines come from this machine's extra local indexes: noise.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
quiet .venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .
# The lock must hold everything each package asks for: pip says what is missing or conflicts.
if ! problems=$(.venv/bin/pip check --disable-pip-version-check); then
  echo "$problems" >&2
  echo "error: requirements.lock misses or conflicts with what a package needs (above); refresh it: bash experiments/lock.sh" >&2
  exit 1
fi
touch "$stamp"
