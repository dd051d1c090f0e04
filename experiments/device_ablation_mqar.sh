#!/usr/bin/env bash
# The MQAR arena of the ablation on a many-core machine (the lent 16-core GPU host of 2026-12-04):
# every variant, M 8..128 at the easy level and M 16/64 at the hard level, seeds 0-4, one torch
# thread per worker; easy first, so a cut run still returns whole easy tables. Records and report
# go to $OUT (or ./runs/device_mqar). Usage: bash experiments/device_ablation_mqar.sh [JOBS] [SECONDS]
set -u
JOBS=${1:-14}
LIMIT=${2:-480}
OUTDIR=${OUT:-runs/device_mqar}
PY=${PY:-python3}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
mkdir -p "$OUTDIR"
W=/tmp/device_mqar
mkdir -p $W
$PY -c "import torch, platform; print('torch', torch.__version__, 'python', platform.python_version())"
echo "cores: $(nproc --all)"
start=$(date +%s)
timeout $LIMIT $PY -m coulomb_attention.cli ablation --arena mqar --settings easy --jobs "$JOBS" \
    --out $W > "$OUTDIR/mqar_easy.log" 2>&1
echo "easy done rc=$? after $(( $(date +%s) - start )) s"
left=$(( LIMIT - ( $(date +%s) - start ) ))
if [ $left -gt 30 ]; then
  timeout $left $PY -m coulomb_attention.cli ablation --arena mqar --settings hard --features 16 64 \
      --jobs "$JOBS" --out $W > "$OUTDIR/mqar_hard.log" 2>&1
  echo "hard rc=$? after $(( $(date +%s) - start )) s"
fi
cp $W/records.jsonl "$OUTDIR/records.jsonl"
$PY -m coulomb_attention.cli ablation --report-only --out $W > /dev/null 2>&1 && cp $W/report.md "$OUTDIR/report.md"
wc -l "$OUTDIR/records.jsonl"
