"""Multi-query associative recall (MQAR; Arora et al., Zoology 2023), a synthetic task where
the attention kernel decides the answer.

A sequence of length ``L`` holds ``P`` key-value pairs, then ``Q`` queries::

    k_1 v_1 k_2 v_2 ... k_P v_P | 0 0 q_1 a_1 0 0 q_2 a_2 ... (filler 0 in the unused slots)

Keys are distinct tokens of ``[1, V/2)``, values tokens of ``[V/2, V)`` (drawn with
replacement, so chance is ``1 / (V - V/2)``); token 0 is the filler. The query region after
the context is cut into slots of two positions; ``Q`` random slots hold a query: a key
``q_j = k_i`` drawn from the context (distinct keys), followed by its value ``a_j = v_i``.
The model reads the sequence causally; at the position of ``q_j`` it must output ``v_i``
(exact-match accuracy over the queried positions). The value token that follows each query
is the teacher-forced next input, never a target (causality hides it from the query).

The generator also returns what attention must do: for each query position ``t``, the
*retrieval position* ``retrieve[t] = 2 i + 1``, the position of ``v_i`` in the context
(whose token-shifted representation also carries its key ``k_i``). This is the token-pair
target of phase A (:class:`coulomb_attention.energy.TokenPairAlignment`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validation import check_positive

__all__ = ["IGNORE", "MQARConfig", "MQARData", "make_mqar"]

IGNORE = -100  # target of a position that is not a query (torch's cross-entropy default)


@dataclass(frozen=True)
class MQARConfig:
    """One difficulty level of MQAR.

    Attributes
    ----------
    vocab_size : int   ``V``: token 0 (filler), keys ``[1, V/2)``, values ``[V/2, V)``
    n_pairs : int      ``P`` key-value pairs in the context
    seq_len : int      ``L`` tokens per sequence (``>= 2 P + 2 Q``)
    n_queries : int    ``Q`` queries per sequence (``<= P``: distinct keys)
    """

    vocab_size: int = 128
    n_pairs: int = 8
    seq_len: int = 64
    n_queries: int = 8

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_pairs", "seq_len", "n_queries"):
            check_positive(name, getattr(self, name), integer=True)
        if self.n_pairs > self.n_keys:
            raise ValueError(f"n_pairs={self.n_pairs} needs at least that many keys; "
                             f"vocab_size={self.vocab_size} has {self.n_keys}")
        if self.n_queries > self.n_pairs:
            raise ValueError(f"n_queries={self.n_queries} must be <= n_pairs={self.n_pairs}")
        if self.seq_len < 2 * self.n_pairs + 2 * self.n_queries:
            raise ValueError(f"seq_len={self.seq_len} must be >= 2 n_pairs + 2 n_queries = "
                             f"{2 * self.n_pairs + 2 * self.n_queries}")

    @property
    def n_keys(self) -> int:
        return self.vocab_size // 2 - 1

    @property
    def n_values(self) -> int:
        return self.vocab_size - self.vocab_size // 2

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess among the values."""
        return 1.0 / self.n_values


@dataclass
class MQARData:
    """``n`` MQAR sequences.

    Attributes
    ----------
    inputs : LongTensor (n, L)     tokens
    targets : LongTensor (n, L)    the value to output at a query position, ``IGNORE`` elsewhere
    retrieve : LongTensor (n, L)   the context position attention must retrieve for a query
                                   position (that of the matching value), -1 elsewhere
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    retrieve: torch.Tensor

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def __getitem__(self, i):
        """``(ids (L,), mask (L,) all True, targets (L,))``: the item protocol of ``fit``."""
        ids = self.inputs[i]
        return ids, torch.ones_like(ids, dtype=torch.bool), self.targets[i]


def _distinct(n: int, pool: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, k)`` indices into ``range(pool)``, distinct within each row, uniform."""
    return torch.rand(n, pool, generator=generator).argsort(1)[:, :k]


def make_mqar(config: MQARConfig, n: int, generator: torch.Generator) -> MQARData:
    """Draw ``n`` sequences of the task ``config`` with ``generator`` (see the module doc)."""
    if not isinstance(config, MQARConfig):
        raise TypeError(f"config must be an MQARConfig, got {type(config).__name__}")
    n = check_positive("n", n, integer=True)
    P, Q, L = config.n_pairs, config.n_queries, config.seq_len
    keys = 1 + _distinct(n, config.n_keys, P, generator)  # (n, P)
    values = config.vocab_size // 2 + torch.randint(config.n_values, (n, P), generator=generator)
    inputs = torch.zeros(n, L, dtype=torch.long)
    inputs[:, 0:2 * P:2], inputs[:, 1:2 * P:2] = keys, values
    targets = torch.full((n, L), IGNORE, dtype=torch.long)
    retrieve = torch.full((n, L), -1, dtype=torch.long)
    which = _distinct(n, P, Q, generator)  # (n, Q): the pair each query asks for
    slots = _distinct(n, (L - 2 * P) // 2, Q, generator).sort(1).values  # (n, Q)
    pos = 2 * P + 2 * slots  # (n, Q) query positions
    rows = torch.arange(n)[:, None]
    inputs[rows, pos] = keys.gather(1, which)
    inputs[rows, pos + 1] = values.gather(1, which)
    targets[rows, pos] = values.gather(1, which)
    retrieve[rows, pos] = 2 * which + 1
    return MQARData(inputs, targets, retrieve)
