"""Sorted-interval masks for splash-style kernels (the module docstring of
:mod:`lcx.attention.kernels.splash`): the static tiling of one call (:class:`_Plan`), each
query's visible interval of a sorted K/V chunk (:func:`_intervals`) and the block-sparsity
metadata splash reads (:func:`_block_info`), all computed on device from positions and segment
ids. Tokens are the unit of every length and block.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes

LANES = 128
"""Splash kv blocks and backward query blocks must be multiples of this (the TPU lane width), in
tokens."""
SUBLANES = 8
"""Splash forward query blocks (``block_q``) must be multiples of this (the TPU sublane count)."""
MAX_KV_CHUNK = 16384
"""Most keys in one splash call (tokens): ``lo`` and ``hi`` (each ``<= 16384``) share an int32."""
_HI_BITS = 15
_HI_MASK = (1 << _HI_BITS) - 1
_I32_MIN, _I32_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _mask_fn(q_sequence, kv_index):
    """Splash mask function: ``q_sequence`` packs ``lo << 15 | hi``; key visible iff lo <= index < hi."""
    hi = jnp.bitwise_and(q_sequence, _HI_MASK)
    lo = jnp.right_shift(q_sequence, _HI_BITS)
    return (kv_index >= lo) & (kv_index < hi)


class _Plan:
    """Static tiling of one kernel call: padded lengths, blocks, kv chunks (all in tokens).

    ``bq, bkv`` tile the forward, ``bq_dq, bkv`` the dQ kernel (``bq_dq = bq`` when that is a
    multiple of 128, else ``lcm(bq, 128)``: the dQ kernel's logsumexp blocks put queries on
    lanes), ``bq_dkv, bkv_dkv`` the dK/dV kernel (None ``block_q_dkv``: ``bq_dq``; None
    ``block_kv_dkv``: ``bkv``); ``Tp`` is a multiple of every query block, ``chunk`` of both kv
    blocks.

    Raises:
      ValueError: the two kv blocks' least common multiple exceeds :data:`MAX_KV_CHUNK`.
    """

    def __init__(
        self,
        T: int,
        S: int,
        block_q: int,
        block_kv: int,
        block_q_dkv: int | None = None,
        block_kv_dkv: int | None = None,
    ):
        self.bq = min(block_q, _round_up(T, LANES))
        self.bq_dq = self.bq if self.bq % LANES == 0 else math.lcm(self.bq, LANES)
        self.bq_dkv = self.bq_dq if block_q_dkv is None else min(block_q_dkv, _round_up(T, LANES))
        self.Tp = _round_up(T, math.lcm(self.bq, self.bq_dq, self.bq_dkv))
        self.bkv = min(block_kv, _round_up(S, LANES))
        self.bkv_dkv = min(block_kv if block_kv_dkv is None else block_kv_dkv, _round_up(S, LANES))
        unit = math.lcm(self.bkv, self.bkv_dkv)  # kv chunks are whole blocks of both
        if unit > MAX_KV_CHUNK:
            raise ValueError(
                f"plan.attention.kernel='splash': kv blocks {self.bkv} (block_kv) and {self.bkv_dkv} (block_kv_dkv) "
                f"have a least common multiple {unit} > {MAX_KV_CHUNK} tokens, the most keys of one splash call; "
                "make one a multiple of the other"
            )
        nkb = -(-S // unit)  # kv units
        per_chunk = MAX_KV_CHUNK // unit
        self.n_chunks = -(-nkb // per_chunk)
        self.chunk = -(-nkb // self.n_chunks) * unit
        self.Sp = self.n_chunks * self.chunk
        self.T, self.S = T, S

    @classmethod
    def of(cls, T: int, S: int, blocks: BlockSizes) -> _Plan:
        """The tiling of all four of ``blocks`` for ``T`` queries and ``S`` keys (tokens)."""
        return cls(T, S, blocks.block_q, blocks.block_kv, blocks.block_q_dkv, blocks.block_kv_dkv)

    @property
    def dkv_blocks(self) -> dict[str, int]:
        """The dK/dV kernel's blocks as the keywords of ``_splash_attention_bwd_dkv`` (JAX's and
        tokamax's take the same three)."""
        return {"bq": self.bq_dkv, "bkv": self.bkv_dkv, "bkv_compute": self.bkv_dkv}


