"""Sentences per second of a converted encoder (Hugging Face export) against the original.

The converted encoder is loaded the way a user loads it, ``transformers.AutoModel`` with
``trust_remote_code=True`` from the directory written by
:func:`coulomb_attention.export.export_hf_directory`, and pooled as sentence-transformers does
(masked mean, L2 normalisation); the original is loaded by ``sentence_transformers`` (its
Transformer -> Pooling -> Normalize modules, the softmax attention of ``transformers``). Both
embed the same random token ids, every sentence exactly ``L`` tokens, tokenisation excluded.
Repeats are interleaved (converted, original, converted, ...) so load changes hit both alike;
each row reports the median.

:func:`random_encoder_speed` times the same two architectures with random weights, built from
configurations (no checkpoint, no ``sentence-transformers``): the original as
``transformers.BertModel`` with SDPA attention, the converted from the remote code
(``modeling_coulomb_bert.py`` of an export, or this package's copy) with the original's weights
and Gaussian particles, both mean-pooled and normalised as above. Speed does not depend on the
weights, so this runs on a machine without the pretrained encoder (a GPU box), in float32,
bfloat16 or float16, and with a position table enlarged past the pretrained 512 positions
(``max_positions``): legitimate only because the weights are random anyway.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._validation import check_positive

__all__ = ["DEFAULT_LENGTHS", "DTYPES", "encoder_speed", "random_encoder_speed",
           "speed_csv", "speed_markdown_rows"]

DEFAULT_LENGTHS = (32, 64, 128, 256, 512)
#: ``--dtype`` names of :func:`random_encoder_speed`.
DTYPES = ("float32", "bfloat16", "float16")
_EXPORT_DIR = Path(__file__).resolve().parent.parent / "export"


def _timed(fn, sync) -> tuple[float, float]:
    """(wall, process CPU) seconds of one synchronised call."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - t0, time.process_time() - c0


def _interleaved(run_converted, run_original, repeats: int, sync) -> dict[str, Any]:
    """``repeats`` interleaved timings (converted, original, converted, ...) and their
    summaries: ``converted_s``, ``original_s`` (wall), ``*_cpu_s`` (process CPU time);
    ``paired_ratio`` the median over repeats of original / converted wall time of neighbouring
    calls (robust to load that drifts between repeats), ``cpu_ratio`` the ratio of median CPU
    times (robust to time-slicing by other processes at one thread)."""
    tc, to = [], []
    for _ in range(repeats):
        tc.append(_timed(run_converted, sync))
        to.append(_timed(run_original, sync))
    med = statistics.median
    return {"converted_s": [w for w, _ in tc], "original_s": [w for w, _ in to],
            "converted_cpu_s": [c for _, c in tc], "original_cpu_s": [c for _, c in to],
            "paired_ratio": med([o[0] / c[0] for c, o in zip(tc, to, strict=True)]),
            "cpu_ratio": med([c for _, c in to]) / max(med([c for _, c in tc]), 1e-12)}


def _speed_row(length: int, batch: int, times: dict[str, Any]) -> dict[str, Any]:
    return {"length": int(length),
            "converted_sps": batch / statistics.median(times["converted_s"]),
            "original_sps": batch / statistics.median(times["original_s"]), **times}


