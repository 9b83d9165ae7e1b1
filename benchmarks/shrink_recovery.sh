#!/usr/bin/env bash
# The issue-19 figures for --on-failure shrink: worlds 3 and 4, shared memory (auto) and TCP, rank 1
# SIGKILLed in step 20 of 60, beside the uninterrupted run at the same world. Writes one JSON log
# and one stdout file per run to benchmarks/results/shrink-recovery/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/results/shrink-recovery
mkdir -p "$out"
for world in 3 4; do
  for transport in auto tcp; do
    for kind in whole shrunk; do
      name="w${world}-${transport}-${kind}"
      fault=()
      if [ "$kind" = shrunk ]; then fault=(--on-failure shrink --fail-rank 1 --fail-at-step 20); fi
      PYCOMM_TRANSPORT=$transport python3 -m pycomm.train --backend pycomm --nproc "$world" --steps 60 \
        --batch-size 4 "${fault[@]}" --json "$out/$name.json" >"$out/$name.txt" 2>&1
      echo "$name: $(grep -E 'shrunk to|first step on the shrunk' "$out/$name.txt" | tr '\n' ' ')"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('  final train', round(d['train_loss'][-1],4), 'val', round(d['val_loss'][-1]['loss'],4), 'world', d['config']['world_size'])" "$out/$name.json"
    done
  done
done
