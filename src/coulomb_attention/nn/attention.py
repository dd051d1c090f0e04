"""Multi-head kernel (linear) attention with particles omega held as a buffer.

The layer holds the state (projections, ``omega``); the mathematics lives in
:mod:`coulomb_attention.features` (the feature maps) and :mod:`.functional` (the attention
ops). ``omega`` changes only through :meth:`KernelAttention.load_features_` and
:meth:`KernelAttention.redraw_`, never in ``forward``; it is saved in the ``state_dict``. The one
exception is the end-to-end ablation: inside :func:`trainable_omega` omega is a parameter that
the task loss trains with the rest (it is a buffer again on exit).

Weighted particles (Wasserstein-Fisher-Rao, :mod:`coulomb_attention.dynamics.weighted`): a layer
may carry a mass per head group and feature, ``mass`` (G, M), each group summing to 1
(:meth:`KernelAttention.load_masses_`). Feature ``i`` is then scaled by ``sqrt(M mass_i)``, so
the kernel is ``sum_i M mass_i phi_i(q) phi_i(k)`` and uniform masses ``1/M`` are the unweighted
layer. Without masses (``mass is None``, the default) the layer is today's, bit for bit, and its
``state_dict`` has no ``mass`` entry (old checkpoints load unchanged); with masses the
``state_dict`` carries them and loading one restores them (validated: shape, finite, >= 0).
FAVOR+ folds ``sqrt(M mass_i)`` into the exponent as ``0.5 log(M mass_i)`` (through one extra
coordinate, so every fused/causal path is reused unchanged); the other maps multiply the
features explicitly.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import features
from .._validation import check_choice, check_positive, torch_generator
from . import functional as AF
from .dispatch import fused_attend
from .ops.checks import _no_autocast, held_bytes

__all__ = ["ATTENTION_FEATURES", "HEDGEHOG", "AttentionFeature", "DecodeState", "KVCache",
           "KernelAttention", "trainable_omega", "use_hedgehog_map_"]


class KVCache(NamedTuple):
    """Exact softmax attention's decoding state: every key and value so far,
    ``(B, Hk, seen, dh)`` each (it grows with the context: the row linear attention removes)."""

    k: torch.Tensor
    v: torch.Tensor

    def nbytes(self) -> int:
        """Bytes held by the cache (its storages, :func:`.ops.checks.held_bytes`)."""
        return held_bytes(self.k, self.v)


class DecodeState(NamedTuple):
    """A causal :class:`KernelAttention`'s state after ``position`` tokens.

    ``inner`` is the op's state: :class:`.ops.causal.LinearState` (linear maps: a constant
    size), :class:`.ops.streaming.HybridState` (window + sinks + linear rest: constant once the
    window is full), :class:`KVCache` (exact softmax: grows) or ``None`` (``none``)."""

    position: int
    inner: object

    def nbytes(self) -> int:
        """Bytes held by the state."""
        return 0 if self.inner is None else int(self.inner.nbytes())


#: One entry of :data:`ATTENTION_FEATURES`: the feature-map registry's entry
#: (:class:`coulomb_attention.features.FeatureMap`).
AttentionFeature = features.FeatureMap

#: The attention kernels: every map of :data:`coulomb_attention.features.MAPS` usable in
#: attention (``favor``, ``porf_softplus``, ``softmax_feat``, ``hedgehog``, ``elu``) under its
#: registry name, and the two kinds that are not feature maps (exact ``softmax``, ``none``).
ATTENTION_FEATURES: dict[str, AttentionFeature] = {
    **features.attention_maps(),
    "softmax": AttentionFeature("softmax", None, None, "exact softmax attention (quadratic)"),
    "none": AttentionFeature(
        "none", None, None,
        "no token mixing (control): each token attends only to itself, out_t = v_t",
    ),
}


class KernelAttention(nn.Module):
    """Multi-head kernel attention with a padding mask (non-causal by default).

    ``out_t = sum_s phi(q_t) . phi(k_s) v_s / sum_s phi(q_t) . phi(k_s)`` per head, with
    queries and keys scaled by ``head_dim**-0.25`` before the map (so FAVOR+ approximates
    softmax attention with the usual ``1/sqrt(head_dim)``). Cost O(L M head_dim) per head
    (exact ``softmax``: O(L^2 head_dim)).

    Parameters
    ----------
    dim : int
        Model width ``D``; must be divisible by ``heads``.
    heads : int
    feature_map : str
        One of :data:`ATTENTION_FEATURES`: ``favor``, ``porf_softplus``, ``softmax_feat``,
        ``hedgehog`` (Hedgehog's map; ``n_features`` even, a fresh draw tied ``[W; -W]``),
        ``elu``, ``softmax``, ``none`` (no token mixing: ``out_t = out_proj(v_proj(x_t))``).
    n_features : int
        Number of particles ``M`` per head (ignored, but still validated, for ``elu``,
        ``softmax`` and ``none``, which have none).
    tie_qk : bool
        Share the query and key projection (``k_proj is q_proj``): symmetric PSD kernel.
    dropout : float
        Dropout on the per-head attention output, before ``out_proj``.
    share_features : bool
        One omega for all heads (``omega`` shape ``(1, M, dh)``) or one per head ``(H, M, dh)``.
    bias : bool
        Biases of the four projections.
    generator : torch.Generator or int, optional
        Randomness of the initial omega (``None``: torch's global generator).
    sampler : str, optional
        Sampler of omega (default per map: ``orthogonal``); see
        :data:`coulomb_attention.features.SAMPLERS`.
    chunk_size : int, optional
        Rows per chunk of the fused FAVOR+ path (:func:`.functional.favor_attention`), or
        positions per block of the causal prefix sums (default 128).
    causal : bool
        Position t attends to positions s <= t only (prefix sums, still linear in L:
        :func:`.functional.causal_linear_attention`, :func:`.functional.causal_favor_attention`;
        exact ``softmax`` masks the future). A causal layer decodes with a state
        (``forward(..., state=, output_state=True)``, :meth:`step`).
    kv_heads : int, optional
        Key/value heads (grouped-query attention; default ``heads``): query head ``h`` reads
        key/value head ``h // (heads / kv_heads)``, and with ``share_features=False`` the
        particles are one set per key/value group, shared by the group's queries.
    position : callable, optional
        ``position(u, start) -> u``, applied to the projected, head-split queries and keys
        ``(B, H|Hk, T, dh)`` at absolute positions ``start .. start + T - 1`` before the scale
        and the feature map (rotary embeddings); an ``nn.Module`` is registered as a child.

    Attributes
    ----------
    q_proj, k_proj, v_proj, out_proj : torch.nn.Linear
        ``(dim, dim)`` projections (``k_proj is q_proj`` with ``tie_qk``).
    omega : torch.Tensor, buffer of shape (1 or heads, M, head_dim)
        ``M = 0`` for ``elu`` and ``softmax``.
    mass : torch.Tensor of shape (1 or heads, M), or None
        Particle masses (weighted particles, :meth:`load_masses_`; each group sums to 1),
        ``None`` (default) for the unweighted layer.
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        feature_map: str = "favor",
        n_features: int = 64,
        tie_qk: bool = False,
        dropout: float = 0.0,
        share_features: bool = True,
        bias: bool = True,
        generator: torch.Generator | int | None = None,
        sampler: str | None = None,
        chunk_size: int | None = None,
        causal: bool = False,
        kv_heads: int | None = None,
        position: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        dim = check_positive("dim", dim, integer=True)
        heads = check_positive("heads", heads, integer=True)
        if dim % heads:
            raise ValueError(f"dim={dim} is not divisible by heads={heads}")
        kv_heads = heads if kv_heads is None else check_positive("kv_heads", kv_heads,
                                                                 integer=True)
        if heads % kv_heads:
            raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads}")
        if tie_qk and kv_heads != heads:
            raise ValueError("tie_qk needs as many key heads as query heads (kv_heads=heads)")
        if position is not None and not callable(position):
            raise TypeError(f"position must be callable (u, start) -> u, got "
                            f"{type(position).__name__}")
        self.spec = ATTENTION_FEATURES[check_choice("feature_map", feature_map,
                                                    ATTENTION_FEATURES)]
        n_features = check_positive("n_features", n_features, integer=True)
        if self.spec.even and n_features % 2:
            raise ValueError(f"feature_map {feature_map!r} needs an even n_features, got "
                             f"{n_features}")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not (
            0.0 <= dropout < 1.0
        ):
            raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        if sampler is not None:
            check_choice("sampler", sampler, features.SAMPLERS)
        if chunk_size is not None:
            chunk_size = check_positive("chunk_size", chunk_size, integer=True)
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.kv_heads = kv_heads
        self.position = position
        self.feature_map = feature_map
        self.n_features = n_features if self.spec.has_features else 0
        self.tie_qk = bool(tie_qk)
        self.share_features = bool(share_features)
        self.sampler = sampler or self.spec.sampler
        self.chunk_size = chunk_size
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal

        kv_dim = kv_heads * self.head_dim
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = self.q_proj if self.tie_qk else nn.Linear(dim, kv_dim, bias=bias)
        self.v_proj = nn.Linear(dim, kv_dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)
        groups = 1 if self.share_features else kv_heads
        self.register_buffer("omega", torch.zeros(groups, self.n_features, self.head_dim))
        self.register_buffer("mass", None)  # (G, M) masses of weighted particles, or None
        self.window, self.window_linear = 0, True  # the sliding-window hybrid: set_window_
        self.sinks = 0  # exact first tokens of the causal hybrid (set_window_)
        self.register_buffer("window_logit", None)  # (H,) logit of the window weight, or None
        if self.has_features:
            self.redraw_(generator)

    # ------------------------------------------------------------------ particles

    @property
    def has_features(self) -> bool:
        """``True`` when the map has particles omega (``favor``, ``porf_softplus``,
        ``softmax_feat``)."""
        return self.spec.has_features

    @torch.no_grad()
    def load_features_(self, omega: torch.Tensor) -> KernelAttention:
        """Replace omega by ``omega`` (e.g. learned particles); shape ``(M, dh)`` (broadcast
        to every head group) or exactly ``omega.shape``. Returns ``self``."""
        if not self.has_features:
            raise ValueError(f"feature_map {self.feature_map!r} has no particles to load")
        if not isinstance(omega, torch.Tensor):
            raise TypeError(f"omega must be a torch.Tensor, got {type(omega).__name__}")
        if not omega.is_floating_point():
            raise TypeError(f"omega must be a floating tensor, got dtype {omega.dtype}")
        shape = tuple(self.omega.shape)
        if tuple(omega.shape) not in (shape, shape[1:]):
            raise ValueError(f"omega must have shape {shape} or {shape[1:]}, got "
                             f"{tuple(omega.shape)}")
        if not bool(torch.isfinite(omega).all()):
            raise ValueError("omega contains NaN or infinite values")
        self.omega.copy_(omega.to(self.omega).expand(shape))
        return self

    @property
    def weighted(self) -> bool:
        """``True`` when the layer carries particle masses (:meth:`load_masses_`)."""
        return self.mass is not None

    def _validated_masses(self, mass, where: str = "mass") -> torch.Tensor:
        """``mass`` as a float tensor of shape (G, M), each group normalised to sum 1."""
        if not self.has_features:
            raise ValueError(f"feature_map {self.feature_map!r} has no particles to weigh")
        if not isinstance(mass, torch.Tensor):
            raise TypeError(f"{where} must be a torch.Tensor, got {type(mass).__name__}")
        if not mass.is_floating_point():
            raise TypeError(f"{where} must be a floating tensor, got dtype {mass.dtype}")
        shape = tuple(self.omega.shape[:2])
        if tuple(mass.shape) not in (shape, shape[1:]):
            raise ValueError(f"{where} must have shape {shape} or {shape[1:]}, got "
                             f"{tuple(mass.shape)}")
        mass = mass.detach().to(torch.float64).expand(shape)
        if not bool(torch.isfinite(mass).all()):
            raise ValueError(f"{where} contains NaN or infinite values")
        if bool((mass < 0).any()):
            raise ValueError(f"{where} must be non-negative")
        total = mass.sum(-1, keepdim=True)
        if bool((total <= 0).any()):
            raise ValueError(f"{where} must have a positive sum in every head group")
        return (mass / total).to(self.omega.dtype)

    @torch.no_grad()
    def load_masses_(self, mass: torch.Tensor | None) -> KernelAttention:
        """Give the particles masses: shape ``(M,)`` (every head group) or ``(G, M)``,
        finite and non-negative, normalised here to sum 1 per group (uniform ``1/M`` is the
        unweighted layer up to rounding); ``None`` removes them (the unweighted layer, bit for
        bit). Returns ``self``."""
        if mass is None:
            self.mass = None
            return self
        self.mass = self._validated_masses(mass).to(self.omega.device)
        return self

    def feature_scale(self) -> torch.Tensor | None:
        """``sqrt(M mass)`` (G, M), the factor of each feature, or ``None`` (unweighted)."""
        if self.mass is None:
            return None
        return (self.mass.double() * self.n_features).sqrt()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        self._load_window(state_dict, prefix)
        key = prefix + "mass"
        if key in state_dict:  # a weighted checkpoint: validate, then let torch copy it
            mass = state_dict[key]
            try:
                self.mass = self._validated_masses(mass, where=key).to(self.omega.device)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"bad particle masses in the checkpoint: {exc}") from exc
            if tuple(mass.shape) != tuple(self.mass.shape):
                raise ValueError(f"bad particle masses in the checkpoint: {key} must have "
                                 f"shape {tuple(self.mass.shape)}, got {tuple(mass.shape)}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    @torch.no_grad()
    def redraw_(self, generator: torch.Generator | int | None = None) -> KernelAttention:
        """Draw fresh omega from the sampler (independent per head group); masses are
        dropped (the fresh draw is unweighted). Returns ``self``.

        ``generator``: a ``torch.Generator`` or an int seed; ``None`` uses torch's global RNG.
        """
        if not self.has_features:
            raise ValueError(f"feature_map {self.feature_map!r} has no particles to redraw")
        if generator is not None:
            generator = torch_generator(generator)
        sampler = features.get_sampler(self.sampler)
        draws = [sampler(self.n_features, self.head_dim, generator=generator)
                 for _ in range(self.omega.shape[0])]
        omega = torch.stack(draws)  # (G, M, dh)
        if self.spec.tied:  # Hedgehog: [W; -W] from the first half of the draw
            w = omega[:, :self.n_features // 2]
            omega = torch.cat([w, -w], 1)
        self.omega.copy_(omega.to(self.omega))
        self.mass = None
        return self

    @torch.no_grad()
    def set_feature_map_(self, name: str) -> KernelAttention:
        """Compute with another map of :data:`ATTENTION_FEATURES` that has particles, on the
        same omega (its shape must suit the map: ``hedgehog`` needs an even M). Used to
        restore a layer of a checkpoint converted on another map than the model's
        (``layer_maps``) and by :func:`use_hedgehog_map_`. Returns ``self``."""
        spec = ATTENTION_FEATURES[check_choice("feature_map", name, ATTENTION_FEATURES)]
        if not (self.has_features and spec.has_features):
            raise ValueError(f"cannot switch feature_map {self.feature_map!r} to {name!r}: "
                             "both must have particles")
        if spec.even and self.n_features % 2:
            raise ValueError(f"feature_map {name!r} needs an even n_features, got "
                             f"{self.n_features}")
        self.spec, self.feature_map = spec, name
        return self

    #: Initial logit of the window weight: ``sigmoid(-2.2) = 0.1`` (LoLCATs).
    WINDOW_LOGIT_INIT = -2.2

    @torch.no_grad()
    def set_window_(self, window: int | None, linear: bool = True,
                    sinks: int = 0) -> KernelAttention:
        """Make the layer the sliding-window hybrid (:mod:`.ops.window`, LoLCATs eq. 7):
        softmax over the ``window`` nearest keys (encoder: ``window/2`` on each side, even;
        causal: the ``window`` most recent) plus this layer's linear term over the rest, one
        shared denominator, the window weighted per head by ``sigmoid(window_logit)`` (a
        buffer (H,), started at :data:`WINDOW_LOGIT_INIT`; a layer that already has a window
        keeps its logits). ``linear=False``: the window alone (the ablation of the linear
        branch). ``sinks`` (causal layers): the first ``sinks`` tokens are kept exact too
        (StreamingLLM's attention sinks; :mod:`.ops.streaming`). ``None`` removes the window
        (the plain layer). Returns ``self``."""
        if window is None:
            self.window, self.window_linear, self.window_logit, self.sinks = 0, True, None, 0
            return self
        if isinstance(window, bool) or not isinstance(window, int):
            raise ValueError(f"window must be an integer > 0, got {window!r}")
        if window <= 0:
            raise ValueError(f"window must be > 0, got {window}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be an integer >= 0, got {sinks!r}")
        if sinks and not self.causal:
            raise ValueError("attention sinks need a causal layer (causal=True)")
        if not self.causal and window % 2:
            raise ValueError(f"window must be even for an encoder (window/2 tokens on each "
                             f"side), got {window}")
        if self.feature_map in ("softmax", "none"):
            raise ValueError(f"attention {self.feature_map!r} has no linear term for a window")
        if linear and self.mass is not None:
            raise ValueError("the window hybrid takes unweighted particles (no masses)")
        self.window, self.window_linear, self.sinks = window, bool(linear), sinks
        if self.window_logit is None:
            self.window_logit = torch.full((self.heads,), self.WINDOW_LOGIT_INIT,
                                           dtype=self.omega.dtype, device=self.omega.device)
        return self

    def _load_window(self, state_dict, prefix) -> None:
        key = prefix + "window_logit"
        if key in state_dict and self.window_logit is None:
            raise ValueError(f"the checkpoint has {key} but the layer has no window "
                             "(set_window_ first)")
        if key not in state_dict and self.window_logit is not None:
            state_dict[key] = self.window_logit  # a layer given a window keeps its start

    def _attend_window(self, q, k, v, mask):
        """The hybrid of :mod:`.ops.window` with this layer's features (FAVOR+: shifted, with
        their log offsets, so that they stay finite)."""
        gamma = torch.sigmoid(self.window_logit)
        pq = pk = lq = lk = None
        if self.window_linear and self.feature_map == "favor":
            dt = torch.float64 if q.dtype == torch.float64 else torch.float32
            q, k, om = q.to(dt), k.to(dt), self._omega_for(q.shape[1]).to(dt)

            def logf(u):
                if om.shape[0] == 1:
                    return features.log_positive(u, om[0])
                return torch.vmap(features.log_positive, in_dims=(1, 0), out_dims=1)(u, om)

            half_log_m = 0.5 * math.log(self.n_features)  # the 1/sqrt(M) of each feature
            a, b = logf(q) - half_log_m, logf(k) - half_log_m  # (B, H, L, M) log features
            lq = a.amax(-1, keepdim=True).detach()
            bm = b if mask is None else b.masked_fill(~mask[:, None, :, None], float("-inf"))
            lk = bm.amax((-2, -1), keepdim=True).detach()
            lk = torch.where(torch.isfinite(lk), lk, torch.zeros_like(lk))
            pq, pk = torch.exp(a - lq), torch.exp(b - lk)
        elif self.window_linear:
            pq, pk = self._phi(q), self._phi(k)
        return AF.window_attention(q, k, v, pq, pk, gamma, self.window, mask,
                                   causal=self.causal, log_q=lq, log_k=lk,
                                   linear=self.window_linear)

    # ------------------------------------------------------------------ pieces

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        B, T, D = t.shape
        return t.view(B, T, D // self.head_dim, self.head_dim).transpose(1, 2)  # (B, H, T, dh)

    def _place(self, u: torch.Tensor, start: int) -> torch.Tensor:
        """The position hook (if any), then the scale ``head_dim**-0.25``."""
        if self.position is not None:
            u = self.position(u, start)
        return u * self.head_dim**-0.25

    def queries(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Projected, head-split queries at positions ``start ..`` (the position hook applied)
        scaled by ``head_dim**-0.25``: ``(B, H, T, dh)``."""
        self._check_x(x)
        return self._place(self._split(self.q_proj(x)), start)

    def keys(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Projected, head-split keys as :meth:`queries`: ``(B, kv_heads, T, dh)``."""
        self._check_x(x)
        return self._place(self._split(self.k_proj(x)), start)

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """Projected, head-split values: ``(B, kv_heads, T, dh)``."""
        self._check_x(x)
        return self._split(self.v_proj(x))

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        """Key/value heads ``(B, Hk, T, e)`` repeated to the query heads ``(B, H, T, e)``
        (grouped-query attention: query head ``h`` reads key head ``h // (H / Hk)``)."""
        g = self.heads // t.shape[1]
        return t if g == 1 else t.repeat_interleave(g, 1)

    def _omega_for(self, heads: int) -> torch.Tensor:
        """omega with one group per ``heads`` (or one for all): (1 or heads, M, dh)."""
        om = self.omega
        return om if om.shape[0] in (1, heads) else om.repeat_interleave(heads // om.shape[0], 0)

    def feature(self, u: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
        """The feature map as ``forward`` uses it, without the stabilising shift.

        Parameters
        ----------
        u : torch.Tensor, shape (..., head_dim)
            Scaled queries/keys (:meth:`queries`, :meth:`keys`).
        omega : torch.Tensor, shape (M, head_dim)

        Returns
        -------
        torch.Tensor, shape (..., M) (``elu``: ``(..., head_dim)``), float32 or float64.
        """
        if self.spec.phi is None:
            raise ValueError(f"attention {self.feature_map!r} has no feature map")
        return self.spec.phi(u, omega)

    def _check_x(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, T, {self.dim}), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating tensor, got dtype {x.dtype}")

    def _phi(self, u: torch.Tensor) -> torch.Tensor:
        """Unshifted features of (B, H, L, dh) with this layer's omega (scaled by
        ``sqrt(M mass)`` when weighted): (B, H, L, M)."""
        om = self.omega
        if om.shape[0] == 1 or not self.has_features:  # elu: no particles
            phi = self.feature(u, om[0])
        elif self.spec.batched:  # one call: query head h reads particle set h // (H / G)
            B, H, L, d = u.shape
            g = om.shape[0]
            phi = self.feature(u.reshape(B, g, (H // g) * L, d), om).reshape(B, H, L, -1)
        else:  # one omega per head: the map vectorised over the head dimension (no loop)
            phi = torch.vmap(self.feature, in_dims=(1, 0), out_dims=1)(u, self._omega_for(
                u.shape[1]))
        scale = self.feature_scale()  # (G, M), G = 1 or Hk
        if scale is None:
            return phi
        if scale.shape[0] not in (1, u.shape[1]):  # a key group's masses, for its queries
            scale = scale.repeat_interleave(u.shape[1] // scale.shape[0], 0)
        return phi * scale[:, None, :].to(phi.dtype)  # (B, H, L, M) * (G, 1, M)

    def _favor_augmented(self, q, k):
        """FAVOR+ with masses: ``[q, 1]``, ``[k, 1]`` and ``[omega, 0.5 log(M mass)]``, so each
        feature's exponent gains ``0.5 log(M mass_i)`` (and ``-1/2`` from the extra coordinate
        in ``|u|^2 / 2``, a constant factor on every feature that cancels in the attention
        ratio). A zero mass gives a feature that underflows to exactly 0 (the log is floored
        at -1e4)."""
        bias = 0.5 * self.feature_scale().square().log().clamp_min(-1e4)  # (G, M)
        om = torch.cat([self.omega.to(bias.dtype), bias[..., None]], -1).to(self.omega.dtype)
        if om.shape[0] not in (1, k.shape[1]):  # keys repeated to the query heads
            om = om.repeat_interleave(k.shape[1] // om.shape[0], 0)
        one = q.new_ones(q.shape[:-1] + (1,))
        qa = torch.cat([q, one], -1)
        ka = qa if k is q else torch.cat([k, k.new_ones(k.shape[:-1] + (1,))], -1)
        return qa, ka, om

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        state: DecodeState | None = None,
        output_state: bool = False,
    ):
        """Attend.

        Parameters
        ----------
        x : torch.Tensor, shape (B, T, dim)
        mask : torch.Tensor of bool, shape (B, T), optional
            ``True`` = real token; padded positions are never attended to (their own outputs
            are computed but meaningless). Not with a state.
        state : DecodeState, optional
            Causal layers: the state after the tokens before ``x`` (from an earlier call with
            ``output_state=True``); ``x`` continues that sequence.
        output_state : bool
            Causal layers: also return the state after ``x``.

        Returns
        -------
        torch.Tensor, shape (B, T, dim); with ``output_state`` ``(out, DecodeState)``.
        """
        self._check_x(x)
        B, T, _ = x.shape
        AF.check_key_mask(mask, B, T)
        stateful = state is not None or output_state
        if stateful and not self.causal:
            raise ValueError("a decoding state needs a causal layer (causal=True)")
        if stateful and mask is not None:
            raise ValueError("decoding with a state takes no padding mask")
        if state is not None and not isinstance(state, DecodeState):
            raise TypeError(f"state must be a DecodeState, got {type(state).__name__}")
        start = 0 if state is None else state.position
        q = self.queries(x, start)
        k = q if self.tie_qk else self.keys(x, start)
        v = self.values(x)
        if stateful:
            with _no_autocast(q):
                out, inner = self._attend_state(q, k, v, None if state is None else state.inner)
        else:
            out = self.attend(q, k, v, mask)  # (B, H, T, dh)
        out = self.out_proj(self.dropout(out.transpose(1, 2).reshape(B, T, self.dim)))
        return (out, DecodeState(start + T, inner)) if output_state else out

    def step(self, x: torch.Tensor, state: DecodeState | None = None):
        """One decoding step: ``x`` (B, 1, dim) after ``state`` -> ``(out, new_state)``."""
        if isinstance(x, torch.Tensor) and x.ndim == 3 and x.shape[1] != 1:
            raise ValueError(f"step takes one token, x of shape (B, 1, {self.dim}); got "
                             f"{tuple(x.shape)} (use forward(x, state=..., "
                             "output_state=True) for a block)")
        return self.forward(x, state=state, output_state=True)

    def _linear_kind(self) -> dict:
        """The rest term of the causal hybrid: FAVOR+'s particles or this layer's map."""
        if self.feature_map == "favor" and self.mass is None:
            return {"omega": self.omega}
        return {"phi": self._phi}

    def _attend_state(self, q, k, v, inner):
        """The stateful causal ops: q (B, H, T, dh), k, v (B, Hk, T, dh) after ``inner``."""
        name = self.feature_map
        if self.window:
            kw = self._linear_kind() if self.window_linear else {}
            return AF.streaming_attention(
                q, k, v, torch.sigmoid(self.window_logit), self.window, self.sinks,
                linear=self.window_linear, chunk_size=self.chunk_size or 128,
                initial_state=inner, output_final_state=True, **kw)
        if name == "none":
            return self.expand_kv(v), None
        if name == "softmax":  # the KV cache grows as Hugging Face's DynamicCache does
            kc = k if inner is None else torch.cat([inner.k, k.to(inner.k)], 2)
            vc = v if inner is None else torch.cat([inner.v, v.to(inner.v)], 2)
            T, S = q.shape[2], kc.shape[2]
            gqa = dict(enable_gqa=True) if kc.shape[1] != q.shape[1] else {}
            if T == S or T == 1:  # a prefill (causal) or one new token (every key)
                out = F.scaled_dot_product_attention(q, kc.to(q), vc.to(q), scale=1.0,
                                                     is_causal=T > 1, **gqa)
            else:
                seen = torch.arange(S, device=q.device)[None, :] <= torch.arange(
                    S - T, S, device=q.device)[:, None]  # (T, S): keys at or before each
                out = F.scaled_dot_product_attention(q, kc.to(q), vc.to(q), attn_mask=seen,
                                                     scale=1.0, **gqa)
            return out, KVCache(kc, vc)
        if name == "favor":
            if self.mass is not None:
                qa, ka, om = self._favor_augmented(q, k)
                return AF.causal_favor_attention(qa, ka, v, om, chunk_size=self.chunk_size,
                                                 initial_state=inner, output_final_state=True)
            return AF.causal_favor_attention(q, k, v, self.omega, chunk_size=self.chunk_size,
                                             initial_state=inner, output_final_state=True)
        return AF.causal_linear_attention(self._phi(q), self._phi(k), v,
                                          chunk_size=self.chunk_size, initial_state=inner,
                                          output_final_state=True)

    #: Association order of the FAVOR+ ops (:func:`.functional.favor_attention`): ``"auto"``
    #: (by cost: quadratic at the shortest sequences, linear beyond), ``"quadratic"``,
    #: ``"linear"`` or ``"chunked"`` (linear, always the fused chunked path); set it on an
    #: instance (``layer.order = "linear"``) to override.
    order: str = "auto"
    #: Use the fused Triton kernels where they apply (:mod:`.dispatch`: non-causal, CUDA,
    #: Triton installed); ``layer.fused = False`` keeps today's ops.
    fused: bool = True

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of already projected heads: q ``(B, H, T, dh)``, k ``(B, Hk, S, dh)``
        (scaled as by :meth:`queries`), v ``(B, Hk, S, dh)`` -> ``(B, H, T, dh)``."""
        grouped = k.shape[1] != q.shape[1]
        if self.window and self.causal and (self.sinks or grouped):  # window + sinks
            with _no_autocast(q):
                if mask is not None:
                    raise ValueError("the causal hybrid with sinks or grouped heads takes no "
                                     "padding mask")
                out, _ = self._attend_state(q, k, v, None)
                return out
        if grouped and not (self.causal and self.feature_map not in ("softmax", "none")):
            # the ops without native grouped heads see every query head's keys and values
            # (and each query head its group's particles: _omega_for)
            k, v = self.expand_kv(k), self.expand_kv(v)
        if self.window:  # the sliding-window hybrid (set_window_)
            with _no_autocast(q):
                return self._attend_window(q, k, v, mask)
        name = self.feature_map
        if name == "none":  # the no-mixing control: each position's output is its own value
            return v
        out = None if grouped else fused_attend(self, q, k, v, mask)  # GPU kernels or None
        if out is not None:
            return out
        if name == "favor":
            fn = AF.causal_favor_attention if self.causal else AF.favor_attention
            if self.mass is not None:
                qa, ka, om = self._favor_augmented(q, k)
                return fn(qa, ka, v, om, mask, chunk_size=self.chunk_size, order=self.order)
            om = self._omega_for(k.shape[1])
            return fn(q, k, v, om, mask, chunk_size=self.chunk_size, order=self.order)
        if name == "softmax":
            return _sdpa(q, k, v, mask, self.causal)
        # the maps upcast to float32; autocast would undo that inside the matmul q @ omega.T
        with _no_autocast(q):
            if self.causal:
                return AF.causal_linear_attention(self._phi(q), self._phi(k), v, mask,
                                                  chunk_size=self.chunk_size)
            return AF.linear_attention(self._phi(q), self._phi(k), v, mask)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, heads={self.heads}, feature_map={self.feature_map!r}, "
                f"n_features={self.n_features}, tie_qk={self.tie_qk}, "
                f"share_features={self.share_features}"
                + (", causal=True" if self.causal else "")
                + (", weighted=True" if self.mass is not None else "")
                + (f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else "")
                + (f", window={self.window}" if self.window else "")
                + (f", sinks={self.sinks}" if self.sinks else "")
                + ("" if self.window_linear else ", window_linear=False"))


def _sdpa(q, k, v, mask, causal=False):
    """Exact softmax attention through torch's fused kernel (scale 1: q, k are pre-scaled)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1.0)
    # a query row without any key (all padded; causal: before the first real token) would
    # be NaN in the fused kernel: the guarded reference gives it output 0
    if not bool((mask[:, 0] if causal else mask.any(-1)).all()):
        return AF.softmax_attention(q, k, v, mask, causal=causal)
    attn_mask = mask[:, None, None, :]  # (B, 1, 1, S)
    if causal:
        L = q.shape[2]
        attn_mask = attn_mask & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=1.0)


# ---------------------------------------------------------------------------- hedgehog


#: Hedgehog's map, the registry's entry (kept under its earlier name).
HEDGEHOG = ATTENTION_FEATURES["hedgehog"]


@contextmanager
def trainable_omega(module: nn.Module) -> Iterator[list[KernelAttention]]:
    """Within the block, omega of every :class:`KernelAttention` in ``module`` that has
    particles is an ``nn.Parameter`` (so an optimiser built inside, e.g. ``train.fit``, trains
    it with the other weights by the task loss); on exit it is a buffer again, holding the
    trained values (``requires_grad=False``, same name in the ``state_dict``). Yields the
    layers. This is the end-to-end ablation of the particle dynamics, not the method: omega
    is moved by the task gradient, with no interaction, no noise and no projection."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    layers = [m for m in module.modules() if isinstance(m, KernelAttention) and m.has_features]
    if any("omega" not in m._buffers for m in layers):
        raise RuntimeError("omega is already trainable (nested trainable_omega)")
    for m in layers:
        w = m._buffers.pop("omega")
        m.omega = nn.Parameter(w.detach().clone())
    try:
        yield layers
    finally:
        for m in layers:
            w = m._parameters.pop("omega").detach().clone()
            m.register_buffer("omega", w)


def use_hedgehog_map_(layer) -> None:
    """Switch a :class:`KernelAttention` with particles to the registry's ``hedgehog`` map,
    omega ``[W; -W]`` from the first half of its current omega (the tied start of the Hedgehog
    baseline; on a fresh draw it equals ``KernelAttention(..., "hedgehog")`` of the same
    generator). Masses are dropped."""
    if not layer.has_features or layer.n_features % 2:
        raise ValueError("the hedgehog baseline needs a layer with an even number of particles")
    half = layer.n_features // 2
    w = layer.omega[:, :half]
    layer.set_feature_map_("hedgehog")
    layer.load_features_(torch.cat([w, -w], 1))
    layer.load_masses_(None)