def _search(keys_seg, keys_pos, n_real, q_seg, q_pos, *, strict: bool, use_seg: bool):
    """Per query, the number of the first ``n_real`` sorted keys that are ``< (q_seg, q_pos)``
    (``strict``) or ``<= (q_seg, q_pos)``, lexicographically on (segment, position) when
    ``use_seg`` else on position. Vectorised binary search, ``ceil(log2(C + 1))`` gathers."""
    C = keys_pos.shape[0]
    lo = jnp.zeros(q_pos.shape, jnp.int32)
    hi = jnp.full(q_pos.shape, n_real, jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(C + 1)))):
        active = lo < hi
        mid = (lo + hi) // 2
        midc = jnp.minimum(mid, C - 1)
        kp = keys_pos[midc]
        below = (kp < q_pos) if strict else (kp <= q_pos)
        if use_seg:
            ks = keys_seg[midc]
            below = (ks < q_seg) | ((ks == q_seg) & below)
        lo = jnp.where(active & below, mid + 1, lo)
        hi = jnp.where(active & ~below, mid, hi)
    return lo


def _intervals(mask: Mask, q_pos, q_seg, k_pos_sorted, k_seg_sorted, n_real):
    """``lo, hi`` int32 ``[T]``: query t sees sorted keys ``[lo, hi)`` (see module docstring).

    The lower bound is ``q_pos - (window - 1)`` with a window, the first position of the query's
    aligned chunk ``(q_pos // chunk) * chunk`` with chunks; the upper bound ``q_pos`` if causal,
    else ``q_pos + window - 1`` or the chunk's last position ``(q_pos // chunk + 1) * chunk - 1``.
    Positions within ``window`` / ``chunk`` of the int32 limits are clamped so nothing wraps."""
    use_seg = mask.document
    w, c = mask.window, mask.chunk
    # int32 arithmetic clamped so that q_pos -/+ (window - 1) or a chunk's ends cannot wrap around
    if w is not None:
        low = jnp.maximum(q_pos, _I32_MIN + w) - (w - 1)
        lo = _search(k_seg_sorted, k_pos_sorted, n_real, q_seg, low, strict=True, use_seg=use_seg)
    elif c is not None:
        qc = jnp.maximum(q_pos, _I32_MIN + c)
        low = qc - qc % c  # floor to the chunk's first position (% is floor-mod for negatives too)
        lo = _search(k_seg_sorted, k_pos_sorted, n_real, q_seg, low, strict=True, use_seg=use_seg)
    elif use_seg:
        lo = _search(
            k_seg_sorted, k_pos_sorted, n_real, q_seg, jnp.full_like(q_pos, _I32_MIN), strict=True, use_seg=True
        )
    else:
        lo = jnp.zeros_like(q_pos)
    if mask.causal:
        up = q_pos
    elif w is not None:
        up = jnp.minimum(q_pos, _I32_MAX - w) + (w - 1)
    elif c is not None:
        qc = jnp.minimum(q_pos, _I32_MAX - c)
        up = qc - qc % c + (c - 1)
    else:
        up = jnp.full_like(q_pos, _I32_MAX)
    if mask.causal or w is not None or c is not None or use_seg:
        hi = _search(k_seg_sorted, k_pos_sorted, n_real, q_seg, up, strict=False, use_seg=use_seg)
    else:
        hi = jnp.full_like(q_pos, n_real)
    return lo, hi


def _block_info(sp, lo, hi, bq: int, bkv: int, n_kv_blocks: int, empty_row):
    """Splash ``MaskInfo`` for forward/dq and for dkv, computed on device from the intervals.

    ``block_mask[0, i, j] = 1`` iff some query of q block i sees a key of kv block j (else 0:
    skipped); ``data_next`` points skipped entries at the last block fetched so no new DMA is
    issued (forward/dq walk kv blocks, dkv walks q blocks).
    """
    Tp = lo.shape[0]
    nq = Tp // bq
    starts = jnp.arange(n_kv_blocks, dtype=jnp.int32) * bkv
    hit = (lo[:, None] < starts[None, :] + bkv) & (hi[:, None] > starts[None, :]) & ~empty_row[:, None]
    active = hit.reshape(nq, bq, n_kv_blocks).any(axis=1)  # [nq, nk]
    block_mask = active.astype(jnp.int32)[None]
    j = jnp.arange(n_kv_blocks, dtype=jnp.int32)[None, :]
    i = jnp.arange(nq, dtype=jnp.int32)[:, None]
    next_kv = lax.cummax(jnp.where(active, j, 0), axis=1)[None]
    next_q = lax.cummax(jnp.where(active, i, 0), axis=0)[None]
    q_sequence = (jnp.left_shift(lo, _HI_BITS) | hi).astype(jnp.int32)
    fwd = sp.mask_info(
        data_next=next_kv, mask_next=None, block_mask=block_mask, partial_mask_blocks=None, q_sequence=q_sequence
    )
    dkv = sp.mask_info(
        data_next=next_q, mask_next=None, block_mask=block_mask, partial_mask_blocks=None, q_sequence=q_sequence
    )
    return fwd, dkv
