"""The ``convert`` command's flag tables, torch-free (``--help`` imports no torch).

The flags that set a config field default to None and take the config's own default in
:func:`coulomb_attention.commands.convert.config_from_args`; tests/commands/test_help_and_args.py
checks these tables against ConvertConfig, DistillConfig, FinishConfig and convert.VARIANTS.
"""

from __future__ import annotations

VARIANTS = ("vanilla", "particles", "hedgehog", "softmax")
LORA_OBJECTIVES = ("embedding", "tokens", "layers")  # train.finish.OBJECTIVES
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")  # nn.lora.ALL_TARGETS
#: flag (dest) -> ConvertConfig field
CONVERT_FLAGS = {"encoder": "encoder", "feature_map": "feature_map", "n_features": "n_features",
                 "seed": "seed", "variant": "variant", "tasks": "tasks",
                 "max_length": "max_length", "eval_sentences": "eval_sentences",
                 "probe_tasks": "probe_tasks", "probe_train": "probe_train",
                 "probe_eval": "probe_eval", "window": "window", "doc_lengths": "doc_lengths",
                 "doc_count": "doc_count"}
#: the flags (dests) ``convert --evaluate`` accepts: those of CONVERT_FLAGS whose field is in
#: convert.EVAL_FIELDS (tests/commands/test_help_and_args.py checks the two agree)
EVALUATION_FLAGS = ("eval_sentences", "probe_tasks", "probe_train", "probe_eval", "doc_lengths",
                    "doc_count")
#: flag (dest) -> DistillConfig field
DISTILL_FLAGS = {"n_sentences": "n_examples", "holdout": "holdout", "steps": "steps",
                 "batch_size": "batch_size", "rows": "rows_per_sequence", "eta": "eta",
                 "eta_end": "eta_end", "beta": "beta", "lam": "lam",
                 "output_weight": "output_weight", "lr": "lr", "refine_steps": "refine_steps",
                 "refine_sentences": "refine_examples", "refine_eta": "refine_eta",
                 "refine_max_drift": "refine_max_drift", "pairs": "pairs"}
#: flag (dest) -> FinishConfig field (with --lora-rank > 0)
LORA_FLAGS = {"lora_steps": "steps", "lora_lr": "lr", "lora_objective": "objective",
              "lora_aux_weight": "aux_weight", "lora_targets": "targets"}
#: the defaults --help prints, torch-free copies of ConvertConfig's, DistillConfig's and
#: FinishConfig's (tests/commands/test_help_and_args.py checks them against the configs)
HELP_DEFAULTS = {
    "convert": {"encoder": "minilm", "feature_map": "hedgehog", "n_features": 64, "seed": 0,
                "variant": "particles", "tasks": ("sst2", "rotten_tomatoes", "qqp"),
                "max_length": 64, "eval_sentences": 512,
                "probe_tasks": ("sst2", "rotten_tomatoes"), "probe_train": 2000,
                "probe_eval": 0, "window": 0, "doc_lengths": (), "doc_count": 32},
    "distill": {"n_examples": 1024, "holdout": 256, "steps": 150, "batch_size": 64,
                "rows_per_sequence": 16, "eta": 3.0, "eta_end": 0.3, "beta": 1e6, "lam": 0.0,
                "output_weight": 0.0, "lr": 0.02, "refine_steps": 200,
                "refine_examples": 4096, "refine_eta": 1.0, "refine_max_drift": 0.05,
                "pairs": False},
    "finish": {"steps": 200, "lr": 0.002, "objective": "embedding", "aux_weight": 1.0,
               "targets": ("q_proj", "k_proj", "v_proj", "out_proj")},
}


def dflt(dest: str) -> str:
    """``(default: VALUE)`` of the config field flag ``dest`` sets."""
    for name, flags in (("convert", CONVERT_FLAGS), ("distill", DISTILL_FLAGS),
                        ("finish", LORA_FLAGS)):
        if dest in flags:
            value = HELP_DEFAULTS[name][flags[dest]]
            text = (" ".join(map(str, value)) or "none") if isinstance(value, tuple) else \
                f"{value:g}" if isinstance(value, float) else str(value)
            return f"(default: {text})"
    raise KeyError(f"--{dest.replace('_', '-')} sets no config field")


def evaluation_changes(args) -> dict:
    """The evaluation settings ``convert --evaluate`` was given (ConvertConfig field -> value).

    Raises ValueError naming every flag given that would change the conversion itself.
    """
    other = [f"--{flag.replace('_', '-')}" for flag in (*CONVERT_FLAGS, *DISTILL_FLAGS)
             if flag not in EVALUATION_FLAGS and getattr(args, flag) is not None]
    if other:
        raise ValueError(f"--evaluate changes only the evaluation, not {', '.join(other)}")
    return {CONVERT_FLAGS[flag]: getattr(args, flag) for flag in EVALUATION_FLAGS
            if getattr(args, flag) is not None}
