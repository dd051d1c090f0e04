"""Low-rank adapters (LoRA, Hu et al. 2021) on the linear maps of the project's encoder.

A :class:`LoRALinear` wraps a frozen :class:`torch.nn.Linear` ``W (out, in)``, ``b (out,)``:

    y = x W^T + b + (alpha / r) (x A^T) B^T          A (r, in), B (out, r)

``A`` starts small and random (``N(0, 1/in)`` from a ``torch.Generator``), ``B`` at zero, so an
adapter leaves the model unchanged until trained; :func:`merge_lora_` folds ``(alpha / r) B A``
into ``W`` and puts plain ``nn.Linear`` modules back, leaving an encoder of the original size
and class (a converted checkpoint like any other).

Targets: the attention projections ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` of every
layer (:data:`LORA_TARGETS`, the default) and the feed-forward maps ``fc1`` ``(F, D)`` and
``fc2`` ``(D, F)`` of every block's MLP (:data:`FFN_TARGETS`); :data:`LORA_SITES` says which
module of a block holds each name.

The project's encoder (:class:`~coulomb_attention.nn.families.bert.PretrainedClassifier`, its
attention :class:`~coulomb_attention.nn.attention.KernelAttention` with ``q_proj``, ``k_proj``,
``v_proj``, ``out_proj``) is not a ``transformers`` model, so ``peft`` does not apply to it
directly; this module is the few lines of LoRA it needs. It is used by the low-rank finishing
stage of a conversion (:mod:`coulomb_attention.convert.finish`), a practical option reported
apart from the pure-linear conversion (where only the particles are learned).

Adapters are saved as safetensors (``A``/``B`` per projection) + JSON metadata (rank, alpha,
targets) by :func:`save_lora` and checked (names, shapes, finiteness) by :func:`load_lora_`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

__all__ = [
    "ALL_TARGETS",
    "FFN_TARGETS",
    "LORA_SITES",
    "LORA_TARGETS",
    "LoRALinear",
    "add_lora_",
    "count_lora_parameters",
    "load_lora_",
    "lora_modules",
    "lora_parameters",
    "merge_lora_",
    "save_lora",
]

#: Projections of a :class:`KernelAttention` that can carry an adapter (the default targets).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")
#: Linear maps of a block's feed-forward :class:`~coulomb_attention.nn.model.MLP`.
FFN_TARGETS = ("fc1", "fc2")
ALL_TARGETS = LORA_TARGETS + FFN_TARGETS


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "attention_layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no attention_layers (expected the "
                        "project's encoder, e.g. PretrainedClassifier)")
    return list(layers)


def _mlps(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "mlp") for b in blocks):
        raise TypeError(f"{type(model).__name__} has no blocks with an mlp (expected the "
                        "project's encoder, e.g. PretrainedClassifier)")
    return [b.mlp for b in blocks]


#: target name -> the modules holding it, one per layer (``model -> list``)
LORA_SITES = {**{t: _attention_layers for t in LORA_TARGETS}, **{t: _mlps for t in FFN_TARGETS}}


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) (x A^T) B^T`` with ``base`` frozen.

    Parameters
    ----------
    base : nn.Linear        ``(out, in)``; its parameters are frozen (``requires_grad=False``)
    rank : int              ``1 <= rank <= min(in, out)``
    alpha : float           scaling numerator (default ``rank``: scaling 1)
    generator : torch.Generator, optional   draws ``A``

    Attributes
    ----------
    lora_a : Parameter (rank, in)   ``N(0, 1/in)``
    lora_b : Parameter (out, rank)  zeros
    scaling : float                 ``alpha / rank``
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA wraps an nn.Linear, got {type(base).__name__}")
        out_f, in_f = base.weight.shape
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(in_f,
                                                                                        out_f):
            raise ValueError(f"rank must be an integer in [1, {min(in_f, out_f)}] for a "
                             f"({out_f}, {in_f}) projection, got {rank!r}")
        alpha = float(rank if alpha is None else alpha)
        if not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
        self.base = base.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        w = base.weight
        a = torch.randn(rank, in_f, generator=generator, dtype=torch.float32) / math.sqrt(in_f)
        self.lora_a = nn.Parameter(a.to(w.device, w.dtype))
        self.lora_b = nn.Parameter(torch.zeros(out_f, rank, device=w.device, dtype=w.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (..., in) -> (..., out)``."""
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """``(alpha / rank) B A`` ``(out, in)``."""
        return (self.lora_b @ self.lora_a) * self.scaling

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with weight ``W + (alpha / rank) B A`` (the base's bias)."""
        for name, t in (("lora_a", self.lora_a), ("lora_b", self.lora_b)):
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"cannot merge a LoRA adapter whose {name} is not finite")
        out_f, in_f = self.base.weight.shape
        lin = nn.Linear(in_f, out_f, bias=self.base.bias is not None,
                        device=self.base.weight.device, dtype=self.base.weight.dtype)
        lin.weight.copy_(self.base.weight + self.delta_weight())
        if self.base.bias is not None:
            lin.bias.copy_(self.base.bias)
        return lin.requires_grad_(self.base.weight.requires_grad)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def add_lora_(model: nn.Module, rank: int, *, alpha: float | None = None,
              targets: Sequence[str] = LORA_TARGETS,
              generator: torch.Generator | None = None) -> list[LoRALinear]:
    """Freeze every parameter of ``model`` and put a :class:`LoRALinear` on the ``targets``
    maps of every layer (names from :data:`ALL_TARGETS`; in layer order, then ``targets``
    order, each ``A`` drawn from ``generator``). A projection shared by two names (``tie_qk``)
    gets one adapter. Only the adapters' ``A`` and ``B`` are then trainable (the particles are
    buffers).

    Returns the adapters. ``rank`` outside ``[1, width]`` raises ``ValueError``.
    """
    targets = tuple(targets)
    bad = [t for t in targets if t not in LORA_SITES]
    if bad or not targets or len(set(targets)) != len(targets):
        raise ValueError(f"LoRA targets must be distinct names among {', '.join(ALL_TARGETS)},"
                         f" got {targets!r}")
    owners = {t: LORA_SITES[t](model) for t in targets}  # (name -> one module per layer)
    if lora_modules(model):
        raise ValueError("the model already carries LoRA adapters (merge them first)")
    width = min(min(getattr(o, t).weight.shape) for t in targets for o in owners[t])
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= width:
        raise ValueError(f"LoRA rank must be an integer in [1, {width}] (the projections' "
                         f"width), got {rank!r}")
    model.requires_grad_(False)
    adapters = []
    for li in range(len(owners[targets[0]])):
        done: dict[int, LoRALinear] = {}
        for t in targets:
            owner = owners[t][li]
            base = getattr(owner, t)
            if id(base) not in done:
                done[id(base)] = LoRALinear(base, rank, alpha, generator)
                adapters.append(done[id(base)])
            setattr(owner, t, done[id(base)])
    return adapters


