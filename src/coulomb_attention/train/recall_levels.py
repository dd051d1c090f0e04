"""The two MQAR difficulties of ``coulomb-attention recall`` and the ablation's MQAR arena:
the task with the model and training that go with it, as small overrides of the
:class:`~coulomb_attention.train.recall.RecallRunConfig` defaults (torch-free, so the command's
``--help`` stays fast)."""

from __future__ import annotations

__all__ = ["RECALL_LEVELS"]

# the two difficulties (task + the model/training that goes with it); small overrides of
# the RecallRunConfig defaults
RECALL_LEVELS: dict[str, dict] = {
    "easy": {
        "task": {"vocab_size": 128, "n_pairs": 8, "seq_len": 48, "n_queries": 8},
        "model": {"vocab_size": 128, "max_len": 48, "dim": 64, "heads": 1, "mlp_dim": 128},
        "train": {"epochs": 4, "lr": 6e-3},
        "warmup_epochs": 2, "n_train": 5000, "n_eval": 1000,
    },
    "hard": {
        "task": {"vocab_size": 256, "n_pairs": 16, "seq_len": 80, "n_queries": 16},
        "model": {"vocab_size": 256, "max_len": 80, "dim": 64, "heads": 1, "mlp_dim": 128},
        # 4 epochs left exact softmax at 0.61 (still learning); 12 reach 0.977 (seed 0)
        "train": {"epochs": 12, "lr": 6e-3},
        "warmup_epochs": 2, "n_train": 5000, "n_eval": 1000,
    },
}
