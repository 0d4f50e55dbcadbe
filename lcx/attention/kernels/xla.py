"""Blockwise flash attention in plain JAX (the ``xla`` kernel).

Forward: an outer loop over query blocks and an inner scan over key/value blocks with the online
softmax (Milakov & Gimelshein 2018; Dao et al. 2022, arXiv:2205.14135), so the largest
temporary is one ``[B, K, G * block_q, block_kv]`` float32 logits tile: memory is bounded by the
block sizes, not by the sequence length. Backward: an outer loop over K/V blocks (accumulating
dK/dV of the block, then adding it into the caller's dK/dV) and an inner loop over query blocks
(adding dQ pieces into one blocked dQ accumulator, in place), recomputing the probabilities from
the saved logsumexp (flash-attention backward, Algorithm 2).

Both are written as the accumulating form of :class:`AbstractKernel` (``forward_start`` /
``forward_step`` / ``forward_finish`` and the ``backward_`` three), ``forward`` and ``backward``
being one step of it. A caller with many K/V blocks against the same queries (the ring) thus
prepares the queries once, and the online softmax's state ``(m, l, acc)`` simply continues from
one K/V block to the next: no per-block partial result, no merge, no whole-shard copies.

The backward has its own blocks, ``block_q_dkv`` x ``block_kv_dkv`` (default: the forward's;
named after splash's ``BlockSizes``): it holds three float32 ``[B, K, bk, G * bq]`` tiles at once
(the probabilities, dP and dS), the forward about one, so smaller backward blocks shrink that
fixed cost (128 instead of 256 keys halves it) while the forward keeps its own, faster blocks.

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
transposes of the large operands: each query block is regrouped to ``[B, K, G * block_q, H]``
where it is used (GQA: the G query heads of a kv head form the rows of one GEMM against that kv
head's keys, ``[B, K, G * block_q, H] x [B, K, block_kv, H]``; with G = 1, the ring's one kv
head per pass, that is a plain slice), K/V blocks are sliced from the caller's ``[B, S, K, H]``
(no blocked copy of K/V: for the all-gather strategy they are the whole sequence) and
transposed one small block at a time. The prepared queries stay in the caller's layout: a
blocked copy of them made before a caller's loop over K/V blocks is kept by XLA:CPU in two
layouts (one read inside the loop, one after it), a whole-shard buffer more than needed.

All arithmetic is float32 whatever the input dtype (inputs are upcast one tile at a time): this
kernel is the precise, portable one; speed on TPUs is the job of the splash kernel.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from lcx.attention.blocks import Cotangent, Grads, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels.base import AbstractKernel, GradAccumulator, KernelCall, as_blocks
from lcx.attention.kernels.xla_tiles import FULL as FULL
from lcx.attention.kernels.xla_tiles import HIDDEN as HIDDEN
from lcx.attention.kernels.xla_tiles import PARTIAL as PARTIAL
from lcx.attention.kernels.xla_tiles import (
    _bias,
    _bias_t,
    _dot,
    _dot_n,
    _groups,
    _kv_add,
    _kv_block,
    _q_tile,
    _q_unblocks,
    _scale,
    _seq_block,
)
from lcx.attention.kernels.xla_tiles import block_size as block_size
from lcx.attention.kernels.xla_tiles import tile_class as tile_class
from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes

_F32 = jnp.float32


class XlaKernel(AbstractKernel):
    """Blockwise flash attention in plain JAX; GQA by grouping q heads, K/V never repeated.

    Build it with ``XlaKernel(BlockSizes(...))`` or ``XlaKernel(block_q=..., block_kv=...,
    block_q_dkv=..., block_kv_dkv=...)`` (the :class:`~lcx.sharding.blocks.BlockSizes` fields).

    Attributes:
      blocks: ``block_q`` / ``block_kv``: forward blocks in tokens (clamped to the local lengths;
        see :func:`block_size`); ``block_q_dkv`` / ``block_kv_dkv``: the backward's
        (``backward_start``/``backward_step``; None: the forward's), clamped likewise. The
        backward's three float32 tiles are ``[B, K, block_kv_dkv, G * block_q_dkv]`` each.

    Raises:
      ValueError: a block < 1 token.
    """

    blocks: BlockSizes = eqx.field(static=True)

    def __init__(self, *blocks: BlockSizes | int | None, **block_sizes: int | None):
        self.blocks = as_blocks(blocks, block_sizes)

    @classmethod
    def check_blocks(cls, blocks: BlockSizes) -> None:
        return None  # any block >= 1 token: a block that does not divide a length shrinks (block_size)

    @property
    def backward_blocks(self) -> tuple[int, int]:
        """``(query, key)`` blocks of the backward in tokens, before clamping: the ``*_dkv``
        ones, or the forward's where those are None."""
        return self.blocks.backward

    # -- memory price (the ledger: lcx.cost.attention_memory) -----------------------------------
    @classmethod
    def forward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """float32, with ``b, t, n, h`` = batch, query length, heads, head width: the scaled q and
        the unnormalised output accumulator, ``2 b t n h``; the running max and sum, ``2 b t n``;
        and the logits and probabilities of one (query block, key block) step, ``2 b n bq bk``
        (the forward's blocks, clamped to the lengths)."""
        b, t, s, n, h = call.local_batch, call.q_len, call.kv_len, call.q_heads, call.head_dim
        bq, bk = block_size(t, blocks.block_q), block_size(s, blocks.block_kv)
        return 4 * b * (2 * t * n * h + 2 * t * n) + 2 * 4 * b * n * bq * bk

    @classmethod
    def backward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """``backward_start``, one ``backward_step`` over all K/V blocks, ``backward_finish``, all
        float32, with ``b, t, s, n, k, h`` = batch, query and key lengths, heads, kv heads, head
        width: the incoming cotangent dout ``b t n h`` (``a`` bytes) and, unless it is already
        float32, its float32 copy; the scaled float32 q and the blocked dQ accumulator,
        ``2 b t n h`` (at the end the accumulator and the unblocked dQ); logsumexp and delta,
        ``2 b t n``; the dK/dV accumulators the kernel adds into, ``2 b s k h``; and the tiles of
        one (query block, key block) step, ``[b, k, bk, G bq]`` with ``G = n / k`` (GEMM rows):
        the probabilities, dP and dS are live together (the logits are consumed by the exp that
        makes the probabilities), ``3 b n bq bk``; ``bq, bk`` are the BACKWARD's blocks
        (:attr:`BlockSizes.backward`), clamped to the lengths (:func:`block_size`)."""
        b, t, s, n, k, h = call.local_batch, call.q_len, call.kv_len, call.q_heads, call.kv_heads, call.head_dim
        a, f32 = call.act_bytes, 4
        dout = b * t * n * h * a
        bq_dkv, bk_dkv = blocks.backward
        bq, bk = block_size(t, bq_dkv), block_size(s, bk_dkv)
        dout_f32 = 0 if a == f32 else b * t * n * h * f32
        return dout + dout_f32 + f32 * b * (2 * t * n * h + 2 * t * n + 2 * s * k * h) + 3 * f32 * b * n * bq * bk

    @classmethod
    def prologue_bytes(cls, call: KernelCall) -> int:
        """The scaled float32 q and the blocked float32 dQ accumulator, ``2 b t n h``, and the
        zeroed float32 dK/dV accumulators, ``2 b s k h`` (part of :meth:`backward_bytes`)."""
        b, t, s, n, k, h = call.local_batch, call.q_len, call.kv_len, call.q_heads, call.kv_heads, call.head_dim
        return 4 * b * (2 * t * n * h + 2 * s * k * h)

    def step_tile_bytes(self, batch: int, q_len: int, kv_len: int, group: int) -> int:
        """float32 tiles live together for one kv head: the forward's logits and probabilities,
        ``2 x [G * block_q, block_kv]``, or the backward's probabilities, dP and dS,
        ``3 x [block_kv_dkv, G * block_q_dkv]``, whichever is larger (blocks clamped to the
        lengths by :func:`block_size`), times ``batch``."""
        bq, bk = block_size(q_len, self.blocks.block_q), block_size(kv_len, self.blocks.block_kv)
        dq, dk = self.backward_blocks
        bqd, bkd = block_size(q_len, dq), block_size(kv_len, dk)
        return 4 * batch * group * max(2 * bq * bk, 3 * bqd * bkd)

    def forward(self, q: QueryBlock, kv: KVBlock, *, mask: Mask) -> OutLse:
        prepared, acc = self.forward_start(q, kv_heads=kv.k.shape[2])
        return self.forward_finish(prepared, self.forward_step(prepared, acc, kv, mask=mask))

    def backward(self, q: QueryBlock, kv: KVBlock, ct: Cotangent, *, mask: Mask) -> Grads:
        prepared, dq = self.backward_start(q, ct, kv_heads=kv.k.shape[2])
        zero = jnp.zeros(kv.k.shape, _F32)
        dq, dk, dv = self.backward_step(prepared, (dq, zero, zero), kv, mask=mask)
        return self.backward_finish(prepared, dq), dk, dv

    # The accumulating form (AbstractKernel.forward_start & co.): the query side is scaled and upcast
    # ONCE, and the running results stay blocked in GEMM row order ([nq, B, K, G * bq, ...])
    # across all steps: the forward carries the online softmax's (m, l, acc) itself from one K/V
    # block to the next (a ring step is a continuation of the kernel's inner loop, not a separate
    # result merged afterwards), the backward adds dQ pieces into one blocked accumulator, and
    # dK/dV go straight into the caller's [B, S, K, H] accumulators, one K/V block at a time.

    def forward_start(self, q: QueryBlock, *, kv_heads: int) -> tuple[tuple, tuple]:
        """Scaled float32 queries ``[B, T, N, H]`` with their positions and segment ids, in the
        caller's layout (each query block is regrouped into GEMM rows where it is used); the
        online softmax's running max and sum (float32 ``[nq, B, K, G * bq]``) and unnormalised
        output (``[nq, B, K, G * bq, H]``), blocked in GEMM row order."""
        B, T, N, H = q.q.shape
        K = kv_heads
        G = _groups(N, K)
        bq = block_size(T, self.blocks.block_q)
        nq, R = T // bq, G * bq
        # the queries keep the caller's layout (a blocked copy made here would be read both in
        # and after the caller's loop over K/V blocks, and XLA:CPU then keeps it in two layouts)
        prepared = (q.q.astype(_F32) * _scale(H), q.pos, q.seg)
        m, l = jnp.full((nq, B, K, R), -jnp.inf, _F32), jnp.zeros((nq, B, K, R), _F32)
        return prepared, (m, l, jnp.zeros((nq, B, K, R, H), _F32))

    def _step_blocks(
        self, name: str, q_pos: Array, nq: int, R: int, K: int, k: Array, block_kv: int
    ) -> tuple[int, int, int, int]:
        """``(bq, G, bk, nk)`` of a ``*_step`` call: query block and group size from the prepared
        accumulator (``nq`` blocks of ``R = G * bq`` GEMM rows), key block (``block_kv`` tokens,
        the forward's or the backward's, clamped by :func:`block_size`) and count of ``k``.

        Raises:
          ValueError: ``k`` has another number of kv heads than the ``*_start`` call was told.
        """
        bq = q_pos.shape[1] // nq
        if k.shape[2] != K:
            start = name.replace("_step", "_start")
            raise ValueError(f"{name}: K/V have {k.shape[2]} heads, {start} was told {K}")
        bk = block_size(k.shape[1], block_kv)
        return bq, R // bq, bk, k.shape[1] // bk

    def forward_step(self, prepared: tuple, acc: tuple, kv: KVBlock, *, mask: Mask) -> tuple:
        q_sc, q_pos, q_seg = prepared
        k, v, k_pos, k_seg = kv
        nq, B, K, R, H = acc[2].shape
        bq, G, bk, nk = self._step_blocks("forward_step", q_pos, nq, R, K, k, self.blocks.block_kv)

        def q_block(i, acc):
            qi = _q_tile(q_sc, i, bq, K, G)  # [B, K, R, H]
            qp, qs = _seq_block(q_pos, i, bq), _seq_block(q_seg, i, bq)

            def kv_step(carry, j):
                kp, ks = _seq_block(k_pos, j, bk), _seq_block(k_seg, j, bk)

                def tile(carry, bias):
                    m, l, o = carry  # [B, K, R], [B, K, R], [B, K, R, H]
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
                    o = o * corr[..., None] + _dot_n(p, vi)
                    return m_new, l, o

                branches = [
                    lambda c: c,
                    lambda c: tile(c, None),
                    lambda c: tile(c, _bias(mask, qp, kp, qs, ks)),
                ]
                return lax.switch(tile_class(mask, qp, kp, qs, ks), branches, carry), None

            block, _ = lax.scan(kv_step, tuple(a[i] for a in acc), jnp.arange(nk))
            return tuple(a.at[i].set(b) for a, b in zip(acc, block))  # in place: acc is the loop carry

        return lax.fori_loop(0, nq, q_block, acc)

    def forward_finish(self, prepared: tuple, acc: tuple) -> OutLse:
        m, l, o = acc
        nq, _, K, R, _ = o.shape
        G = R // (prepared[1].shape[1] // nq)
        seen = l > 0
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), -jnp.inf)
        out = o / jnp.where(seen, l, 1.0)[..., None]
        return _q_unblocks(out, K, G), _q_unblocks(lse, K, G)

    def backward_start(
        self, q: QueryBlock, ct: Cotangent, *, kv_heads: int
    ) -> tuple[tuple, Float[Array, "nq B K H R"]]:
        """float32 scaled q and dout ``[B, T, N, H]``, logsumexp (0 where ``-inf``) and delta
        ``[B, T, N]``, positions and segment ids, all in the caller's layout (see
        :meth:`forward_start`); the dQ accumulator, float32 blocked ``[nq, B, K, H, G * bq]``
        (transposed: the GEMM emits its pieces that way), ``bq`` being the backward's query
        block (``block_q_dkv``, or ``block_q``)."""
        B, T, N, H = q.q.shape
        lse, dout, delta = ct
        K = kv_heads
        G = _groups(N, K)
        bq = block_size(T, self.backward_blocks[0])
        nq = T // bq
        # a row with no visible key anywhere has lse = -inf and every logit masked: p = 0 there
        lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0).astype(_F32)
        prepared = (q.q.astype(_F32) * _scale(H), dout.astype(_F32), lse_safe, delta.astype(_F32), q.pos, q.seg)
        return prepared, jnp.zeros((nq, B, K, H, G * bq), _F32)

    def backward_step(self, prepared: tuple, acc: GradAccumulator, kv: KVBlock, *, mask: Mask) -> GradAccumulator:
        q_sc, dos, lses, deltas, q_pos, q_seg = prepared
        k, v, k_pos, k_seg = kv
        dq_acc, dk, dv = acc
        nq, B, K, H, R = dq_acc.shape
        bq, G, bk, nk = self._step_blocks("backward_step", q_pos, nq, R, K, k, self.backward_blocks[1])

        def kv_block(j, carry):
            dq, dk, dv = carry
            ki, vi = _kv_block(k, j, bk), _kv_block(v, j, bk)  # [B, K, bk, H]
            kti = jnp.swapaxes(ki, 2, 3)  # [B, K, H, bk], once per K/V block
            kp, ks = _seq_block(k_pos, j, bk), _seq_block(k_seg, j, bk)

            def q_step(i, carry):
                dkj, dvj, dq = carry
                qi, doi = _q_tile(q_sc, i, bq, K, G), _q_tile(dos, i, bq, K, G)  # [B, K, R, H]
                lsei, deltai = _q_tile(lses, i, bq, K, G), _q_tile(deltas, i, bq, K, G)  # [B, K, R]
                qp, qs = _seq_block(q_pos, i, bq), _seq_block(q_seg, i, bq)

                def tile(c, bias):
                    # the tile is built TRANSPOSED, keys x query rows: then all five matmuls are
                    # A B or A B^T products (never A^T B, which XLA:CPU runs 2.5x slower)
                    dkj, dvj = c
                    st = _dot(ki, qi)  # [B, K, bk, R]
                    if bias is not None:
                        st = (st.reshape(B, K, bk, G, bq) + bias).reshape(B, K, bk, R)
                    pt = jnp.exp(st - lsei[:, :, None, :])
                    dpt = _dot(vi, doi)  # [B, K, bk, R]
                    dst = pt * (dpt - deltai[:, :, None, :])
                    dvj = dvj + _dot_n(pt, doi)  # [B, K, bk, H]
                    dkj = dkj + _dot_n(dst, qi)
                    return (dkj, dvj), _dot_n(kti, dst)  # dq piece, transposed: [B, K, H, R]

                zero_dq = jnp.zeros((B, K, H, R), _F32)
                branches = [
                    lambda c: (c, zero_dq),
                    lambda c: tile(c, None),
                    lambda c: tile(c, _bias_t(mask, qp, kp, qs, ks)),
                ]
                (dkj, dvj), piece = lax.switch(tile_class(mask, qp, kp, qs, ks), branches, (dkj, dvj))
                # added outside the switch, in place into the loop carry (a branch returning
                # the whole accumulator could make XLA copy it per tile)
                return dkj, dvj, dq.at[i].add(piece)

            zero_kv = jnp.zeros((B, K, bk, H), _F32)
            dkj, dvj, dq = lax.fori_loop(0, nq, q_step, (zero_kv, zero_kv, dq))
            return dq, _kv_add(dk, dkj, j, bk), _kv_add(dv, dvj, j, bk)

        return lax.fori_loop(0, nk, kv_block, (dq_acc, dk.astype(_F32), dv.astype(_F32)))

    def backward_finish(self, prepared: tuple, dq_acc: Float[Array, "nq B K H R"]) -> Float[Array, "B T N H"]:
        nq, _, K, H, R = dq_acc.shape
        G = R // (prepared[4].shape[1] // nq)
        # the scale of the chain rule for q -> q * scale, applied once to the sum
        return _q_unblocks(jnp.swapaxes(dq_acc, 3, 4), K, G) * _scale(H)
