"""Tiles of the ``xla`` kernel (:mod:`lcx.attention.kernels.xla`): block sizes, tile classes,
GEMM-ordered query blocks, per-block K/V slices and the mask as an additive bias.

Einsum letters (Gemma convention): B batch, T query length, S key length, N query heads,
K kv heads, G = N / K, H head dim; ``R = G * bq`` GEMM rows of a query block.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array

from lcx.attention.masks import Mask

_F32 = jnp.float32

# tile classes (lax.switch branch indices)
HIDDEN, FULL, PARTIAL = 0, 1, 2


def block_size(length: int, block: int) -> int:
    """Largest divisor of ``length`` that is ``<= block`` (tokens): the block is clamped to the
    local length, and a block that does not divide it shrinks rather than padding."""
    b = max(1, min(block, length))
    while length % b:
        b -= 1
    return b


def tile_class(mask: Mask, qp, kp, qs, ks) -> Array:
    """int32 scalar: :data:`HIDDEN`, :data:`FULL` or :data:`PARTIAL` for one (query, key) tile,
    from the O(t + s) block predicates of :class:`Mask`."""
    return jnp.where(
        mask.may_be_visible(qp, kp, qs, ks),
        jnp.where(mask.all_visible(qp, kp, qs, ks), FULL, PARTIAL),
        HIDDEN,
    ).astype(jnp.int32)


def _scale(h: int) -> float:
    # The ONE place the softmax scale lives. The forward multiplies q by it; the backward reuses
    # it for the chain rule of that same linear map (dq = scale * dq_scaled).
    return 1.0 / (h**0.5)


def _dot(a: Array, b: Array) -> Array:
    """``[B, K, M, H] x [B, K, R, H] -> [B, K, M, R]`` (contract H, batch B and K): one GEMM
    ``A B^T`` per (B, K)."""
    return lax.dot_general(a, b, (((3,), (3,)), ((0, 1), (0, 1))), preferred_element_type=_F32)


def _dot_n(a: Array, b: Array) -> Array:
    """``[B, K, M, R] x [B, K, R, H] -> [B, K, M, H]`` (contract R: ``a b`` per batch)."""
    return lax.dot_general(a, b, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=_F32)


def _bias(mask: Mask, qp, kp, qs, ks) -> Array:
    """Additive mask ``[B, 1, 1, t, s]``: 0 where visible, -inf where hidden (shared by heads)."""
    vis = mask.visible(qp, kp, qs, ks)
    return jnp.where(vis, 0.0, -jnp.inf).astype(_F32)[:, None, None]


def _bias_t(mask: Mask, qp, kp, qs, ks) -> Array:
    """The transposed additive mask ``[B, 1, s, 1, t]`` (keys x queries; broadcast over the K
    and G axes of a ``[B, K, s, G, t]`` transposed tile)."""
    vis = jnp.swapaxes(mask.visible(qp, kp, qs, ks), 1, 2)
    return jnp.where(vis, 0.0, -jnp.inf).astype(_F32)[:, None, :, None, :]


def _q_unblocks(x: Array, K: int, G: int) -> Array:
    """Blocked query-side results ``[n, B, K, G * bq, ...]`` (GEMM row order, see :func:`_q_tile`)
    -> ``[B, n * bq, K * G, ...]``."""
    n, B = x.shape[:2]
    rest = x.shape[4:]
    bq = x.shape[3] // G
    x = x.reshape(n, B, K, G, bq, *rest)
    x = jnp.moveaxis(x, (0, 2, 3), (1, 3, 4))  # [B, n, bq, K, G, ...]
    return x.reshape(B, n * bq, K * G, *rest)


def _kv_block(x: Array, j, size: int) -> Array:
    """Block ``j`` of ``[B, S, K, H]`` as float32 ``[B, K, size, H]`` (a small per-block
    transpose; K/V are never copied whole)."""
    return jnp.swapaxes(lax.dynamic_slice_in_dim(x, j * size, size, axis=1), 1, 2).astype(_F32)


def _seq_block(x: Array, j, size: int) -> Array:
    return lax.dynamic_slice_in_dim(x, j * size, size, axis=1)


def _q_tile(x: Array, i, size: int, K: int, G: int) -> Array:
    """Query block ``i`` of ``[B, T, N, ...]`` in GEMM row order, ``[B, K, G * size, ...]`` (row
    ``g * size + t`` is token ``t`` of query head ``k * G + g``): a per-block transpose, free
    when ``G == 1`` (the ring's one-kv-head passes)."""
    B = x.shape[0]
    rest = x.shape[3:]
    x = lax.dynamic_slice_in_dim(x, i * size, size, axis=1).reshape(B, size, K, G, *rest)
    return jnp.moveaxis(x, 1, 3).reshape(B, K, G * size, *rest)


def _kv_add(acc: Array, tile: Array, j, size: int) -> Array:
    """``acc[:, j * size : (j + 1) * size] += tile`` for ``acc`` ``[B, S, K, H]`` and a
    ``[B, K, size, H]`` tile (transposed back one block at a time; in place in a loop carry)."""
    part = lax.dynamic_slice_in_dim(acc, j * size, size, axis=1) + jnp.swapaxes(tile, 1, 2)
    return lax.dynamic_update_slice_in_dim(acc, part, j * size, axis=1)


def _groups(n_heads: int, n_kv_heads: int) -> int:
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads {n_heads} must be a multiple of kv heads {n_kv_heads} (GQA)")
    return n_heads // n_kv_heads
