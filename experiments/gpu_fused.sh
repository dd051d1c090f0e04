#!/usr/bin/env bash
# The fused Triton kernels on one GPU, in under 10 minutes of device time (each step has a
# timeout; a step that fails or times out is recorded in $OUT/status.txt and the next runs):
#
#   OUT=/path/to/results bash experiments/gpu_fused.sh
#
# 1. the compiled kernels against the naive twins (values, gradients, masks, bf16) on the GPU:
#    tests/nn/test_triton_linear.py with COULOMB_TEST_DEVICE=cuda (<= 120 s, mostly compiling);
# 2. op level: bench attention --device cuda: fused/favor, today's ops, SDPA (flash for bf16),
#    fla's causal kernels where installed; bf16 and float32; L 128..16384; B H = 32, d = 64,
#    M = 64; bandwidth of the fused path against the measured copy bandwidth ($OUT/op/);
# 3. whole encoder: bench encoder --random-init (MiniLM's shapes, FAVOR+ M = 64) against
#    BertModel with SDPA, batch 32, today's remote code and --fused, bf16 and float32
#    ($OUT/encoder_<dtype>_<today|fused>.{json,csv,md});
# 4. experiments/gpu_fused_report.py: $OUT/summary.md and $OUT/encoder_ratio.png;
# 5. decoder (issue 47): bench decoder --random (SmolLM2-135M's shapes, random weights, so no
#    gguf), bf16: the teacher (KV cache) against the hybrid rows (window 64 + 4 sinks + linear
#    rest, hedgehog and favor) at L 2048 8192 32768 (the teacher stops at its 8192 positions),
#    batch 1 and 8: prefill time, decode ms/token, tokens/s, state vs KV bytes
#    ($OUT/decoder/results.{json,md}; <= 100 s, cells left after 70 s are skipped).
#
# Needs torch (CUDA), triton, transformers (steps 3) and this repo; fla optional
# (pip install flash-linear-attention==0.6.0 einops). Overrides: PYTHON, LENGTHS (op level),
# ENC_LENGTHS, ENC_DTYPES ("bfloat16 float32"), BATCH (32), DEC_LENGTHS ("2048 8192 32768").
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to an output directory}"
PY=${PYTHON:-$(command -v python || command -v python3)}
LENGTHS=${LENGTHS:-"128 256 512 1024 2048 4096 8192 16384"}
ENC_LENGTHS=${ENC_LENGTHS:-"128 512 1024 2048 4096 8192"}
ENC_DTYPES=${ENC_DTYPES:-"bfloat16 float32"}
BATCH=${BATCH:-32}
DEC_LENGTHS=${DEC_LENGTHS:-"2048 8192 32768"}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0
mkdir -p "$OUT"
: > "$OUT/status.txt"
step() {  # step NAME TIMEOUT_S CMD...: run, log, record the exit status and the wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - t0))" | tee -a "$OUT/status.txt"
}
"$PY" - <<'PYEOF' > "$OUT/env.txt" 2>&1
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__)
try:
    import triton; print("triton", triton.__version__)
except ImportError as e: print("triton missing", e)
try:
    import fla; print("fla", getattr(fla, "__version__", "?"))
except Exception as e: print("fla not available", type(e).__name__)
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "tf32 matmul", torch.backends.cuda.matmul.allow_tf32)
PYEOF
cat "$OUT/env.txt"
COULOMB_TEST_DEVICE=cuda step kernels_vs_naive 120 "$PY" -m pytest -q -p no:cacheprovider \
  tests/nn/test_triton_linear.py
# shellcheck disable=SC2086
step op_level 160 "$PY" -m coulomb_attention.cli bench attention --device cuda --lengths $LENGTHS \
  --dtypes bfloat16 float32 --batch-heads 32 --heads 4 --head-dim 64 --features 64 \
  --repeats 10 --time-budget 130 --out "$OUT/op"
MAXPOS=$(printf '%s\n' $ENC_LENGTHS | sort -n | tail -1)
for dtype in $ENC_DTYPES; do
  for mode in today fused; do
    extra=""; [ "$mode" = fused ] && extra="--fused"
    # shellcheck disable=SC2086
    step "encoder_${dtype}_$mode" 40 "$PY" -m coulomb_attention.cli bench encoder --random-init \
      --device cuda --dtype "$dtype" --lengths $ENC_LENGTHS --max-positions "$MAXPOS" \
      --batch-size "$BATCH" --repeats 3 $extra --out "$OUT/encoder_${dtype}_$mode.json"
  done
done
step report 20 "$PY" experiments/gpu_fused_report.py "$OUT"
# shellcheck disable=SC2086
step decoder_bf16 100 "$PY" -m coulomb_attention.cli bench decoder --random --device cuda \
  --dtype bfloat16 --rows teacher hybrid_hedgehog hybrid_favor --lengths $DEC_LENGTHS \
  --batches 1 8 --decode-steps 32 --time-budget 70 --out "$OUT/decoder"
cat "$OUT/status.txt"
[ -f "$OUT/summary.md" ] && cat "$OUT/summary.md"
[ -f "$OUT/decoder/results.md" ] && cat "$OUT/decoder/results.md"
