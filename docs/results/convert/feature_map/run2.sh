#!/bin/bash
# after run.sh: the W = 16 hybrid and the window alone (particles on Hedgehog's map, M = 64,
# seed 0, full budget), then the speed of the hybrid architecture at 128 and 512 tokens
cd /work/wt-convert
while ! grep -q "== done" runs/fmap/log.txt; do sleep 20; done
PY="nice -n 15 env PYTHONPATH=src /work/main/.venv/bin/python -m coulomb_attention.cli"
C="convert --encoder minilm --n-features 64 --feature-map hedgehog --seed 0 --data-dir /work/shared/data --threads 1 --no-progress"
echo "== hybrid W16 $(date -u +%T)"
/usr/bin/time -f "wall %e s" $PY $C --window 16 --out runs/fmap/hedgehog_particles_w16_s0 2>&1 | tail -4
echo "== window alone W16 $(date -u +%T)"
/usr/bin/time -f "wall %e s" $PY $C --window 16 --window-alone --out runs/fmap/window_alone_w16_s0 2>&1 | tail -4
echo "== bench $(date -u +%T)"
$PY bench encoder runs/fmap/hedgehog_particles_w16_s0/hf --lengths 128 512 --batch-size 32 --threads 1 --out runs/fmap/speed_w16.json 2>&1 | tail -6
$PY export-hf runs/fmap/hedgehog_particles_s0/checkpoint runs/fmap/hedgehog_particles_s0_hf | tail -1
$PY bench encoder runs/fmap/hedgehog_particles_s0_hf --lengths 128 512 --batch-size 32 --threads 1 --out runs/fmap/speed_linear.json 2>&1 | tail -6
echo "== done2 $(date -u +%T)"
