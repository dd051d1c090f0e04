"""``coulomb-attention convert --model smollm2|PATH``: a causal language model's attention
distilled into particles (:mod:`coulomb_attention.convert.decoder`).

::

    coulomb-attention convert --model smollm2 --data-dir ../shared/data --out runs/smollm2

writes ``OUT/checkpoint/`` (a Hugging Face llama directory holding the particles,
``nn.families.llama.from_pretrained``), ``OUT/records.jsonl`` and ``OUT/result.json``; a killed
run resumes at its next layer; a finished one is left as it is unless ``--force``.
"""

from __future__ import annotations

import argparse

#: flags of the encoder conversion that mean nothing for a decoder
ENCODER_ONLY = ("encoder", "variant", "tasks", "max_length", "n_sentences", "refine_steps",
                "refine_sentences", "refine_eta", "refine_max_drift", "eval_sentences",
                "probe_tasks", "probe_train", "probe_eval", "doc_lengths", "doc_count",
                "fit_documents",
                "sentences", "pairs", "grid", "lora_steps", "lora_lr", "lora_objective",
                "lora_aux_weight", "lora_targets")
#: flag (dest) -> DecoderConfig field
DECODER_FLAGS = {"model": "model", "feature_map": "feature_map", "n_features": "n_features",
                 "seed": "seed", "window": "window", "sinks": "sinks", "method": "method",
                 "fit_length": "fit_length", "docs": "n_docs", "holdout": "holdout",
                 "rows": "rows_per_sequence", "batch_size": "batch_size", "steps": "steps",
                 "output_weight": "output_weight", "window_steps": "window_steps",
                 "lam": "lam", "eta": "eta", "eta_end": "eta_end",
                 "finish_steps": "finish_steps", "finish_lr": "finish_lr",
                 "finish_length": "finish_length", "lora_rank": "lora_rank",
                 "finish_docs": "finish_docs", "finish_schedule": "finish_schedule",
                 "finish_clip": "finish_clip"}


def decoder_config_from_args(args: argparse.Namespace):
    """The decoder conversion the flags describe (a flag not given takes the default)."""
    from ..convert.decoder import DecoderConfig

    given = [f"--{k.replace('_', '-')}" for k in ENCODER_ONLY
             if getattr(args, k, None) not in (None, False, [])]
    if given:
        raise ValueError(f"{', '.join(given)} apply to encoders, not to --model")
    if args.window is not None and args.window <= 0:
        raise ValueError(f"--window must be > 0, got {args.window} (--linear-only: no window)")
    if args.sinks is not None and args.sinks < 0:
        raise ValueError(f"--sinks must be >= 0, got {args.sinks}")
    if args.linear_only and (args.window is not None or args.sinks or args.window_alone):
        raise ValueError("--linear-only takes no --window, --sinks or --window-alone")
    kw = {field: getattr(args, flag) for flag, field in DECODER_FLAGS.items()
          if getattr(args, flag, None) is not None}
    if args.linear_only:
        kw["window"], kw["sinks"] = 0, 0
    return DecoderConfig(**kw, linear=not args.window_alone, learned=not args.fixed)


def run_decoder(args: argparse.Namespace) -> int:
    from ..convert.decoder import convert_decoder
    cfg = decoder_config_from_args(args)
    print(f"converting {cfg.model}: {cfg.row}", flush=True)
    res = convert_decoder(cfg, args.out, data_dir=args.data_dir, texts=args.texts,
                          progress=args.progress, force=args.force)
    kl = res.get("row_kl_after")
    print(f"row: {res['row']}; data: {res['data']}")
    if kl is not None:
        print(f"mean row KL over layers and KV groups: {res['row_kl_before']:.4f} -> {kl:.4f} "
              f"(held-out {res['holdout_row_kl_after']:.4f}); fit {res['time_s']['fit']:.0f} s")
    if not args.no_hf:
        from ..convert.artifact import Artifact
        from ..convert.decoder import load_converted
        from ..export.llama_hf import export_llama

        art = Artifact(args.out)
        model, tok = load_converted(art.root)
        hf = export_llama(model, tok, art.hf, res["row"],
                          learned=cfg.learned and cfg.linear, base_model=cfg.model)
        print(f"wrote {hf} (AutoModelForCausalLM, trust_remote_code=True; row: {res['row']})")
        if res.get("finished"):
            model, tok = load_converted(art.lowrank_checkpoint)
            row = f"{res['row']}, finished end to end (LoRA rank {cfg.lora_rank})"
            hf = export_llama(model, tok, art.lowrank_hf, row, learned=True,
                              base_model=cfg.model)
            print(f"wrote {hf} (the finished row)")
    print(f"wrote {args.out}")
    return 0
