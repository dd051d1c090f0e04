#!/bin/bash
# The committed estimator results (docs/results/estimators/), on one torch thread.
set -e
python experiments/particles_vs_random_features.py --seeds 5 --out runs/estimators
python experiments/particles_vs_random_features.py --family --seeds 2 --out runs/estimators_family
