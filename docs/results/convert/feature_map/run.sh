#!/bin/bash
# full-budget conversions at M=64 (convert's defaults), one thread, nice 15
cd /work/wt-convert
PY="nice -n 15 env PYTHONPATH=src /work/main/.venv/bin/python -m coulomb_attention.cli"
C="convert --encoder minilm --n-features 64 --data-dir /work/shared/data --threads 1 --no-progress --no-hf"
for job in "hedgehog particles 0" "favor particles 0" "favor hedgehog 0" "hedgehog particles 1"; do
  set -- $job
  out=runs/fmap/$1_$2_s$3
  echo "== $job $(date -u +%T)"
  /usr/bin/time -f "wall %e s" $PY $C --feature-map $1 --variant $2 --seed $3 --out $out 2>&1 | tail -4
done
echo "== done $(date -u +%T)"
