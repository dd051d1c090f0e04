"""Random-feature maps: pure torch functions of inputs and particles.

Every map takes ``x`` of shape ``(..., d)`` and particles ``omega`` of shape ``(N, d)`` (rows
are particles) and returns ``Phi`` of shape ``(..., N)``, already scaled so that the empirical
kernel is ``Phi(x) @ Phi(y).T`` (the ``1/sqrt(N)`` of the design). All maps are
differentiable in both ``x`` and ``omega``.

| name       | Phi[..., m]                                   | kernel for omega ~ N(0, I) |
|------------|-----------------------------------------------|----------------------------|
| rff        | sqrt(2/N) cos(omega_m . x + b_m)              | exp(-|x-y|^2/2)            |
| positive   | exp(omega_m . x - |x|^2/2 - shift) / sqrt(N)  | exp(x . y) (times exp(-2 shift)) |
| softplus   | softplus(omega_m . x) / sqrt(N)               | no closed form             |
| softmax    | softmax_m(omega_m . x)                        | none (N-coupled)           |

The one registry of feature maps, :data:`MAPS`, names each map once, under the name the
attention layers, the checkpoints (``config.json``'s kernel section, its ``layer_maps``) and the
Hugging Face export all use; the estimators' core names (``positive``, ``softplus``,
``softmax``) are its ``core`` field and :data:`FEATURE_MAPS` is that view:

| name          | core     | phi(u; omega)                                    | particles      |
|---------------|----------|--------------------------------------------------|----------------|
| rff           | rff      | sqrt(2/N) cos(omega . u + b) (not an attention map: signed) | yes |
| favor         | positive | exp(omega . u - |u|^2/2) / sqrt(N) (FAVOR+)      | yes            |
| porf_softplus | softplus | softplus(omega . u) / sqrt(N)                    | yes            |
| softmax_feat  | softmax  | softmax_m(omega_m . u)                           | yes            |
| hedgehog      |          | [softmax(A u), softmax(B u)], omega = [A; B]     | yes, M even    |
| elu           |          | elu(u) + 1 (Katharopoulos et al. 2020)           | none (0 rows)  |
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._validation import check_choice

__all__ = [
    "rff",
    "positive",
    "log_positive",
    "softplus",
    "softmax",
    "FEATURE_MAPS",
    "MAPS",
    "FeatureMap",
    "attention_maps",
    "elu_features",
    "get_feature_map",
    "get_map",
    "feature_fn",
    "draw_bias",
    "hedgehog_features",
]


def _check(x: torch.Tensor, omega: torch.Tensor) -> None:
    if omega.ndim != 2:
        raise ValueError(f"omega must have shape (n_features, d), got {tuple(omega.shape)}")
    if x.shape[-1] != omega.shape[1]:
        raise ValueError(
            f"x has {x.shape[-1]} features per row but omega has d={omega.shape[1]} "
            f"(x shape {tuple(x.shape)}, omega shape {tuple(omega.shape)})"
        )


def draw_bias(n_features: int, *, generator=None, dtype=torch.float32) -> torch.Tensor:
    """Phases ``b ~ U[0, 2 pi)`` for :func:`rff`, shape ``(n_features,)``."""
    return torch.rand(n_features, generator=generator, dtype=dtype) * (2 * math.pi)


def rff(x: torch.Tensor, omega: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Random Fourier features ``sqrt(2/N) cos(x @ omega.T + b)``, shape ``(..., N)``.

    ``bias`` (shape ``(N,)``) is required: it is drawn once (:func:`draw_bias`) and travels
    with the particles.
    """
    _check(x, omega)
    if bias is None:
        raise ValueError("rff needs bias of shape (n_features,); draw it with draw_bias()")
    if bias.shape != (omega.shape[0],):
        raise ValueError(f"bias must have shape ({omega.shape[0]},), got {tuple(bias.shape)}")
    n = omega.shape[0]
    return math.sqrt(2.0 / n) * torch.cos(x @ omega.T + bias)


