#!/bin/bash
# The committed mean-field study (docs/results/meanfield_1d, meanfield_2d, meanfield_eta), one torch thread.
set -e
coulomb-attention meanfield --threads 1 --out runs/meanfield_1d
coulomb-attention meanfield --dim 2 --threads 1 --out runs/meanfield_2d
for eta in 0.02 0.01 0.005; do  # the time-step check: 32 seeds pooled at N = 256
  coulomb-attention meanfield --threads 1 --ns 128 256 --n-seeds 32 --eta $eta --snapshots 2 \
      --out runs/meanfield_eta$eta
done