def lora_modules(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    """``(qualified name, adapter)`` of every :class:`LoRALinear` in ``model``, each once."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapters' ``A`` and ``B`` (what the finishing stage trains)."""
    return [p for _, m in lora_modules(model) for p in (m.lora_a, m.lora_b)]


def count_lora_parameters(model: nn.Module) -> int:
    """Trained parameters of the adapters: ``rank (in + out)`` per adapted projection."""
    return sum(p.numel() for p in lora_parameters(model))


@torch.no_grad()
def merge_lora_(model: nn.Module) -> nn.Module:
    """Fold every adapter into its map's weight, in place; returns ``model`` (same class, the
    original parameter names and shapes). A non-finite adapter raises ``ValueError``."""
    for site in dict.fromkeys(LORA_SITES.values()):
        try:
            owners = site(model)
        except TypeError:  # a model without these sites (a decoder's MLP names differ)
            continue
        for owner in owners:
            done: dict[int, nn.Linear] = {}
            for t in (n for n, s in LORA_SITES.items() if s is site):
                mod = getattr(owner, t, None)
                if isinstance(mod, LoRALinear):
                    if id(mod) not in done:
                        done[id(mod)] = mod.merged()
                    setattr(owner, t, done[id(mod)])
    if lora_modules(model):
        raise ValueError("LoRA adapters outside the known targets cannot be merged")
    return model


def save_lora(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write the adapters' ``A``/``B`` (``<name>.lora_a``, ``<name>.lora_b``) to a safetensors
    file with the rank, alpha and adapted names as JSON metadata."""
    from ..results import save_tensors

    mods = lora_modules(model)
    if not mods:
        raise ValueError("the model carries no LoRA adapters to save")
    tensors = {}
    for name, m in mods:
        tensors[f"{name}.lora_a"], tensors[f"{name}.lora_b"] = m.lora_a, m.lora_b
    meta = {"lora": json.dumps({"rank": mods[0][1].rank, "alpha": mods[0][1].alpha,
                                "modules": [n for n, _ in mods]})}
    save_tensors(path, tensors, metadata=meta)
    return Path(path)


@torch.no_grad()
def load_lora_(model: nn.Module, path: str | os.PathLike) -> nn.Module:
    """Load adapters saved by :func:`save_lora` into ``model``, which must already carry
    adapters of the same rank on the same projections (:func:`add_lora_`). A missing or extra
    tensor, a wrong shape or a non-finite value raises ``ValueError`` naming it."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"LoRA adapter file {str(p)!r} does not exist")
    mods = dict(lora_modules(model))
    if not mods:
        raise ValueError("the model carries no LoRA adapters: call add_lora_ first")
    with safe_open(str(p), framework="pt") as f:
        keys = set(f.keys())
        tensors = {k: f.get_tensor(k) for k in keys}
    expected = {f"{n}.{s}" for n in mods for s in ("lora_a", "lora_b")}
    if keys != expected:
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        raise ValueError(f"{p}: adapters do not match the model (missing {missing[:4]}, "
                         f"unexpected {extra[:4]})")
    for name, m in mods.items():
        for s in ("lora_a", "lora_b"):
            t, own = tensors[f"{name}.{s}"], getattr(m, s)
            if tuple(t.shape) != tuple(own.shape):
                raise ValueError(f"{p}: {name}.{s} has shape {tuple(t.shape)}, expected "
                                 f"{tuple(own.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise ValueError(f"{p}: {name}.{s} holds non-finite values")
    for name, m in mods.items():
        m.lora_a.copy_(tensors[f"{name}.lora_a"])
        m.lora_b.copy_(tensors[f"{name}.lora_b"])
    return model
