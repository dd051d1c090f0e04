#!/bin/bash
# Issue 32, long inputs and the linear-branch ablation (all-MiniLM-L6-v2, M = 64 per head, particles on
# Hedgehog's map, 1 thread per process on the shared 2-core machine). The result.json of each run is copied
# here (hybrid_w16_sS/, alone_w16_sS/, hedgehog_particles_sS/, hedgehog_baseline_sS/, favor_particles_sS/);
# rows.md is `report rows.json --conversions`.
set -e
D=../shared/data
for s in 0 1 2 3 4; do
  P=$([ $s = 0 ] && echo "--probe-tasks sst2 rotten_tomatoes" || echo "--probe-tasks")
  C="--encoder minilm --n-features 64 --feature-map hedgehog --seed $s --data-dir $D --threads 1 --doc-lengths 256 512 --no-hf"
  coulomb-attention convert $C $P --window 16 --window-alone --out runs/c32/alone_w16_s$s
  coulomb-attention convert $C $P --window 16 --out runs/c32/hybrid_w16_s$s
done
# the pure-linear rows: seeds 2 and 3 of Hedgehog's map converted directly ...
for s in 2 3; do
  coulomb-attention convert --encoder minilm --n-features 64 --feature-map hedgehog --seed $s --data-dir $D \
    --threads 1 --doc-lengths 256 512 --no-hf --probe-tasks --out runs/c32/linear_s$s
done
# ... the others are the conversions phase A of `minilm compare` made in its --convert-cache (the same
# configurations as `convert --feature-map M --variant V --seed S` at the defaults), measured again
for d in runs/convert_cache/minilm-*-M64-s[0-4]-*; do
  coulomb-attention convert --evaluate --out $d --doc-lengths 256 512 --probe-tasks --data-dir $D --threads 1
done
coulomb-attention report docs/results/convert/long_inputs/rows.json --conversions
# 2026-12-06: the paper's other maps. The conversions of `minilm compare --variants softmax_feat:teacher
# porf_softplus:teacher` (softmax_feat seeds 0-4, porf_softplus seeds 0-2; the same configurations as
# `convert --feature-map softmax_feat|porf_softplus --variant particles --seed S`) measured the same way,
# their result.json copied to softmax_feat_particles_sS/, porf_softplus_particles_sS/; rows and pairs added
# to rows.json, then the report above again
for d in runs/convert_cache/minilm-softmax_feat-particles-M64-s[0-4]-* runs/convert_cache/minilm-porf_softplus-particles-M64-s[0-2]-*; do
  coulomb-attention convert --evaluate --out $d --doc-lengths 256 512 --probe-tasks --data-dir $D --threads 1
done
coulomb-attention report docs/results/convert/long_inputs/rows.json --conversions
