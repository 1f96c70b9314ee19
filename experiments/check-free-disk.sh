#!/usr/bin/env bash
# Fails, in one line, when the filesystem holding FOLDER has less than GIB GiB free, before an
# install starts (a virtual environment with torch's CUDA build takes about 7 GiB; pip,
# when it runs out, stops half-way with "[Errno 28] No space left on device").
# BASIN_MIN_FREE_GIB, when set, replaces GIB (a machine known to need less or more).
# Usage: bash experiments/check-free-disk.sh GIB FOLDER WHAT
set -euo pipefail
needed_gib="${BASIN_MIN_FREE_GIB:-$1}" folder="$2" what="$3"
free_kib=$(df -Pk "$folder" | awk 'NR == 2 { print $4 }')
free_gib=$((free_kib / 1024 / 1024))
if [ "$free_gib" -lt "$needed_gib" ]; then
  echo "error: $what needs about $needed_gib GiB free on the disk of $(cd "$folder" && pwd); it has $free_gib GiB: free some space (an old .venv or pip's cache, pip cache purge) and run it again" >&2
  exit 1
fi
