#!/bin/bash
# Issue 32, the M grid at the full budget (all-MiniLM-L6-v2): particles on Hedgehog's map against the
# tied Hedgehog baseline at M = 16 and 32 (seeds 0-2; 2026-12-07, two 1-thread processes side by side),
# beside the M = 64 rows of ../long_inputs (5 seeds). The result.json of each run is copied here
# (m{M}_{particles,hedgehog}_sS/); rows.md is `report rows.json --conversions`.
set -e
D=../shared/data
for m in 16 32; do for s in 0 1 2; do for v in particles hedgehog; do
  coulomb-attention convert --encoder minilm --n-features $m --feature-map hedgehog --variant $v --seed $s \
    --data-dir $D --threads 1 --no-hf --out runs/c36/m${m}_${v}_s$s
done; done; done
coulomb-attention report docs/results/convert/m_grid/rows.json --conversions
