"""The ``convert`` command's flags and their tables, torch-free (``--help`` imports no torch).

The flags that set a config field default to None and take the config's own default in
:func:`coulomb_attention.commands.convert.config_from_args`; tests/commands/test_help_and_args.py
checks these tables against ConvertConfig, DistillConfig, FinishConfig and convert.VARIANTS.
"""

from __future__ import annotations

import argparse

from ..names import CONVERT_VARIANTS as VARIANTS
from ..names import LORA_OBJECTIVES
from ._args import add_progress, add_threads

# VARIANTS (ConvertConfig.variant) and LORA_OBJECTIVES (convert.finish.OBJECTIVES): the vocabulary
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")  # nn.lora.ALL_TARGETS
#: flag (dest) -> ConvertConfig field
CONVERT_FLAGS = {"encoder": "encoder", "feature_map": "feature_map", "n_features": "n_features",
                 "seed": "seed", "variant": "variant", "tasks": "tasks",
                 "max_length": "max_length", "eval_sentences": "eval_sentences",
                 "probe_tasks": "probe_tasks", "probe_train": "probe_train",
                 "probe_eval": "probe_eval", "window": "window", "doc_lengths": "doc_lengths",
                 "doc_count": "doc_count", "fit_documents": "fit_documents"}
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
                "probe_eval": 0, "window": 0, "doc_lengths": (), "doc_count": 32,
                "fit_documents": 0},
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder", help=f"minilm or a BERT checkpoint directory {dflt('encoder')}")
    p.add_argument("--feature-map",
                   help="the map the particles move in: favor, softmax_feat, porf_softplus or "
                        "hedgehog (Hedgehog's map, its rows untied particles) "
                        f"{dflt('feature_map')}")
    p.add_argument("--n-features", type=int, help=f"particles per head {dflt('n_features')}")
    p.add_argument("--seed", type=int, help=dflt("seed"))
    p.add_argument("--variant", choices=VARIANTS,
                   help=f"particles (the method), vanilla (fixed features), hedgehog (the tied "
                        f"Adam baseline on Hedgehog's map), softmax (the teacher) "
                        f"{dflt('variant')}")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--out", default="runs/convert", help="output directory (default: %(default)s)")
    p.add_argument("--sentences", default=None,
                   help="text file, one sentence per line (default: training text of --tasks)")
    p.add_argument("--pairs", action="store_const", const=True, default=None,
                   help="distil on a pair task's (QQP's) training pairs as whole pairs, "
                        "[CLS] a [SEP] b [SEP], instead of each question on its own "
                        f"{dflt('pairs')}")
    p.add_argument("--tasks", nargs="+", help=dflt("tasks"))
    p.add_argument("--max-length", type=int, help=dflt("max_length"))
    p.add_argument("--n-sentences", type=int,
                   help=f"sentences distilled on {dflt('n_sentences')}")
    p.add_argument("--holdout", type=int, help=dflt("holdout"))
    p.add_argument("--steps", type=int, help=f"steps per layer and head {dflt('steps')}")
    p.add_argument("--batch-size", type=int, help=dflt("batch_size"))
    p.add_argument("--rows", type=int, help=f"query rows per sequence (0: all) {dflt('rows')}")
    p.add_argument("--eta", type=float, help=dflt("eta"))
    p.add_argument("--eta-end", type=float, help=dflt("eta_end"))
    p.add_argument("--beta", type=float, help=f"0: infinity {dflt('beta')}")
    p.add_argument("--lam", type=float, help=f"Riesz repulsion strength {dflt('lam')}")
    p.add_argument("--output-weight", type=float, help=dflt("output_weight"))
    p.add_argument("--lr", type=float, help=f"Adam lr of the hedgehog baseline {dflt('lr')}")
    p.add_argument("--refine-steps", type=int,
                   help="steps of the joint refinement of all layers' particles against the "
                        f"teacher's sentence embeddings (0: none) {dflt('refine_steps')}")
    p.add_argument("--refine-sentences", type=int,
                   help=f"sentences the refinement fits on {dflt('refine_sentences')}")
    p.add_argument("--refine-eta", type=float, help=dflt("refine_eta"))
    p.add_argument("--refine-max-drift", type=float, help=dflt("refine_max_drift"))
    p.add_argument("--eval-sentences", type=int, help=dflt("eval_sentences"))
    p.add_argument("--probe-tasks", nargs="*", help=dflt("probe_tasks"))
    p.add_argument("--probe-train", type=int, help=dflt("probe_train"))
    p.add_argument("--probe-eval", type=int, help=dflt("probe_eval"))
    p.add_argument("--doc-lengths", type=int, nargs="+",
                   help="also measure the fidelity on held-out pseudo-documents of these token "
                        "lengths (RT test reviews concatenated; with --window, the teacher's "
                        f"attention mass inside the window too) {dflt('doc_lengths')}")
    p.add_argument("--doc-count", type=int, help=f"pseudo-documents per length {dflt('doc_count')}")
    p.add_argument("--fit-documents", type=int, metavar="L",
                   help="fit on documents of L tokens (the training texts concatenated, each "
                        "text in one document at most) instead of sentences; --n-sentences, "
                        "--holdout, --refine-sentences and --batch-size then count documents, "
                        "their defaults scaled to the sentences' tokens (128, 32, 512 and 8 at "
                        f"L = 512); at most the model's positions {dflt('fit_documents')}")
    p.add_argument("--no-eval", action="store_true", help="skip fidelity and probes")
    p.add_argument("--evaluate", action="store_true",
                   help="measure the finished conversion in --out again with the evaluation "
                        "flags given (--eval-sentences, --probe-*, --doc-*); nothing is trained")
    p.add_argument("--grid", type=int, nargs="+", default=None, metavar="M",
                   help="comparison over these M (with --seeds, --variants, --lams)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variants", nargs="+", default=["vanilla", "particles", "hedgehog"],
                   choices=VARIANTS)
    p.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.1],
                   help="repulsion strengths of the particles variant in the grid")
    p.add_argument("--speed", action="store_true", help="time forward passes (speed.json)")
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--layer-lengths", type=int, nargs="+",
                   default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--lora-rank", type=int, default=0,
                   help="low-rank finishing: LoRA rank on the Q/K/V/O projections (--lora-"
                        "targets), trained after the particles and merged (0: off)")
    p.add_argument("--lora-steps", type=int, help=dflt("lora_steps"))
    p.add_argument("--lora-lr", type=float, help=dflt("lora_lr"))
    p.add_argument("--lora-objective", choices=LORA_OBJECTIVES,
                   help="hidden states matched besides the embedding: embedding (none), "
                        "tokens (the last), layers (all) "
                        f"{dflt('lora_objective')}")
    p.add_argument("--lora-aux-weight", type=float,
                   help=f"weight of the hidden-state term {dflt('lora_aux_weight')}")
    p.add_argument("--lora-targets", nargs="+", choices=LORA_TARGETS, help=dflt("lora_targets"))
    p.add_argument("--lora-with-particles", action="store_true",
                   help="move the particles with the adapters (no separate refinement)")
    p.add_argument("--window", type=int,
                   help="sliding-window hybrid (LoLCATs eq. 7): softmax over the W/2 tokens on "
                        "each side plus the particles' linear term over the rest, the window "
                        "weight per head learned; W even, > 0, at most the model's positions "
                        f"(OUT/hf carries it) {dflt('window')}")
    p.add_argument("--window-alone", action="store_true",
                   help="with --window: the window softmax alone, no linear term (the "
                        "ablation of the linear branch)")
    add_threads(p)
    g = p.add_argument_group(
        "causal language models (--model)",
        "convert a llama-family decoder instead of an encoder: the hybrid --window W --sinks S "
        "(defaults 64 and 4) unless --linear-only; fitted on long documents (Shakespeare's "
        "train works under --data-dir, or --texts); --feature-map, --n-features, --seed, "
        "--steps, --holdout, --batch-size, --rows, --output-weight, --lam, --eta, --eta-end, "
        "--window, --window-alone apply too")
    g.add_argument("--model", default=None,
                   help="smollm2 (the packaged SmolLM2-135M-Instruct), a GGUF file or a Hugging "
                        "Face llama directory")
    g.add_argument("--sinks", type=int, default=None,
                   help="first tokens kept exact beside the window (default: 4)")
    g.add_argument("--linear-only", action="store_true",
                   help="pure linear attention: no window, no sinks")
    g.add_argument("--fixed", action="store_true",
                   help="the drawn features, not fitted (the fixed row)")
    g.add_argument("--method", choices=("langevin", "adam"), default=None,
                   help="langevin (the particles) or adam (plain Adam on the same parameters: "
                        "the ablation) (default: langevin)")
    g.add_argument("--fit-length", type=int, default=None,
                   help="tokens per training document (default: 1024)")
    g.add_argument("--docs", type=int, default=None,
                   help="training documents (default: 16)")
    g.add_argument("--texts", default=None,
                   help="your own long texts: a .jsonl(.gz) with a 'text' column or a text file")
    g.add_argument("--window-steps", type=int, default=None,
                   help="Adam steps of the window weights per layer (default: 100)")
    g.add_argument("--finish-steps", type=int, default=None,
                   help="end-to-end finishing after the transfer: particles, window weights "
                        "(and --lora-rank adapters) by Adam on the teacher's next-token "
                        "distribution; its own row in OUT/lowrank (default: 0, none)")
    g.add_argument("--finish-lr", type=float, default=None, help="(default: 0.01)")
    g.add_argument("--finish-length", type=int, default=None,
                   help="tokens per finishing document (default: 512)")
    g.add_argument("--finish-docs", type=int, default=None,
                   help="finish on this many documents spread round-robin over all the "
                        "training works (default: 0, the transfer's --docs documents)")
    g.add_argument("--finish-schedule", choices=("constant", "cosine"), default=None,
                   help="the finishing's learning rate: constant, or cosine from --finish-lr "
                        "to 0 (default: constant)")
    g.add_argument("--finish-clip", type=float, default=None,
                   help="clip the finishing's gradient norm (default: 0, no clipping)")
    add_progress(p)
    p.add_argument("--no-hf", action="store_true",
                   help="do not write OUT/hf (the Hugging Face / sentence-transformers directory)")
    p.add_argument("--force", action="store_true",
                   help="convert again although --out holds a finished conversion (without it "
                        "a finished --out is left as it is and the command exits 0; a killed "
                        "run resumes either way)")
