"""``coulomb-attention convert``: distil a pretrained encoder's attention into particles.

One conversion (default)::

    coulomb-attention convert --encoder minilm --feature-map favor --n-features 64 --seed 0 \\
        --data-dir ../shared/data --out runs/convert/favor64

writes ``OUT/checkpoint/`` (``nn.families.bert.load_pretrained_encoder(OUT/checkpoint)``),
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
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.registry import SAMPLE_WARNING
from ._args import apply_threads, note, progress_mode
from ._convert_flags import (  # noqa: F401  (re-exported: the tests read them)
    CONVERT_FLAGS,
    DISTILL_FLAGS,
    EVALUATION_FLAGS,
    HELP_DEFAULTS,
    LORA_FLAGS,
    LORA_OBJECTIVES,
    LORA_TARGETS,
    VARIANTS,
    add_arguments,
    dflt,
    evaluation_changes,
)

if TYPE_CHECKING:
    from ..convert import ConvertConfig
    from ..convert.finish import FinishConfig


def finish_from_args(args: argparse.Namespace) -> FinishConfig | None:
    """The finishing configuration of ``--lora-*`` (None with ``--lora-rank 0``)."""
    from ..convert.finish import FinishConfig

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
    from ..convert.distill import DistillConfig

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
    if conv["fit_documents"]:  # counts in documents: the sentence defaults scaled to them
        from ..convert.config import document_budget

        given = tuple(field for flag, field in DISTILL_FLAGS.items()
                      if getattr(args, flag) is not None)
        distill = document_budget(distill, conv["max_length"], conv["fit_documents"], given)
    return ConvertConfig(**conv, distill=distill, sentences_file=args.sentences,
                         finish=finish_from_args(args))


def run(args: argparse.Namespace) -> int:
    from ..convert import convert_encoder, speed_table
    from ..convert.artifact import Artifact
    from ..reports.convert import result_lines, write_convert_report

    apply_threads(args)
    args.progress = progress_mode(args) != "none"  # bars only on a terminal, else lines
    if args.model is not None:  # a causal language model
        from .convert_decoder import run_decoder

        return run_decoder(args)
    decoder_only = [f"--{k.replace('_', '-')}" for k in ("sinks", "linear_only", "fixed",
                                                         "method", "fit_length", "docs",
                                                         "texts", "window_steps",
                                                         "finish_steps", "finish_lr",
                                                         "finish_length", "finish_docs",
                                                         "finish_schedule", "finish_clip")
                    if getattr(args, k) not in (None, False)]
    if decoder_only:
        raise ValueError(f"{', '.join(decoder_only)} apply to --model (causal language "
                         "models), not to encoders")
    cfg = config_from_args(args)
    out = Path(args.out)
    art = Artifact(out)
    if args.force and (args.grid or args.evaluate):
        raise ValueError("--force converts again; it does not apply to --grid or --evaluate")
    if not args.grid and not args.evaluate and art.has_result() and not args.force \
            and not args.speed:
        print(f"{out} holds a finished conversion (result.json); nothing to do. --force "
              "converts again, --evaluate re-measures it.")
        return 0
    sample = _warn_sample(args)
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
    elif args.force or not args.speed or not art.has_result():
        if args.force:  # a forced run killed half-way must not pass for the finished one
            art.result_path.unlink(missing_ok=True)
        res = convert_encoder(cfg, out, data_dir=args.data_dir, progress=args.progress,
                              evaluate=not args.no_eval)
        print("\n".join(result_lines(res)))
        print(f"wrote {write_convert_report(out)}")
        if not args.no_hf and art.has_checkpoint():
            from ..export import export_hf_directory

            row = "hybrid" if cfg.window and cfg.window_linear else (
                "window alone" if cfg.window else "pure-linear")
            print(f"wrote {export_hf_directory(art.checkpoint, art.hf)} ({row} row)")
            if art.has_lowrank():  # the finished row: its own directory
                print(f"wrote {export_hf_directory(art.lowrank_checkpoint, art.lowrank_hf)} "
                      "(low-rank finished row)")
    if args.speed:
        from ..nn.families.bert import load_pretrained_encoder

        model = (load_pretrained_encoder(art.checkpoint) if art.has_checkpoint()
                 else load_pretrained_encoder(cfg.encoder, cfg.feature_map, cfg.n_features,
                                              share_features=False))
        teacher = load_pretrained_encoder(cfg.encoder, "softmax")
        rows = speed_table(model, teacher, args.lengths, args.layer_lengths)
        art.write_speed(rows)
        for r in rows:
            print(f"{r['what']} L={r['length']}: converted {r['converted_ms']:.1f} ms, "
                  f"softmax {r['softmax_ms']:.1f} ms")
    if sample:
        print(SAMPLE_WARNING, file=sys.stderr)
    return 0


def _warn_sample(args: argparse.Namespace) -> bool:
    """Say (as ``train`` does) when the sentences, probes or documents come from the shipped
    samples because no ``--data-dir`` / ``$COULOMB_DATA_DIR`` was given; also checks that a
    given data directory exists before anything is loaded."""
    from ..data.registry import data_source

    reads_tasks = not (args.sentences and args.no_eval) or args.evaluate or args.grid
    sample = data_source(args.data_dir)["source"] == "samples" and bool(reads_tasks)
    if sample:
        note(SAMPLE_WARNING, stream="stdout")  # with the first output: not before bad input
    return sample
