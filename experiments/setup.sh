#!/usr/bin/env bash
# Create .venv with Basin and its pinned dependencies (idempotent: re-runs only when
# pyproject.toml changed), with the test tools, the experiment trackers and Flower's privacy
# accountant (the extras test, tracking and privacy; `pip install -e .` alone leaves them out). Used by both README commands and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.basin-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
echo "[basin] installing into .venv (first time: about 3 minutes on 2 cores)…"
python3 -m venv .venv
# pip's "Location … is ignored" lines come from this machine's extra local indexes: noise.
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[test,tracking,privacy]" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
touch "$stamp"