def encoder_speed(
    hf_dir: str | os.PathLike,
    original: str | os.PathLike = "minilm",
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    batch_size: int = 32,
    repeats: int = 3,
    device: str = "cpu",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Time ``repeats`` batches of ``batch_size`` sentences of each length through both models.

    Parameters
    ----------
    hf_dir : path
        A Hugging Face export of a converted encoder.
    original : str or path
        ``minilm`` (the packaged all-MiniLM-L6-v2) or a sentence-transformers directory.
    lengths : sequence of int
        Tokens per sentence (at most the position table of both models).
    batch_size, repeats : int
    device : str
        ``cpu`` or ``cuda``.
    seed : int
        Draws the token ids.

    Returns
    -------
    list of dict
        One row per length: ``length``, ``converted_sps``, ``original_sps`` (sentences per
        second, median batch time), ``converted_s``, ``original_s`` (every batch time),
        ``converted_cpu_s``, ``original_cpu_s``, ``paired_ratio``, ``cpu_ratio`` (see
        :func:`_interleaved`), ``batch_size``, ``repeats``, ``threads``, ``device``.
    """
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from ..nn.families.bert import resolve_checkpoint_dir

    batch_size = check_positive("batch_size", batch_size, integer=True)
    repeats = check_positive("repeats", repeats, integer=True)
    lengths = [check_positive("length", L, integer=True) for L in lengths]
    conv = AutoModel.from_pretrained(str(hf_dir), trust_remote_code=True).eval().to(device)
    st = SentenceTransformer(str(resolve_checkpoint_dir(original)), device=device).eval()
    limit = min(int(conv.config.max_position_embeddings),
                int(st[0].auto_model.config.max_position_embeddings))
    too_long = [L for L in lengths if L > limit]
    if too_long:
        raise ValueError(f"lengths {too_long} exceed the position table ({limit})")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(conv.config.vocab_size)
    rows = []
    for L in lengths:
        ids = torch.randint(min(1000, vocab // 2), vocab, (batch_size, L), generator=gen)
        ids = ids.to(device)
        mask = torch.ones_like(ids)
        types = torch.zeros_like(ids)

        @torch.inference_mode()
        def run_converted(ids=ids, mask=mask):
            h = conv(input_ids=ids, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)

        @torch.inference_mode()
        def run_original(ids=ids, mask=mask, types=types):
            return st.forward({"input_ids": ids, "attention_mask": mask,
                               "token_type_ids": types})["sentence_embedding"]

        run_converted(), run_original()  # warm-up
        sync()
        times = _interleaved(run_converted, run_original, repeats, sync)
        rows.append({**_speed_row(L, batch_size, times), "batch_size": batch_size,
                     "repeats": repeats, "threads": torch.get_num_threads(), "device": device})
    return rows


# ---------------------------------------------------------------------------- random weights


def load_remote_code(code_dir: str | os.PathLike | None = None) -> tuple[type, type]:
    """``(CoulombBertConfig, CoulombBertModel)`` of the remote code in ``code_dir`` (an export
    directory; default: this package's copy), imported by path as a throw-away package, so
    neither ``trust_remote_code`` nor the Hugging Face module cache is involved."""
    import importlib

    code_dir = Path(code_dir) if code_dir is not None else _EXPORT_DIR
    if not (code_dir / "modeling_coulomb_bert.py").is_file():
        raise FileNotFoundError(f"{code_dir}: no modeling_coulomb_bert.py (not an export)")
    name = f"_coulomb_remote_{abs(hash(str(code_dir.resolve())))}"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(code_dir)]
        sys.modules[name] = pkg
    modeling = importlib.import_module(f"{name}.modeling_coulomb_bert")
    return modeling.CoulombBertConfig, modeling.CoulombBertModel


def _pooled(h, mask):
    """Masked mean over tokens, L2-normalised (sentence-transformers' pooling): (B, D)."""
    import torch

    m = mask.unsqueeze(-1).to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def random_models(hf_dir: str | os.PathLike | None = None, *, max_positions: int | None = None,
                  n_features: int | None = None, seed: int = 0, window: int | None = None):
    """``(converted, original)`` with random weights, in float32 on the CPU.

    ``original``: ``transformers.BertModel`` (no pooler, SDPA attention) with the shapes of
    ``hf_dir/config.json`` (default: the remote code's defaults, all-MiniLM-L6-v2's shapes and
    FAVOR+ with M = 64 per head); ``converted``: the remote code's model with the same
    weights and particles drawn from N(0, I). ``max_positions`` replaces the position table's
    size in both; ``n_features`` the particle count M; ``window`` makes the converted model
    the sliding-window hybrid with this W (window weights 0.1; default ``hf_dir``'s).
    """
    import json

    import torch
    import transformers

    config_cls, model_cls = load_remote_code(hf_dir)
    fields: dict[str, Any] = {}
    if hf_dir is not None:
        fields = json.loads((Path(hf_dir) / "config.json").read_text(encoding="utf-8"))
        fields = {k: v for k, v in fields.items()
                  if k not in ("auto_map", "architectures", "model_type", "_name_or_path",
                               "transformers_version")}
    if max_positions is not None:
        fields["max_position_embeddings"] = check_positive("max_positions", max_positions,
                                                           integer=True)
    if n_features is not None:
        fields["n_features"] = check_positive("n_features", n_features, integer=True)
    if window is not None:
        fields["window"] = check_positive("window", window, integer=True)
    cfg = config_cls(**fields)
    torch.manual_seed(seed)  # transformers initialises from torch's global generator
    bert_cfg = transformers.BertConfig(
        **{k: getattr(cfg, k) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
            "layer_norm_eps", "pad_token_id")})
    bert_cfg._attn_implementation = "sdpa"
    original = transformers.BertModel(bert_cfg, add_pooling_layer=False).eval()
    converted = model_cls(cfg).eval()
    missing, unexpected = converted.load_state_dict(original.state_dict(), strict=False)
    assert not unexpected and all(k.endswith((".omega", ".window_logit")) for k in missing), (
        missing, unexpected)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in converted.encoder.layer:
            om = layer.attention.self.omega
            om.copy_(torch.randn(om.shape, generator=gen))
            if getattr(layer.attention.self, "window", 0):
                layer.attention.self.window_logit.fill_(-2.2)  # sigmoid: 0.1
    return converted, original


def use_fused_attention_(model) -> int:
    """Route every self-attention of a remote-code model (:func:`random_models`' converted
    encoder) through :func:`coulomb_attention.nn.ops.triton_linear.fused_kernel_attention`
    (an instance attribute ``forward``; the module and its weights are unchanged): the heads
    are strided views of the token-major projections, queries and keys scaled by
    ``head_dim**-0.25`` as in the remote code. Returns the number of layers switched."""
    from ..nn.ops.triton_linear import fused_kernel_attention

    n = 0
    for layer in model.encoder.layer:
        sa = layer.attention.self

        def forward(x, key_mask, sa=sa):
            B, T, _ = x.shape
            H, dh = sa.heads, sa.head_dim
            s = dh ** -0.25

            def split(t):  # (B, H, T, dh), a view of (B, T, H dh)
                return t.view(B, T, H, dh).transpose(1, 2)

            out = fused_kernel_attention(split(sa.query(x) * s), split(sa.key(x) * s),
                                         split(sa.value(x)), sa.omega, sa.feature_map, key_mask)
            return out.transpose(1, 2).reshape(B, T, H * dh)

        sa.forward = forward
        n += 1
    return n


def _is_oom(exc: BaseException) -> bool:
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, oom) or (isinstance(exc, RuntimeError) and
                                    "out of memory" in str(exc).lower())


def random_encoder_speed(
    lengths: Sequence[int],
    hf_dir: str | os.PathLike | None = None,
    *,
    batch_size: int = 32,
    repeats: int = 3,
    device: str = "cpu",
    dtype: str = "float32",
    max_positions: int | None = None,
    n_features: int | None = None,
    seed: int = 0,
    window: int | None = None,
    fused: bool = False,
) -> list[dict[str, Any]]:
    """Sentences per second of the converted and the original architecture with random
    weights (:func:`random_models`), ``repeats`` interleaved batches per length after a
    warm-up, under ``torch.inference_mode``, CUDA synchronised around every batch.

    ``fused``: the converted encoder's attention through the fused Triton kernels
    (:func:`use_fused_attention_`; CUDA tensors, or the interpreter).

    A length that runs out of device memory is retried at half the batch (down to 1); each
    row states the batch it ran at (``batch_size``) and the one asked for
    (``batch_size_asked``).

    Returns
    -------
    list of dict
        The rows of :func:`encoder_speed` plus ``dtype``, ``max_positions``, ``n_features``,
        ``random_init`` (True), ``fused`` and ``batch_size_asked``.
    """
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    batch_size = check_positive("batch_size", batch_size, integer=True)
    repeats = check_positive("repeats", repeats, integer=True)
    lengths = [check_positive("length", L, integer=True) for L in lengths]
    if not lengths:
        raise ValueError("lengths must not be empty")
    if max_positions is None:
        max_positions = max(512, max(lengths))
    conv, orig = random_models(hf_dir, max_positions=max_positions, n_features=n_features,
                               seed=seed, window=window)
    limit = int(conv.config.max_position_embeddings)
    too_long = [L for L in lengths if L > limit]
    if too_long:
        raise ValueError(f"lengths {too_long} exceed the position table ({limit}); raise "
                         f"max_positions")
    tdtype = getattr(torch, dtype)
    conv = conv.to(device=device, dtype=tdtype)
    orig = orig.to(device=device, dtype=tdtype)
    if fused:
        if getattr(conv.config, "window", 0):
            raise ValueError("--fused covers the pure linear encoder, not the window hybrid "
                             "(its softmax window has no fused kernel)")
        use_fused_attention_(conv)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator().manual_seed(seed)
    vocab = int(conv.config.vocab_size)
    rows = []
    for L in lengths:
        batch = batch_size
        while True:
            try:
                times = _time_pair(conv, orig, L, batch, repeats, vocab, gen, device, sync)
                break
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is retried
                if not _is_oom(exc) or batch == 1:
                    raise
                if cuda:
                    torch.cuda.empty_cache()
                batch //= 2
        rows.append({**_speed_row(L, batch, times), "batch_size": batch,
                     "batch_size_asked": batch_size,
                     "repeats": repeats, "threads": torch.get_num_threads(), "device": device,
                     "dtype": dtype, "max_positions": limit,
                     "n_features": int(conv.config.n_features),
                     "feature_map": conv.config.feature_map, "random_init": True,
                     "window": int(getattr(conv.config, "window", 0) or 0),
                     "fused": bool(fused)})
    return rows


def _time_pair(conv, orig, L, batch, repeats, vocab, gen, device, sync):
    """:func:`_interleaved` timings of both models on one random batch after a warm-up."""
    import torch

    ids = torch.randint(min(1000, vocab // 2), vocab, (batch, L), generator=gen).to(device)
    mask = torch.ones_like(ids)
    types_ = torch.zeros_like(ids)

    @torch.inference_mode()
    def run_converted():
        return _pooled(conv(input_ids=ids, attention_mask=mask).last_hidden_state, mask)

    @torch.inference_mode()
    def run_original():
        return _pooled(orig(input_ids=ids, attention_mask=mask,
                            token_type_ids=types_).last_hidden_state, mask)

    run_converted(), run_original()  # warm-up
    sync()
    return _interleaved(run_converted, run_original, repeats, sync)


def speed_markdown_rows(rows: list[dict[str, Any]]) -> list[str]:
    """Speed rows as a Markdown table with batch, dtype and the three ratios converted /
    original: of the median times, ``paired`` (median over neighbouring calls) and of the
    median CPU times."""
    lines = ["| tokens | batch | dtype | converted (sent/s) | original (sent/s) | "
             "converted / original | paired | CPU time |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['length']} | {r['batch_size']} | {r.get('dtype', 'float32')} | "
                     f"{r['converted_sps']:.1f} | {r['original_sps']:.1f} | "
                     f"{r['converted_sps'] / r['original_sps']:.2f} | "
                     f"{r.get('paired_ratio', float('nan')):.2f} | "
                     f"{r.get('cpu_ratio', float('nan')):.2f} |")
    return lines


def speed_csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV (one line per length; the per-batch times left out)."""
    cols = ["length", "batch_size", "dtype", "device", "threads", "repeats", "converted_sps",
            "original_sps", "ratio", "paired_ratio", "cpu_ratio"]
    lines = [",".join(cols)]
    for r in rows:
        vals = {"paired_ratio": math.nan, "cpu_ratio": math.nan, **r,
                "dtype": r.get("dtype", "float32"),
                "ratio": r["converted_sps"] / r["original_sps"]}
        lines.append(",".join(f"{vals[c]:.4f}" if isinstance(vals[c], float) else str(vals[c])
                              for c in cols))
    return "\n".join(lines) + "\n"
