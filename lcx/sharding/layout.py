"""Sequence layouts for context parallelism: contiguous and zigzag.

A layout is a permutation of the sequence axis applied ONCE, in the data pipeline, to tokens,
targets, positions, segment ids and loss mask together. Downstream nothing un-permutes it:
attention masks are predicates on the (permuted) global positions and segment ids, and the loss
is a sum, which is order-free.

Zigzag (causal load balancing, as in MaxText's ``context_parallel_load_balance`` and Megatron's
``cp`` split): the sequence of length S is cut into ``2P`` chunks of ``S / (2P)`` tokens; device
``r`` of the ``P`` context-parallel devices holds chunks ``r`` and ``2P - 1 - r``. Contiguous
sharding then hands each device one contiguous ``S / P`` block of the permuted sequence.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Layout = Literal["contiguous", "zigzag"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def check_layout(layout: str, seq_len: int, degree: int) -> None:
    """Raise ``ValueError`` unless ``seq_len`` tokens can be laid out over ``degree`` devices.

    Args:
      layout: ``"contiguous"`` or ``"zigzag"``.
      seq_len: sequence length S in tokens.
      degree: context-parallel degree P (devices the sequence is split over).

    Raises:
      ValueError: unknown layout; ``degree < 1``; S not divisible by P (contiguous) or by 2P
        (zigzag). The message names the numbers and the nearest valid lengths. Nothing is ever
        truncated or padded silently.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown sequence layout {layout!r}; choose one of {LAYOUTS}")
    if degree < 1:
        raise ValueError(f"context-parallel degree must be >= 1, got {degree}")
    chunks = degree * (2 if layout == "zigzag" else 1)
    if seq_len % chunks:
        lo = (seq_len // chunks) * chunks
        hi = lo + chunks
        raise ValueError(
            f"sequence length {seq_len} is not divisible by {chunks} "
            f"(= context degree {degree}{' x 2 for the zigzag layout' if layout == 'zigzag' else ''}); "
            f"use train.seq_len={lo or hi} or {hi}, or change the context degree"
        )


def layout_permutation(layout: str, seq_len: int, degree: int) -> np.ndarray:
    """Permutation ``perm`` such that ``x_laid_out = x[..., perm]`` (gather along the sequence).

    Args:
      layout: ``"contiguous"`` (identity) or ``"zigzag"``.
      seq_len: S in tokens.
      degree: context-parallel degree P.

    Returns:
      int64 array ``[S]``: position ``i`` of the laid-out sequence holds original token ``perm[i]``.

    Raises:
      ValueError: see :func:`check_layout`.
    """
    check_layout(layout, seq_len, degree)
    if layout == "contiguous" or degree == 1:
        return np.arange(seq_len)
    c = seq_len // (2 * degree)
    chunks = np.arange(seq_len).reshape(2 * degree, c)
    order = [i for r in range(degree) for i in (r, 2 * degree - 1 - r)]
    return chunks[order].reshape(-1)


def inverse_permutation(layout: str, seq_len: int, degree: int) -> np.ndarray:
    """Inverse of :func:`layout_permutation`: ``x == x_laid_out[..., inv]``. int64 ``[S]``."""
    perm = layout_permutation(layout, seq_len, degree)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(seq_len)
    return inv


def apply_layout(x, layout: str, degree: int, axis: int = -1):
    """Permute ``x`` along ``axis`` (the sequence axis) into ``layout`` for ``degree`` devices.

    Works on numpy and jax arrays of any dtype; shape is unchanged.
    """
    perm = layout_permutation(layout, x.shape[axis], degree)
    return x.take(perm, axis=axis) if isinstance(x, np.ndarray) else _jnp_take(x, perm, axis)


def undo_layout(x, layout: str, degree: int, axis: int = -1):
    """Inverse of :func:`apply_layout` (for evaluation outputs such as per-token logits)."""
    inv = inverse_permutation(layout, x.shape[axis], degree)
    return x.take(inv, axis=axis) if isinstance(x, np.ndarray) else _jnp_take(x, inv, axis)


def _jnp_take(x, idx, axis):
    import jax.numpy as jnp

    return jnp.take(x, jnp.asarray(idx), axis=axis)


def causal_work_per_device(layout: str, seq_len: int, degree: int) -> np.ndarray:
    """Causal attention work per device in (query, key) pairs that the causal mask keeps.

    Counts, for each context-parallel device, the number of visible (q, k) token pairs of its
    local queries against the whole sequence (q sees k iff ``pos_k <= pos_q``). Used to verify
    load balance: zigzag gives max/mean 1.00 (up to the diagonal), contiguous gives
    ``(2P - 1) / P`` at large S (1.75 at P=4, 1.875 at P=8; the half-block count of :func:`lcx.cost.ledger.causal_imbalance`).

    Returns:
      int64 array ``[P]`` of pair counts.
    """
    perm = layout_permutation(layout, seq_len, degree)
    local = perm.reshape(degree, -1)  # global positions held by each device
    return (local + 1).sum(axis=1).astype(np.int64)
