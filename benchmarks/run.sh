#!/usr/bin/env bash
# Run one pycomm.bench sweep and keep its table, JSON and (with matplotlib)
# plot under benchmarks/results/NAME-<UTC stamp>.{txt,json,png}.
#
#   benchmarks/run.sh NAME [pycomm.bench flags...]
#   benchmarks/run.sh allreduce-w2
#   benchmarks/run.sh allops-w3 --op all --sizes 4K:1M --nproc 3
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
name="${1:?usage: benchmarks/run.sh NAME [pycomm.bench flags...]}"
shift
out="$here/results/$name-$(date -u +%Y%m%dT%H%M%SZ)"

plot=()
if python -c "import matplotlib" 2>/dev/null; then
    plot=(--plot "$out.png")
fi

cd "$root"
# pipefail: the script fails when the bench does (errors, wrong results).
python -m pycomm.bench "$@" --json "$out.json" "${plot[@]}" | tee "$out.txt"
