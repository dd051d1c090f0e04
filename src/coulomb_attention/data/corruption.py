"""Test-time token corruption: deletion, substitution by ``[UNK]``, adjacent swaps.

Only real, non-special tokens are touched (``attention_mask`` True and id not in
``special_ids``); the same seed gives the same output.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch

from .._validation import check_choice, torch_generator

__all__ = ["CORRUPTIONS", "corrupt_tokens"]

#: Kinds of corruption understood by :func:`corrupt_tokens`.
CORRUPTIONS = ("delete", "unk", "swap")


def corrupt_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    kind: str,
    rate: float,
    seed: int | torch.Generator | None = 0,
    special_ids: Iterable[int] = (),
    unk_id: int | None = None,
    pad_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt a batch of token ids at a given rate.

    Each eligible token (mask True, id not in ``special_ids``) is selected independently with
    probability ``rate`` (a Bernoulli draw per token, so ``rate`` is the expected fraction).

    - ``"delete"``: selected tokens are removed; the rest shift left, the row is padded with
      ``pad_id`` at the end and its mask shortened. The shape (n, T) is kept.
    - ``"unk"``: selected tokens are replaced by ``unk_id``.
    - ``"swap"``: scanning left to right, a selected token whose right neighbour is also
      eligible swaps with it; a token takes part in at most one swap.

    Parameters
    ----------
    input_ids : torch.LongTensor, shape (n, T)
    attention_mask : torch.BoolTensor, shape (n, T)
        True for real tokens.
    kind : {"delete", "unk", "swap"}
    rate : float in [0, 1]
    seed : int or torch.Generator
        Randomness (converted by ``_validation.torch_generator``); an int gives the same
        output every call.
    special_ids : iterable of int
        Ids never touched (e.g. ``tokenizer.special_ids``).
    unk_id : int
        Replacement id for ``kind="unk"`` (required there).
    pad_id : int
        Fill id after deletion.

    Returns
    -------
    ids : torch.LongTensor, shape (n, T)
    mask : torch.BoolTensor, shape (n, T)
        New tensors; the inputs are not modified.
    """
    check_choice("corruption kind", kind, CORRUPTIONS)
    if not isinstance(input_ids, torch.Tensor) or not isinstance(attention_mask, torch.Tensor):
        raise TypeError("input_ids and attention_mask must be torch tensors")
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            "input_ids and attention_mask must both have shape (n, T), got "
            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}"
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() or not bool(
            ((attention_mask == 0) | (attention_mask == 1)).all()
        ):
            raise TypeError("attention_mask must be a bool tensor (or 0/1 integers)")
        attention_mask = attention_mask.bool()
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 <= rate <= 1:
        raise ValueError(f"rate must be a number in [0, 1], got {rate!r}")
    if kind == "unk" and (unk_id is None or isinstance(unk_id, bool)):
        raise ValueError("kind='unk' needs unk_id (e.g. tokenizer.unk_id)")

    ids = input_ids.clone()
    mask = attention_mask.clone()
    special = torch.tensor(sorted({int(s) for s in special_ids}), dtype=ids.dtype)
    eligible = mask & ~torch.isin(ids, special.to(ids.device))  # (n, T)
    gen = torch_generator(seed)
    u = torch.rand(ids.shape, generator=gen).to(ids.device)  # one uniform per position
    selected = eligible & (u < rate)

    if kind == "unk":
        ids[selected] = int(unk_id)
        return ids, mask
    if kind == "delete":
        keep = mask & ~selected  # (n, T)
        # stable sort puts kept positions first, in their original order
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
        ids = torch.gather(ids, 1, order)
        n_keep = keep.sum(dim=1, keepdim=True)
        mask = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < n_keep
        ids[~mask] = pad_id
        return ids, mask
    # swap: sequential over positions (a token swaps at most once), vectorised over rows
    used = torch.zeros_like(mask)
    for t in range(ids.shape[1] - 1):
        do = selected[:, t] & eligible[:, t + 1] & ~used[:, t]
        if bool(do.any()):
            a, b = ids[do, t].clone(), ids[do, t + 1].clone()
            ids[do, t], ids[do, t + 1] = b, a
            used[do, t + 1] = True
    return ids, mask
