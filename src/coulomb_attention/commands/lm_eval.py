"""``coulomb-attention lm-eval``: a causal LM's rows on perplexity, passkey and repeated text.

Flags -> :class:`~coulomb_attention.studies.lm_eval.LmEvalConfig` ->
:func:`~coulomb_attention.studies.lm_eval.run_study` (``OUT/results.jsonl``, one line per row x
task x length x document or trial; a rerun, or a run killed mid-way, skips what is there) ->
:func:`~coulomb_attention.reports.lm_eval.write_report` (``OUT/report.md``, ``report.json``,
``loss_vs_position.png``, ``passkey.png``). ``--report-only`` remakes the report. docs/lm_eval.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._args import add_progress, add_threads, apply_threads, list_arg, progress_mode

__all__ = ["add_arguments", "run"]

# for --help only (the study imports torch): the study's defaults, checked by the tests
DEFAULT_ROWS = ("teacher", "streaming:64:4", "streaming:matched")
TASK_NAMES = ("ppl", "passkey", "repeat")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="the teacher: smollm2, a .gguf file or a model directory with "
                        "tokenizer.json (default: %(default)s)")
    list_arg(p, "--rows", help="rows: teacher, fixed:MAP (pure linear, untrained, M "
                               "features), fixed:MAP:W:S (hybrid), streaming:W:S (StreamingLLM), "
                               "streaming:matched (the window with the bytes of the hybrid "
                               "W=64 S=4), or a converted model's directory (default: "
                               f"{' '.join(DEFAULT_ROWS)}; the teacher is then skipped, with a "
                               "note, above its positions)")
    list_arg(p, "--tasks", choices=TASK_NAMES, help=f"(default: {' '.join(TASK_NAMES)})")
    list_arg(p, "--lengths", type=int, help="perplexity document lengths (default: 512 2048 "
                                            "8192)")
    list_arg(p, "--passkey-lengths", type=int,
             help="passkey total lengths (default: 1024 2048 4096 8192)")
    p.add_argument("--trials", type=int, default=None, help="passkey trials per length "
                                                            "(default: 20)")
    list_arg(p, "--depths", type=float, help="needle depths in [0, 1] (default: 0.1 ... 0.9)")
    p.add_argument("--repeat-length", type=int, default=None,
                   help="repeated-text passage length P (default: 256)")
    p.add_argument("--repeat-docs", type=int, default=None,
                   help="repeated-text passages (default: 20)")
    p.add_argument("--limit-docs", type=int, default=None,
                   help="at most N documents per length and N passages (quick runs; default: "
                        "all)")
    p.add_argument("--n-features", type=int, default=None,
                   help="M of the fixed rows and of the hybrid streaming:matched matches "
                        "(default: 64)")
    p.add_argument("--seed", type=int, default=None,
                   help="the fixed rows' features and the passkeys (default: 0)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="tokens decoded per passkey trial (default: 8)")
    p.add_argument("--chunk", type=int, default=None,
                   help="tokens per forward call (memory only; default: 512)")
    p.add_argument("--data-dir", default=None,
                   help="folder with shakespeare/test.jsonl.gz (e.g. ../shared/data); default: "
                        "the shipped sample (smoke tests only)")
    add_threads(p)
    p.add_argument("--out", default="runs/lm_eval",
                   help="output directory: results.jsonl, report.md, PNGs (default: "
                        "%(default)s)")
    p.add_argument("--report-only", action="store_true",
                   help="remake the report from OUT/results.jsonl; run nothing")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots")
    add_progress(p)


#: flag (dest) -> config field, for the flags that default to the config's value
_FIELDS = ("rows", "tasks", "lengths", "passkey_lengths", "trials", "depths", "repeat_length",
           "repeat_docs", "limit_docs", "n_features", "seed", "new_tokens", "chunk",
           "data_dir", "threads")


def build_config(args: argparse.Namespace):
    """The study's config from the flags (a flag left out takes the config's default; with the
    default rows a length above the teacher's positions is skipped with a note, with explicit
    rows it is an error)."""
    from ..studies.lm_eval import LmEvalConfig

    given = {f: getattr(args, f) for f in _FIELDS if getattr(args, f, None) is not None}
    return LmEvalConfig(model=args.model, skip_long_teacher=args.rows is None, **given)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    mode = progress_mode(args)
    if not args.report_only:
        from ..studies.lm_eval import run_study

        apply_threads(args)
        config = build_config(args)
        results = run_study(config, out, progress=mode != "none",
                            log=lambda s: print(s, flush=True))
        print(f"results: {results}")
    from ..reports.lm_eval import write_report

    for path in write_report(out, plots=not args.no_plots):
        print(f"wrote {path}")
    return 0
