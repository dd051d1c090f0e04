#!/usr/bin/env bash
# Decode speed of two versions of the code, alternating on the same machine (issue 47):
#   experiments/decode_ab.sh OLD_COMMIT [RUNS] [OUT]
# runs `bench decoder` at 8,192 tokens (teacher, Hedgehog hybrid, pure FAVOR+; batch 1, two
# threads, the real SmolLM2 weights) RUNS times for this checkout ("new") and RUNS - 1 times
# for OLD_COMMIT ("old"), new first and last: new_1, old_1, new_2, ..., new_RUNS under OUT
# (default runs/bench_ab). The teacher's step varies a lot between runs on a shared CPU (its
# 360 MB KV cache is copied at every step), so compare each run's ratios and the converted
# rows' own ms/token, not one run. Each version runs its own benchmark: from commit 5ea9911 on
# it interleaves the rows' decode steps, before that each row decoded all its steps in turn.
# Session 13's runs (both versions before 5ea9911): docs/results/lm/bench_lean/ab/.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?usage: experiments/decode_ab.sh OLD_COMMIT [RUNS] [OUT]}
runs=${2:-3}
out=${3:-runs/bench_ab}
py=${PY:-.venv/bin/python}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git archive "$old" src | tar -x -C "$tree"
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  for v in new old; do
    if [ "$v" = old ] && [ "$i" = "$runs" ]; then continue; fi
    src=$PWD/src
    if [ "$v" = old ]; then src=$tree/src; fi
    PYTHONPATH=$src $py -c "import sys; from coulomb_attention.cli import main; sys.exit(main())" \
      bench decoder --model smollm2 --lengths 8192 --batches 1 --threads 2 \
      --rows teacher hybrid_hedgehog favor --out "$out/${v}_$i" > "$out/${v}_$i.log" 2>&1
  done
done
grep -H "| 8192 |" "$out"/*/results.md
