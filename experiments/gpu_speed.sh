#!/usr/bin/env bash
# Converted encoder (remote code of the Hugging Face export, FAVOR+ M = 64 per head) against
# transformers' BertModel with SDPA attention, both with random weights and MiniLM's shapes
# (6 layers, 12 heads, width 384), position table enlarged to 8192 (legitimate only because the
# weights are random: speed does not depend on them). Needs torch + transformers and this repo.
#
#   OUT=/path/to/results bash experiments/gpu_speed.sh
#
# Writes $OUT/env.txt and, per dtype, $OUT/gpu_<dtype>.{json,csv,md,log}. Overrides: DEVICE
# (cuda), DTYPES ("float32 bfloat16"), LENGTHS ("128 ... 8192"), BATCH (32; halved per length on
# out-of-memory, the row says the batch it ran at), REPEATS (5), THREADS (4), PYTHON (python,
# else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to an output directory}"
PY=${PYTHON:-$(command -v python || command -v python3)}
DEVICE=${DEVICE:-cuda}
DTYPES=${DTYPES:-"float32 bfloat16"}
LENGTHS=${LENGTHS:-"128 256 512 1024 2048 4096 8192"}
BATCH=${BATCH:-32}
REPEATS=${REPEATS:-5}
MAXPOS=$(printf '%s\n' $LENGTHS | sort -n | tail -1)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"
"$PY" - <<'PYEOF' | tee "$OUT/env.txt"
import platform, torch, transformers
print("python", platform.python_version(), "torch", torch.__version__,
      "transformers", transformers.__version__)
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "tf32 matmul",
          torch.backends.cuda.matmul.allow_tf32)
PYEOF
for dtype in $DTYPES; do
  # shellcheck disable=SC2086
  "$PY" -m coulomb_attention.cli bench encoder --random-init --device "$DEVICE" \
    --dtype "$dtype" --lengths $LENGTHS --max-positions "$MAXPOS" --batch-size "$BATCH" \
    --repeats "$REPEATS" --threads "${THREADS:-4}" --out "$OUT/gpu_$dtype.json" 2>&1 | tee "$OUT/gpu_$dtype.log"
done
