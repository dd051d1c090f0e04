"""``coulomb-attention convert``: distil a pretrained encoder's attention into particles.

One conversion (default)::

    coulomb-attention convert --encoder minilm --feature-map favor --n-features 64 --seed 0 \\
        --data-dir ../shared/data --out runs/convert/favor64

writes ``OUT/checkpoint/`` (``nn.pretrained.load_pretrained_encoder(OUT/checkpoint)``),
``OUT/records.jsonl``, ``OUT/result.json``, ``OUT/report.md`` and plots; an interrupted run
resumes at its last finished layer. ``--grid M [M ...]`` runs the comparison over M, seeds and
variants into ``OUT/grid/`` (finished runs reused) and writes ``OUT/grid.md``; ``--speed``
times the converted encoder against the softmax one (``OUT/speed.json``). ``--lora-rank R``
adds the low-rank finishing (``OUT/lowrank/checkpoint/``, its own row in ``result.json``). One
run also writes ``OUT/hf/``, a Hugging Face / sentence-transformers directory of the
pure-linear (or, with ``--window``, the hybrid) row, and with ``--lora-rank`` ``OUT/lowrank/hf/``
of the finished row, each card naming its row (``--no-hf``: none).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ._args import add_progress, progress_mode
from ._convert_flags import (  # noqa: F401  (re-exported: the tests read them)
    CONVERT_FLAGS,
    DISTILL_FLAGS,
    EVALUATION_FLAGS,
    HELP_DEFAULTS,
    LORA_FLAGS,
    LORA_OBJECTIVES,
    LORA_TARGETS,
    VARIANTS,
    dflt,
    evaluation_changes,
)

if TYPE_CHECKING:
    from ..convert import ConvertConfig
    from ..train.finish import FinishConfig


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
    p.add_argument("--threads", type=int, default=1)
    add_progress(p)
    p.add_argument("--no-hf", action="store_true",
                   help="do not write OUT/hf (the Hugging Face / sentence-transformers directory)")


def finish_from_args(args: argparse.Namespace) -> FinishConfig | None:
    """The finishing configuration of ``--lora-*`` (None with ``--lora-rank 0``)."""
    from ..train.finish import FinishConfig

    rank = args.lora_rank
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"--lora-rank must be an integer >= 0, got {rank!r}")
    given = [f"--{k.replace('_', '-')}" for k in (*LORA_FLAGS, "lora_with_particles")
             if getattr(args, k) not in (None, False)]
    if rank == 0:
        if given:
            raise ValueError(f"{', '.join(given)} needs --lora-rank > 0")
        return None
    over = {field: getattr(args, flag) for flag, field in LORA_FLAGS.items()
            if getattr(args, flag) is not None}
    return FinishConfig(rank=rank, with_particles=args.lora_with_particles, **over)


def config_from_args(args: argparse.Namespace) -> ConvertConfig:
    """The conversion the flags describe: a flag not given takes its config's default."""
    from ..convert import ConvertConfig
    from ..train.distill import DistillConfig

    c, d = ConvertConfig(), DistillConfig()
    dist = {field: getattr(d, field) if getattr(args, flag) is None else getattr(args, flag)
            for flag, field in DISTILL_FLAGS.items()}
    conv = {field: getattr(c, field) if getattr(args, flag) is None else getattr(args, flag)
            for flag, field in CONVERT_FLAGS.items()}
    conv["tasks"], conv["probe_tasks"] = tuple(conv["tasks"]), tuple(conv["probe_tasks"])
    if args.window is not None and args.window <= 0:
        raise ValueError(f"--window must be > 0, got {args.window}")
    if args.window_alone and args.window is None:
        raise ValueError("--window-alone needs --window W")
    conv["window_linear"] = not args.window_alone
    distill = DistillConfig(**dist, refine_eta_end=dist["refine_eta"] / 10)
    return ConvertConfig(**conv, distill=distill, sentences_file=args.sentences,
                         finish=finish_from_args(args))


def run(args: argparse.Namespace) -> int:
    import torch

    from ..convert import convert_encoder, speed_table
    from ..reports.convert import result_lines, write_convert_report

    torch.set_num_threads(max(1, args.threads))
    args.progress = progress_mode(args) != "none"  # bars only on a terminal, else lines
    cfg = config_from_args(args)
    out = Path(args.out)
    if args.grid:
        if cfg.finish is not None:
            raise ValueError("--lora-rank applies to one conversion, not to --grid")
        from ..studies.convert_grid import run_convert_grid

        run_convert_grid(cfg, args.grid, args.seeds, args.variants, args.lams, out,
                         data_dir=args.data_dir, progress=args.progress)
    elif args.evaluate:
        from ..convert import evaluate_conversion

        res = evaluate_conversion(out, evaluation_changes(args), data_dir=args.data_dir)
        print("\n".join(result_lines(res)))
        print(f"wrote {write_convert_report(out)}")
    elif not args.speed or not (out / "result.json").is_file():
        res = convert_encoder(cfg, out, data_dir=args.data_dir, progress=args.progress,
                              evaluate=not args.no_eval)
        print("\n".join(result_lines(res)))
        print(f"wrote {write_convert_report(out)}")
        if not args.no_hf and (out / "checkpoint").is_dir():
            from ..export import export_hf_directory

            row = "hybrid" if cfg.window and cfg.window_linear else (
                "window alone" if cfg.window else "pure-linear")
            print(f"wrote {export_hf_directory(out / 'checkpoint', out / 'hf')} ({row} row)")
            low = out / "lowrank"
            if (low / "checkpoint").is_dir():  # the finished row: its own directory
                print(f"wrote {export_hf_directory(low / 'checkpoint', low / 'hf')} "
                      "(low-rank finished row)")
    if args.speed:
        from ..nn.pretrained import load_pretrained_encoder

        ckpt = out / "checkpoint"
        model = (load_pretrained_encoder(ckpt) if ckpt.is_dir() else load_pretrained_encoder(
            cfg.encoder, cfg.feature_map, cfg.n_features, share_features=False))
        teacher = load_pretrained_encoder(cfg.encoder, "softmax")
        rows = speed_table(model, teacher, args.lengths, args.layer_lengths)
        (out / "speed.json").write_text(json.dumps(rows, indent=2))
        for r in rows:
            print(f"{r['what']} L={r['length']}: converted {r['converted_ms']:.1f} ms, "
                  f"softmax {r['softmax_ms']:.1f} ms")
    return 0
