#!/usr/bin/env bash
# The main job: the default benchmark, pycomm against gloo, all_reduce from 4 KiB to 64 MiB at world 2.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec python3 -m pycomm.bench "$@"
