"""Sequence layouts for context parallelism: contiguous, zigzag and balanced.

A layout is a permutation of the sequence axis applied ONCE, in the data pipeline, to tokens,
targets, positions, segment ids and loss mask together. Downstream nothing un-permutes it:
attention masks are predicates on the (permuted) global positions and segment ids, and the loss
is a sum, which is order-free.

Zigzag (causal load balancing, as in MaxText's ``context_parallel_load_balance`` and Megatron's
``cp`` split): the sequence of length S is cut into ``2P`` chunks of ``S / (2P)`` tokens; device
``r`` of the ``P`` context-parallel devices holds chunks ``r`` and ``2P - 1 - r``. Contiguous
sharding then hands each device one contiguous ``S / P`` block of the permuted sequence.

Balanced (document-aware load balancing): zigzag equalises the causal work of ONE document; with
packed documents the visible pairs under a causal AND document mask depend on where the document
boundaries fall. The balanced layout is computed per row from its positions and segment ids: the
row is cut into ``k P`` chunks (:func:`balanced_chunks`), each chunk's work is the visible pairs
of its queries, ``sum(position + 1)`` over its tokens (positions count from each document
piece's start, so a query at position ``p`` sees exactly ``p + 1`` keys of its own document;
padding, a negative segment id, sees none), and the chunks are assigned to devices by the
longest-processing-time rule with equal counts (the largest remaining chunk goes to the least
loaded device that still has room; ties to the lower chunk index and device). Each device keeps
its chunks in their original order, so a shard's segment ids stay sorted and the kernels' block
tests stay tight. The permutation is a pure function of the row: deterministic, and resumed
exactly with the data position. Without segment ids (``positions=None``) it balances one
document. The rule: Graham 1969, "Bounds on multiprocessing timing anomalies" (LPT); the idea of
balancing packed documents per device: torchtitan's per-document head-tail context-parallel
layout.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Layout = Literal["contiguous", "zigzag", "balanced"]
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag", "balanced")
PER_ROW: tuple[str, ...] = ("balanced",)
"""Layouts whose permutation depends on each row's positions and segment ids."""
BALANCED_BLOCK = 512
"""Default tile (tokens) the balanced layout keeps its chunks at least as long as (lcx's default
``plan.attention.block_q`` / ``block_kv``)."""


