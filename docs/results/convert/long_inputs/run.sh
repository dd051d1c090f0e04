#!/bin/bash
# Issue 32, long inputs and the linear-branch ablation (all-MiniLM-L6-v2, M = 64 per head, particles on
# Hedgehog's map, 1 thread each on the shared 2-core machine). The result.json of each run is copied here
# (hybrid_w16_sS/, alone_w16_sS/, and the pure-linear rows from the conversion cache of
# `minilm compare`, measured again by `convert --evaluate`); rows.md is `report rows.json --conversions`.
set -e
D=../shared/data
for s in 0 1 4; do
  P=$([ $s = 0 ] && echo "--probe-tasks sst2 rotten_tomatoes" || echo "--probe-tasks")
  C="--encoder minilm --n-features 64 --feature-map hedgehog --seed $s --data-dir $D --threads 1 --doc-lengths 256 512 --no-hf $P"
  coulomb-attention convert $C --window 16 --window-alone --out runs/c32/alone_w16_s$s
  coulomb-attention convert $C --window 16 --out runs/c32/hybrid_w16_s$s
done
# the pure-linear rows: the conversions phase A of `minilm compare` made (or `convert --feature-map M
# --variant V --seed S --out DIR` with the defaults: the same checkpoints), measured on the same documents
for d in runs/convert_cache/minilm-*-M64-s[014]-*; do
  coulomb-attention convert --evaluate --out $d --doc-lengths 256 512 --probe-tasks --data-dir $D --threads 1
done
coulomb-attention report docs/results/convert/long_inputs/rows.json --conversions
