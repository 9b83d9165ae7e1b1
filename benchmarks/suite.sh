#!/usr/bin/env bash
# The standard sweeps, one result set each in benchmarks/results/:
#   1. the default run: all_reduce float32 4K..64M, pycomm vs gloo, world 2;
#   2. every op at world 3 (odd world: uneven chunking), 4K..1M.
# Extra flags are passed to both (e.g. --backends gloo before pycomm builds).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/run.sh" allreduce-w2 "$@"
"$here/run.sh" allops-w3 --op all --sizes 4K:1M --nproc 3 "$@"