def check_layout(layout: str, seq_len: int, degree: int) -> None:
    """Raise ``ValueError`` unless ``seq_len`` tokens can be laid out over ``degree`` devices.

    Args:
      layout: ``"contiguous"``, ``"zigzag"`` or ``"balanced"``.
      seq_len: sequence length S in tokens.
      degree: context-parallel degree P (devices the sequence is split over).

    Raises:
      ValueError: unknown layout; ``degree < 1``; S not divisible by P (contiguous) or by 2P
        (zigzag, balanced). The message names the numbers and the nearest valid lengths. Nothing is ever
        truncated or padded silently.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown sequence layout {layout!r}; choose one of {LAYOUTS}")
    if degree < 1:
        raise ValueError(f"context-parallel degree must be >= 1, got {degree}")
    chunks = degree * (1 if layout == "contiguous" else 2)
    if seq_len % chunks:
        lo = (seq_len // chunks) * chunks
        hi = lo + chunks
        raise ValueError(
            f"sequence length {seq_len} is not divisible by {chunks} "
            f"(= context degree {degree}{'' if layout == 'contiguous' else f' x 2 for the {layout} layout'}); "
            f"use train.seq_len={lo or hi} or {hi}, or change the context degree"
        )


def layout_permutation(
    layout: str, seq_len: int, degree: int, *, positions=None, segment_ids=None, block: int = BALANCED_BLOCK
) -> np.ndarray:
    """Permutation ``perm`` such that ``x_laid_out = x[..., perm]`` (gather along the sequence).

    Args:
      layout: ``"contiguous"`` (identity), ``"zigzag"`` or ``"balanced"``.
      seq_len: S in tokens.
      degree: context-parallel degree P.
      positions: int ``[S]`` of one row in its original order (``balanced`` only; None: one
        document, positions ``0 .. S-1``).
      segment_ids: int ``[S]`` of the same row (``balanced`` only; None: one document).
      block: ``balanced`` only: the kernels' tile in tokens; chunks are at least this long where
        the length allows, so no tile straddles two chunks (:func:`balanced_chunks`).

    Returns:
      int64 array ``[S]``: position ``i`` of the laid-out sequence holds original token ``perm[i]``.

    Raises:
      ValueError: see :func:`check_layout`; ids of another length than ``seq_len``.
    """
    check_layout(layout, seq_len, degree)
    if layout == "contiguous" or degree == 1:
        return np.arange(seq_len)
    if layout == "balanced":
        pos = np.arange(seq_len) if positions is None else np.asarray(positions)
        seg = np.ones(seq_len, np.int64) if segment_ids is None else np.asarray(segment_ids)
        if pos.shape != (seq_len,) or seg.shape != (seq_len,):
            raise ValueError(
                f"balanced layout: positions {pos.shape} and segment_ids {seg.shape} must both be [{seq_len}] "
                "(one row, in its original order)"
            )
        return balanced_permutation(pos, seg, degree, block=block)
    c = seq_len // (2 * degree)
    chunks = np.arange(seq_len).reshape(2 * degree, c)
    order = [i for r in range(degree) for i in (r, 2 * degree - 1 - r)]
    return chunks[order].reshape(-1)


def balanced_chunks(seq_len: int, degree: int, block: int = BALANCED_BLOCK) -> int:
    """Chunks per device of the balanced layout: the largest ``k`` of 8, 4, 2 that cuts the row
    into equal chunks (``seq_len % (k P) == 0``) of at least ``block`` tokens, else 2 (which
    :func:`check_layout` guarantees). More chunks balance finer; a chunk shorter than a kernel tile
    would make tiles straddle chunks that need not be neighbours."""
    ks = [k for k in (8, 4, 2) if seq_len % (k * degree) == 0]
    return next((k for k in ks if seq_len // (k * degree) >= block), ks[-1])


def balanced_permutation(positions, segment_ids, degree: int, *, block: int = BALANCED_BLOCK) -> np.ndarray:
    """The balanced layout of one row (module docstring): int64 ``[S]``, ``x[perm]`` laid out.

    Args:
      positions: int ``[S]``, each token's position within its document piece.
      segment_ids: int ``[S]``, document piece ids (negative: padding).
      degree: context-parallel degree P (``S % 2P == 0``).
      block: the kernels' tile in tokens (:func:`balanced_chunks`).
    """
    S = positions.shape[-1]
    k = balanced_chunks(S, degree, block)
    n, c = k * degree, S // (k * degree)
    cost = np.where(np.asarray(segment_ids) >= 0, np.asarray(positions, np.int64) + 1, 0).reshape(n, c).sum(-1)
    load = np.zeros(degree, np.int64)
    room = np.full(degree, k)
    owner = np.empty(n, np.int64)
    for i in np.argsort(-cost, kind="stable"):  # largest first; ties: lower chunk index
        d = int(np.argmin(np.where(room > 0, load, np.iinfo(np.int64).max)))  # ties: lower device
        owner[i], load[d], room[d] = d, load[d] + cost[i], room[d] - 1
    order = np.argsort(owner, kind="stable")  # device by device, each device's chunks in order
    return (order[:, None] * c + np.arange(c)).reshape(-1)


def document_work_per_device(perm: np.ndarray, positions, segment_ids, degree: int) -> np.ndarray:
    """Visible (query, key) pairs per device under a causal AND document mask: int64 ``[P]``.

    A query at position ``p`` of its document piece sees the ``p + 1`` keys of its piece up to
    itself, wherever they sit, so a device's work is ``sum(p + 1)`` over the queries it holds (no
    S^2 array; padding sees nothing). ``perm``: the row's layout permutation; positions and
    segment ids in the original order.
    """
    w = np.where(np.asarray(segment_ids) >= 0, np.asarray(positions, np.int64) + 1, 0)
    return w[perm].reshape(degree, -1).sum(-1)


def inverse_permutation(layout: str, seq_len: int, degree: int) -> np.ndarray:
    """Inverse of :func:`layout_permutation`: ``x == x_laid_out[..., inv]``. int64 ``[S]``."""
    perm = layout_permutation(layout, seq_len, degree)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(seq_len)
    return inv


def row_permutations(layout: str, positions, segment_ids, degree: int, *, block: int = BALANCED_BLOCK) -> np.ndarray:
    """The layout permutation of every row of a batch: int64 ``[..., S]`` for ids ``[..., S]``
    (one row's :func:`layout_permutation` each; the same row for a layout that is not per-row)."""
    pos, seg = np.asarray(positions), np.asarray(segment_ids)
    S = pos.shape[-1]
    if layout not in PER_ROW:
        return np.broadcast_to(layout_permutation(layout, S, degree), pos.shape)
    flat = [
        layout_permutation(layout, S, degree, positions=p, segment_ids=g, block=block)
        for p, g in zip(pos.reshape(-1, S), seg.reshape(-1, S))
    ]
    return np.stack(flat).reshape(pos.shape)


def apply_layout(
    x, layout: str, degree: int, axis: int = -1, *, positions=None, segment_ids=None, block=BALANCED_BLOCK
):
    """Permute ``x`` along ``axis`` (the sequence axis) into ``layout`` for ``degree`` devices.

    Works on numpy and jax arrays of any dtype; shape is unchanged. ``balanced`` (NumPy) lays out
    each row by its own original ``positions`` and ``segment_ids``, int ``x.shape[: axis + 1]``
    (the batch dimensions and the sequence; None: one document per row), for the kernels'
    ``block``; dimensions after ``axis`` (heads, features) follow their token.
    """
    if layout not in PER_ROW:
        perm = layout_permutation(layout, x.shape[axis], degree)
        return x.take(perm, axis=axis) if isinstance(x, np.ndarray) else _jnp_take(x, perm, axis)
    x = np.asarray(x)
    ax = axis % x.ndim
    rows = x.shape[: ax + 1]
    pos = np.broadcast_to(np.arange(rows[-1]), rows) if positions is None else positions
    seg = np.ones(rows, np.int64) if segment_ids is None else segment_ids
    return _gather_rows(x, ax, row_permutations(layout, pos, seg, degree, block=block))


def undo_layout(x, layout: str, degree: int, axis: int = -1, *, positions=None, segment_ids=None):
    """Inverse of :func:`apply_layout` (for evaluation outputs such as per-token logits).

    Args:
      x: laid-out array; its ``axis`` is the sequence.
      layout: as for :func:`apply_layout`.
      degree: as for :func:`apply_layout`.
      positions: ``balanced`` only: the LAID-OUT rows' int positions, ``x.shape[: axis + 1]``.
        The original order is recovered by sorting on (segment id, position), padding last:
        lcx.data packs segment ids increasing along a row and positions increasing within a
        segment.
      segment_ids: ``balanced`` only: the laid-out rows' int segment ids, the same shape.

    Raises:
      ValueError: ``balanced`` without the laid-out ids, or ids of another shape.
    """
    if layout not in PER_ROW:
        inv = inverse_permutation(layout, x.shape[axis], degree)
        return x.take(inv, axis=axis) if isinstance(x, np.ndarray) else _jnp_take(x, inv, axis)
    x = np.asarray(x)
    ax = axis % x.ndim
    if positions is None or segment_ids is None or np.shape(positions) != x.shape[: ax + 1]:
        raise ValueError(
            f"undo_layout({layout!r}) needs the laid-out rows' positions and segment_ids of shape {x.shape[: ax + 1]}"
        )
    pos, seg = np.asarray(positions, np.int64), np.asarray(segment_ids, np.int64)
    seg = np.where(seg < 0, np.iinfo(np.int64).max, seg)
    return _gather_rows(x, ax, np.lexsort((pos, seg), axis=-1))  # sorts by segment, then position


def _gather_rows(x: np.ndarray, axis: int, perm: np.ndarray) -> np.ndarray:
    """``x`` gathered along ``axis`` by per-row indices ``perm`` of shape ``x.shape[: axis + 1]``."""
    return np.take_along_axis(x, perm.reshape(perm.shape + (1,) * (x.ndim - axis - 1)), axis=axis)


def _jnp_take(x, idx, axis):
    import jax.numpy as jnp

    return jnp.take(x, jnp.asarray(idx), axis=axis)


def causal_work_per_device(layout: str, seq_len: int, degree: int) -> np.ndarray:
    """Causal attention work per device in (query, key) pairs that the causal mask keeps.

    Counts, for each context-parallel device, the number of visible (q, k) token pairs of its
    local queries against the whole sequence (q sees k iff ``pos_k <= pos_q``). Used to verify
    load balance: zigzag gives max/mean 1.00 (up to the diagonal), contiguous gives
    ``(2P - 1) / P`` at large S (1.75 at P=4, 1.875 at P=8; the half-block count of :func:`lcx.cost.balance.causal_imbalance`).

    Returns:
      int64 array ``[P]`` of pair counts.
    """
    perm = layout_permutation(layout, seq_len, degree)
    local = perm.reshape(degree, -1)  # global positions held by each device
    return (local + 1).sum(axis=1).astype(np.int64)