def log_positive(x: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``log`` of the unnormalised FAVOR+ feature: ``x @ omega.T - |x|^2/2``, shape ``(..., N)``."""
    _check(x, omega)
    return x @ omega.T - 0.5 * (x * x).sum(-1, keepdim=True)


def positive(
    x: torch.Tensor,
    omega: torch.Tensor,
    shift: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Positive random features (FAVOR+) ``exp(x @ omega.T - |x|^2/2 - shift) / sqrt(N)``.

    Computed in at least float32 (also under bf16/fp16 inputs). ``shift`` is subtracted
    inside the exponential for numerical safety: a scalar (one global shift: the kernel is
    multiplied by ``exp(-2 shift)``, which normalised alignment ignores), a tensor broadcastable
    to ``(..., 1)`` (per-row shift, cancels in the attention ratio), or the string-free
    default ``None`` (no shift, exact kernel ``exp(x . y)``).
    """
    logits = log_positive(_upcast(x), _upcast(omega))
    if shift is not None:
        logits = logits - shift
    return torch.exp(logits) / math.sqrt(omega.shape[0])


def softplus(x: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Softplus features ``softplus(x @ omega.T) / sqrt(N)``, shape ``(..., N)``."""
    _check(x, omega)
    return F.softplus(_upcast(x) @ _upcast(omega).T) / math.sqrt(omega.shape[0])


def softmax(x: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Softmax features: ``softmax`` over the N features of ``x @ omega.T``, shape ``(..., N)``."""
    _check(x, omega)
    return torch.softmax(_upcast(x) @ _upcast(omega).T, dim=-1)


def _upcast(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def get_feature_map(name: str) -> Callable[..., torch.Tensor]:
    """Look up a feature map; unknown names raise ``ValueError`` listing the valid ones."""
    return FEATURE_MAPS[check_choice("feature_map", name, FEATURE_MAPS)]


def feature_fn(name: str, bias: torch.Tensor | None = None) -> Callable:
    """A closure ``phi(x, omega) -> Phi`` for map ``name`` (binding the rff ``bias``)."""
    fn = get_feature_map(name)
    if name == "rff":
        if bias is None:
            raise ValueError("feature map 'rff' needs a bias (see draw_bias)")
        return lambda x, omega: fn(x, omega, bias)
    return fn


def hedgehog_features(u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """Hedgehog feature map (Zhang et al. 2024; the conversion and recall baseline)
    ``[softmax(u A^T), softmax(u B^T)]`` with ``omega = [A; B]`` (M, d), ``M`` even (the
    baseline ties ``B = -A``). ``u (..., d) -> (..., M)``, float32 or float64.

    Batched over particle sets: ``omega`` (G, M, d) with ``u`` (..., G, R, d) gives
    (..., G, R, M), set ``g`` for the rows ``u[..., g, :, :]`` (one matmul for every set)."""
    if omega.shape[-2] % 2:
        raise ValueError(f"the hedgehog map needs an even number of features, got "
                         f"{omega.shape[-2]}")
    dtype = torch.float64 if torch.float64 in (u.dtype, omega.dtype) else torch.float32
    if u.dtype != dtype:
        u = u.to(dtype)
    if omega.dtype != dtype:
        omega = omega.to(dtype)
    logits = u @ omega.transpose(-1, -2)  # (..., M): both halves in one matmul
    halves = logits.unflatten(-1, (2, omega.shape[-2] // 2))
    return torch.softmax(halves, -1).flatten(-2)


def elu_features(u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
    """``elu(u) + 1`` (Katharopoulos et al. 2020), in float32; ``omega`` is unused (0 rows):
    ``u (..., d) -> (..., d)``."""
    return F.elu(_upcast(u)) + 1.0


@dataclass(frozen=True)
class FeatureMap:
    """One entry of :data:`MAPS` (and of the attention layers' registry).

    Attributes
    ----------
    name : str
        The one name of the map (attention, checkpoints, export).
    phi : callable or None
        ``phi(u (..., d), omega (M, d)) -> (..., M)``, unshifted; ``None`` for the attention
        kinds that are not feature maps (exact ``softmax``, ``none``).
    sampler : str or None
        Default sampler of omega (:data:`coulomb_attention.features.SAMPLERS`), ``None`` when
        the map has no particles.
    description : str
    core : str or None
        The estimators' name of the same function (:data:`FEATURE_MAPS`), if it has one.
    attention : bool
        Usable as an attention kernel (``rff`` is not: its features are signed).
    even : bool
        Needs an even number of particles (Hedgehog's two halves).
    tied : bool
        A fresh draw ties the second half to the first, ``omega = [W; -W]`` (Hedgehog).
    batched : bool
        ``phi`` also takes ``omega`` (G, M, d) with ``u`` (..., G, R, d), one particle set per
        group of rows, in one call (the attention layers then skip ``vmap``).
    """

    name: str
    phi: Callable[..., torch.Tensor] | None
    sampler: str | None
    description: str
    core: str | None = None
    attention: bool = True
    even: bool = False
    tied: bool = False
    batched: bool = False

    @property
    def has_features(self) -> bool:
        return self.sampler is not None


#: The one registry of feature maps (module docstring).
MAPS: dict[str, FeatureMap] = {m.name: m for m in (
    FeatureMap("rff", rff, "gaussian", "random Fourier features sqrt(2/N) cos(w.x + b)",
               core="rff", attention=False),
    FeatureMap("favor", positive, "orthogonal",
               "FAVOR+ positive features exp(w.x - |x|^2/2), approximates softmax attention",
               core="positive"),
    FeatureMap("porf_softplus", softplus, "orthogonal", "orthogonal projections + softplus",
               core="softplus"),
    FeatureMap("softmax_feat", softmax, "orthogonal",
               "softmax over the features of w.x (use with tie_qk=True for a PSD kernel)",
               core="softmax"),
    FeatureMap("hedgehog", hedgehog_features, "orthogonal",
               "Hedgehog's map [softmax(A x), softmax(B x)] (Zhang et al. 2024); a fresh draw "
               "ties B = -A", even=True, tied=True, batched=True),
    FeatureMap("elu", elu_features, None, "elu(x) + 1, no random features"),
)}

#: The estimators' view of :data:`MAPS`: core name -> function (``rff`` needs its ``bias``).
FEATURE_MAPS: dict[str, Callable[..., torch.Tensor]] = {
    m.core: m.phi for m in MAPS.values() if m.core is not None}


def get_map(name: str) -> FeatureMap:
    """The registry entry ``name`` of :data:`MAPS`; unknown names raise ``ValueError``."""
    return MAPS[check_choice("feature map", name, MAPS)]


def attention_maps() -> dict[str, FeatureMap]:
    """The entries of :data:`MAPS` usable as attention kernels, in registry order."""
    return {n: m for n, m in MAPS.items() if m.attention}
