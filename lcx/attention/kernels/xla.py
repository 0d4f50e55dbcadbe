"""Blockwise flash attention in plain JAX (the ``xla`` kernel).

Forward: an outer sequential map over query blocks and an inner scan over key/value blocks with
the online softmax (Milakov & Gimelshein 2018; Dao et al. 2022, arXiv:2205.14135), so the
largest temporary is one ``[B, K, G * block_q, block_kv]`` float32 logits tile: memory is
bounded by the block sizes, not by the sequence length. Backward: an outer scan over K/V blocks
(accumulating dK/dV of the block) and an inner scan over query blocks (emitting dQ pieces),
recomputing the probabilities from the saved logsumexp (flash-attention backward, Algorithm 2).

Every tile is classified from the min/max of its positions and segment ids (O(block) work, not
O(block^2)) into one of three cases, run with ``lax.switch``:

- hidden (:meth:`Mask.may_be_visible` is False): skipped, no arithmetic at all;
- fully visible (:meth:`Mask.all_visible`): plain softmax arithmetic, no mask evaluated;
- partial: the mask is evaluated once per tile as an additive bias ``[B, block_q, block_kv]``
  (0 or -inf, shared by all heads), so ``exp`` itself zeroes the hidden pairs.

For causal attention only the diagonal tiles are partial; with the zigzag layout a ring step
over another device's shard has none at all. On CPUs the per-element work of the softmax (mask,
max, exp, sum) costs as much as the two matmuls of a tile, so this is where the time goes.

Layouts are chosen so that every matmul is ONE batched GEMM XLA:CPU runs without per-tile
transposes of the large operands: queries are regrouped once per call to ``[B, K, G * T, H]``
(GQA: the G query heads of a kv head form the rows of one GEMM against that kv head's keys,
``[B, K, G * block_q, H] x [B, K, block_kv, H]``), K/V blocks are sliced from the caller's
``[B, S, K, H]`` (no blocked copy of K/V: for the all-gather strategy they are the whole
sequence) and transposed one small block at a time.

All arithmetic is float32 whatever the input dtype (inputs are upcast one tile at a time): this
kernel is the precise, portable one; speed on TPUs is the job of the splash kernel.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from lcx.attention.kernels.base import Kernel, output_delta
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


def _q_blocks(x: Array, n: int, K: int, G: int) -> Array:
    """``[B, T, N, ...]`` -> ``[n, B, K, G * (T / n), ...]``: query-side arrays in GEMM row order
    (query head ``k * G + g``, token ``t`` of block ``i`` is row ``g * (T / n) + t`` of block
    ``i``, kv head ``k``)."""
    B, T = x.shape[:2]
    rest = x.shape[3:]
    x = x.reshape(B, n, T // n, K, G, *rest)
    x = jnp.moveaxis(x, (1, 3, 4), (0, 2, 3))  # [n, B, K, G, bq, ...]
    return x.reshape(n, B, K, G * (T // n), *rest)


def _q_unblocks(x: Array, K: int, G: int) -> Array:
    """Inverse of :func:`_q_blocks`: ``[n, B, K, G * bq, ...]`` -> ``[B, n * bq, K * G, ...]``."""
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


class XlaKernel(Kernel):
    """Blockwise flash attention in plain JAX; GQA by grouping q heads, K/V never repeated.

    Attributes:
      block_q: query block in tokens (clamped to the local query length; see :func:`block_size`).
      block_kv: key/value block in tokens (clamped likewise).
    """

    block_q: int = 512
    block_kv: int = 512

    def __check_init__(self):
        if self.block_q < 1 or self.block_kv < 1:
            raise ValueError(f"kernel blocks must be >= 1 token, got block_q={self.block_q}, block_kv={self.block_kv}")

    def forward(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B S"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B S"],
        *,
        mask: Mask,
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        G = _groups(N, K)
        bq, bk = block_size(T, self.block_q), block_size(S, self.block_kv)
        nq, nk = T // bq, S // bk
        R = G * bq  # GEMM rows of one query block
        qb = _q_blocks(q.astype(_F32) * _scale(H), nq, K, G)  # [nq, B, K, R, H]
        qpb = jnp.moveaxis(q_pos.reshape(B, nq, bq), 1, 0)  # [nq, B, bq]
        qsb = jnp.moveaxis(q_seg.reshape(B, nq, bq), 1, 0)

        def q_block(xs):
            qi, qp, qs = xs

            def kv_step(carry, j):
                kp, ks = _seq_block(k_pos, j, bk), _seq_block(k_seg, j, bk)

                def tile(carry, bias):
                    m, l, acc = carry  # [B, K, R], [B, K, R], [B, K, R, H]
                    ki, vi = _kv_block(k, j, bk), _kv_block(v, j, bk)
                    s = _dot(qi, ki)  # [B, K, R, bk]
                    if bias is not None:
                        s = (s.reshape(B, K, G, bq, bk) + bias).reshape(B, K, R, bk)
                    m_new = jnp.maximum(m, s.max(-1))
                    if bias is not None:
                        # rows with nothing visible so far keep m = -inf; shift them by 0 instead
                        # so that exp() sees -inf - 0 = -inf (-> 0), never -inf - -inf (NaN). A
                        # fully visible tile has finite logits, so m_new is finite there.
                        m_new_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                    else:
                        m_new_safe = m_new
                    p = jnp.exp(s - m_new_safe[..., None])
                    corr = jnp.exp(m - m_new_safe)
                    l = l * corr + p.sum(-1)
                    acc = acc * corr[..., None] + _dot_n(p, vi)
                    return m_new, l, acc

                branches = [
                    lambda c: c,
                    lambda c: tile(c, None),
                    lambda c: tile(c, _bias(mask, qp, kp, qs, ks)),
                ]
                return lax.switch(tile_class(mask, qp, kp, qs, ks), branches, carry), None

            init = (
                jnp.full((B, K, R), -jnp.inf, _F32),
                jnp.zeros((B, K, R), _F32),
                jnp.zeros((B, K, R, H), _F32),
            )
            (m, l, acc), _ = lax.scan(kv_step, init, jnp.arange(nk))
            seen = l > 0
            lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
            out = acc / jnp.where(seen, l, 1.0)[..., None]
            return out, lse

        out, lse = lax.map(q_block, (qb, qpb, qsb))
        return _q_unblocks(out, K, G), _q_unblocks(lse, K, G)

    def backward(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B S"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B S"],
        out: Float[Array, "B T N H"],
        lse: Float[Array, "B T N"],
        dout: Float[Array, "B T N H"],
        *,
        mask: Mask,
        delta: Float[Array, "B T N"] | None = None,
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B S K H"], Float[Array, "B S K H"]]:
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        G = _groups(N, K)
        bq, bk = block_size(T, self.block_q), block_size(S, self.block_kv)
        nq, nk = T // bq, S // bk
        R = G * bq
        scale = _scale(H)
        if delta is None:
            delta = output_delta(out, dout)  # [B, T, N]
        delta = delta.astype(_F32)
        # a row with no visible key anywhere has lse = -inf and every logit masked: p = 0 there
        lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0).astype(_F32)
        # query-side arrays pre-blocked once in GEMM row order: the inner loop slices nothing
        qb = _q_blocks(q.astype(_F32) * scale, nq, K, G)  # [nq, B, K, R, H]
        dob = _q_blocks(dout.astype(_F32), nq, K, G)
        lseb = _q_blocks(lse_safe, nq, K, G)  # [nq, B, K, R]
        deltab = _q_blocks(delta, nq, K, G)
        qpb = jnp.moveaxis(q_pos.reshape(B, nq, bq), 1, 0)  # [nq, B, bq]
        qsb = jnp.moveaxis(q_seg.reshape(B, nq, bq), 1, 0)

        def kv_block(dq, j):
            ki, vi = _kv_block(k, j, bk), _kv_block(v, j, bk)  # [B, K, bk, H]
            kti = jnp.swapaxes(ki, 2, 3)  # [B, K, H, bk], once per K/V block
            kp, ks = _seq_block(k_pos, j, bk), _seq_block(k_seg, j, bk)

            def q_step(carry, xs):
                qi, doi, lsei, deltai, qp, qs = xs

                def tile(carry, bias):
                    # the tile is built TRANSPOSED, keys x query rows: then all five matmuls are
                    # A B or A B^T products (never A^T B, which XLA:CPU runs 2.5x slower)
                    dk, dv = carry
                    st = _dot(ki, qi)  # [B, K, bk, R]
                    if bias is not None:
                        st = (st.reshape(B, K, bk, G, bq) + bias).reshape(B, K, bk, R)
                    pt = jnp.exp(st - lsei[:, :, None, :])
                    dpt = _dot(vi, doi)  # [B, K, bk, R]
                    dst = pt * (dpt - deltai[:, :, None, :])
                    dv = dv + _dot_n(pt, doi)  # [B, K, bk, H]
                    dk = dk + _dot_n(dst, qi)
                    return (dk, dv), _dot_n(kti, dst)  # dq piece, transposed: [B, K, H, R]

                zero_dq = jnp.zeros((B, K, H, R), _F32)
                branches = [
                    lambda c: (c, zero_dq),
                    lambda c: tile(c, None),
                    lambda c: tile(c, _bias_t(mask, qp, kp, qs, ks)),
                ]
                return lax.switch(tile_class(mask, qp, kp, qs, ks), branches, carry)

            zero_kv = jnp.zeros((B, K, bk, H), _F32)
            (dk, dv), dq_parts = lax.scan(q_step, (zero_kv, zero_kv), (qb, dob, lseb, deltab, qpb, qsb))
            return dq + dq_parts, (dk, dv)

        dq0 = jnp.zeros((nq, B, K, H, R), _F32)
        dq, (dk, dv) = lax.scan(kv_block, dq0, jnp.arange(nk))
        dq = _q_unblocks(jnp.swapaxes(dq, 3, 4), K, G) * scale

        def kv_unblock(x):  # [nk, B, K, bk, H] -> [B, S, K, H]
            return jnp.moveaxis(x, (0, 3), (1, 2)).reshape(B, S, K, H)

        return dq, kv_unblock(dk), kv_unblock(dv)


def _groups(n_heads: int, n_kv_heads: int) -> int:
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads {n_heads} must be a multiple of kv heads {n_kv_heads} (GQA)")
    return n_heads // n_kv_heads
