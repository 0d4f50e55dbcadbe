"""Blockwise flash attention in plain JAX (the ``xla`` kernel).

Forward: an outer sequential map over query blocks and an inner scan over key/value blocks with
the online softmax (Milakov & Gimelshein 2018; Dao et al. 2022, arXiv:2205.14135), so the
largest temporary is one ``[B, K, G, block_q, block_kv]`` float32 logits tile: memory is
bounded by the block sizes, not by the sequence length. Backward: an outer scan over K/V blocks
(accumulating dK/dV of the block) and an inner scan over query blocks (emitting dQ pieces),
recomputing the probabilities from the saved logsumexp (flash-attention backward, Algorithm 2).

Blocks whose positions/segment ids prove that the mask hides every pair
(:meth:`Mask.may_be_visible`) are skipped with ``lax.cond``: for causal attention about half the
tiles, for sliding windows and packed documents most of them.

All arithmetic is float32 whatever the input dtype (inputs are upcast one tile at a time): this
kernel is the precise, portable one; speed is the job of the splash kernel.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from lcx.attention.kernels.base import Kernel
from lcx.attention.masks import Mask

_F32 = jnp.float32


def block_size(length: int, block: int) -> int:
    """Largest divisor of ``length`` that is ``<= block`` (tokens): the block is clamped to the
    local length, and a block that does not divide it shrinks rather than padding."""
    b = max(1, min(block, length))
    while length % b:
        b -= 1
    return b


def _prescale(x: Array) -> Array:
    # The ONE place the softmax scale lives. The forward multiplies q by it; the backward reuses
    # it for the chain rule of that same linear map (dq = scale * dq_scaled).
    return x * jnp.asarray(1.0 / (x.shape[-1] ** 0.5), x.dtype)


def _slice(arrays, i, size: int):
    """Block ``i`` (``size`` tokens) of each ``[B, L, ...]`` array along the sequence axis."""
    return tuple(lax.dynamic_slice_in_dim(x, i * size, size, axis=1) for x in arrays)


def _unblocks(x: Array) -> Array:
    """[n, B, L / n, ...] (per-block loop outputs) -> [B, L, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


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

        def q_block(i):
            qi, qp, qs = _slice((q, q_pos, q_seg), i, bq)
            qi = _prescale(qi.astype(_F32)).reshape(B, bq, K, G, H)

            def kv_step(carry, j):
                # slice blocks inside the loop (not a pre-blocked transposed copy of K/V): for the
                # all-gather strategy K/V are the whole sequence and a copy would double them
                ki, vi, kp, ks = _slice((k, v, k_pos, k_seg), j, bk)

                def compute(carry):
                    m, l, acc = carry  # [B, K, G, bq], same, [B, K, G, bq, H]
                    s = jnp.einsum("BTKGH,BSKH->BKGTS", qi, ki.astype(_F32))
                    vis = mask.visible(qp, kp, qs, ks)[:, None, None]
                    s = jnp.where(vis, s, -jnp.inf)
                    m_new = jnp.maximum(m, s.max(-1))
                    # rows with nothing visible so far keep m = -inf; shift them by 0 instead so
                    # that exp() sees -inf - 0 = -inf (-> 0), never -inf - -inf (NaN)
                    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                    p = jnp.where(vis, jnp.exp(s - m_safe[..., None]), 0.0)
                    corr = jnp.exp(m - m_safe)
                    l = l * corr + p.sum(-1)
                    acc = acc * corr[..., None] + jnp.einsum("BKGTS,BSKH->BKGTH", p, vi.astype(_F32))
                    return m_new, l, acc

                return lax.cond(mask.may_be_visible(qp, kp, qs, ks), compute, lambda c: c, carry), None

            init = (
                jnp.full((B, K, G, bq), -jnp.inf, _F32),
                jnp.zeros((B, K, G, bq), _F32),
                jnp.zeros((B, K, G, bq, H), _F32),
            )
            (m, l, acc), _ = lax.scan(kv_step, init, jnp.arange(nk))
            seen = l > 0
            lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
            out = acc / jnp.where(seen, l, 1.0)[..., None]
            return jnp.moveaxis(out, 3, 1), jnp.moveaxis(lse, 3, 1)  # [B,bq,K,G,H], [B,bq,K,G]

        out, lse = lax.map(q_block, jnp.arange(nq))
        return _unblocks(out).reshape(B, T, N, H), _unblocks(lse).reshape(B, T, N)

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
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B S K H"], Float[Array, "B S K H"]]:
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        G = _groups(N, K)
        bq, bk = block_size(T, self.block_q), block_size(S, self.block_kv)
        nq, nk = T // bq, S // bk
        delta = jnp.sum(dout.astype(_F32) * out.astype(_F32), axis=-1)  # [B, T, N]
        # a row with no visible key anywhere has lse = -inf and every logit masked: p = 0 there
        lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0).astype(_F32)

        def kv_block(dq, j):
            ki, vi, kp, ks = _slice((k, v, k_pos, k_seg), j, bk)
            ki, vi = ki.astype(_F32), vi.astype(_F32)

            def q_step(carry, i):
                qi, doi, lsei, deltai, qp, qs = _slice((q, dout, lse_safe, delta, q_pos, q_seg), i, bq)
                qi = _prescale(qi.astype(_F32)).reshape(B, bq, K, G, H)
                doi = doi.astype(_F32).reshape(B, bq, K, G, H)
                lsei, deltai = lsei.reshape(B, bq, K, G), deltai.reshape(B, bq, K, G)

                def compute():
                    s = jnp.einsum("BTKGH,BSKH->BKGTS", qi, ki)
                    vis = mask.visible(qp, kp, qs, ks)[:, None, None]
                    lse_t = jnp.moveaxis(lsei, 1, 3)[..., None]  # [B, K, G, bq, 1]
                    p = jnp.where(vis, jnp.exp(jnp.where(vis, s, 0.0) - lse_t), 0.0)
                    dv = jnp.einsum("BKGTS,BTKGH->BSKH", p, doi)
                    dp = jnp.einsum("BTKGH,BSKH->BKGTS", doi, vi)
                    ds = p * (dp - jnp.moveaxis(deltai, 1, 3)[..., None])
                    dq = jnp.einsum("BKGTS,BSKH->BTKGH", ds, ki)
                    dk = jnp.einsum("BKGTS,BTKGH->BSKH", ds, qi)
                    return dq, dk, dv

                def skip():
                    return (
                        jnp.zeros((B, bq, K, G, H), _F32),
                        jnp.zeros((B, bk, K, H), _F32),
                        jnp.zeros((B, bk, K, H), _F32),
                    )

                dq_c, dk_c, dv_c = lax.cond(mask.may_be_visible(qp, kp, qs, ks), compute, skip)
                return (carry[0] + dk_c, carry[1] + dv_c), dq_c

            zero_kv = jnp.zeros((B, bk, K, H), _F32)
            (dk, dv), dq_parts = lax.scan(q_step, (zero_kv, zero_kv), jnp.arange(nq))
            return dq + dq_parts, (dk, dv)

        dq0 = jnp.zeros((nq, B, bq, K, G, H), _F32)
        dq, (dk, dv) = lax.scan(kv_block, dq0, jnp.arange(nk))
        dq = _prescale(_unblocks(dq).reshape(B, T, N, H))
        return dq, _unblocks(dk), _unblocks(dv)


def _groups(n_heads: int, n_kv_heads: int) -> int:
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads {n_heads} must be a multiple of kv heads {n_kv_heads} (GQA)")
    return n_heads // n_kv_heads


