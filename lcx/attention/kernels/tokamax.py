"""The ``tokamax`` kernel: Tokamax's Pallas splash attention behind lcx's
:class:`~lcx.attention.kernels.AbstractKernel` interface.

**What it is.** Tokamax (``openxla/tokamax``) ships the splash attention that MaxText runs with
``use_tokamax_splash=True`` (``maxtext/layers/attention_op.py`` imports
``tokamax._src.ops.experimental.tpu.splash_attention.splash_attention_kernel``, as this file
does): JAX's splash kernel grown a *fused* backward (dQ, dK and dV in one Pallas kernel),
base-2 exponentials, and a block list (a "dynamic grid") that visits only the (query block,
kv block) pairs with work instead of the whole grid. It needs Python >= 3.12 and JAX >= 0.11:
``pip install "lcx[tokamax]"`` (the extra is empty, so a no-op, on Python 3.11).

**How lcx drives it.** Exactly as the ``splash`` kernel (:mod:`lcx.attention.kernels.splash`,
module docstring), whose helpers this file reuses rather than copies: every kv chunk (at most
16384 keys) is sorted by the mask's key, so the keys a query sees are one index range
``[lo, hi)``; both bounds are packed into one int32 per query and handed to tokamax as
``MaskInfo.q_sequence``, with the mask function ``lo <= kv index < hi`` evaluated in-kernel.
Every lcx mask (causal, document, sliding window, chunks, full, padding) and every layout and ring step
is therefore exact, with no static mask and no host metadata.

**Block list** (:func:`_block_list`, tokamax's ``MaskInfo`` of a dynamic grid, computed on
device from the intervals as tokamax's ``_process_dynamic_mask`` computes it from a dense mask
that lcx never builds): the active (row, column) pairs in row-major order (forward: rows are
query blocks; dK/dV: rows are kv blocks), a state per pair (1: partial, the mask function is
evaluated; 2: every query of the block sees every key of it, no mask), and their count, which is
the kernel's grid size. A kv block no query sees is listed once with state 0 so the dK/dV
kernel writes its zeros; a query block with no work is not visited, and its rows -- all of them
empty -- are set to ``out = 0``, ``lse = -inf`` here, as are the empty rows of visited blocks.

**Backward with the GLOBAL logsumexp.** The interface's backward is flash-style (this block's
dQ, dK, dV given the final ``out``/``lse`` over all blocks); tokamax's custom VJP differentiates
only its own forward, so the adapter calls its fused kernel ``_splash_attention_bwd_dkv`` (the
one its VJP runs) with the global ``lse`` (in base 2, ``lse * log2(e)``: tokamax's
``use_base2_exp``) and ``delta``. Private functions of tokamax 0.0.17, like the ones MaxText
imports; their signatures are pinned in :func:`_forward_chunk` and :func:`_backward_chunk`, and
the tests compare against the dense reference so an API change fails loudly.

**Supports:** everything the interface asks for: ``out`` and ``lse``, the global-lse backward
(so the ring, USP and every other strategy run on it), GQA/MQA without repeating K/V, padding,
any positions. Attention sinks are lcx's, merged through the returned ``lse`` outside the kernel
(:mod:`lcx.attention.sinks`), so they work too. Tokamax's own sinks, soft cap, dropout and
``max_logit`` options are not used.

**Refuses** (when the kernel is built, before anything compiles): Python < 3.12 or tokamax not
installed (:class:`KernelNotAvailableError` naming ``pip install "lcx[tokamax]"``; use
``kernel='splash'``, the same algorithm on JAX's splash, or ``kernel='xla'``), and block sizes
tokamax cannot tile (``ValueError``): ``block_q`` a multiple of 8 (the forward's query blocks are
sublane-tiled), the kv blocks and ``block_q_dkv`` multiples of 128 (the fused backward puts
queries on lanes), kv blocks ``<= 16384`` and the two kv blocks' least common multiple too.

**Numerics.** With float32 inputs the results match the float32 reference to the splash
kernel's tolerances (``tests/test_attention_tokamax.py``). Tokamax accumulates dQ in the
query's dtype (three partial buffers): with bf16 queries, dQ carries bf16 rounding.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from lcx.attention.blocks import Cotangent, Grads, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels.base import KernelCall, as_blocks
from lcx.attention.kernels.composed import AbstractComposedKernel
from lcx.attention.kernels.interpret import interpret
from lcx.attention.kernels.sorted_chunks import chunked_backward, chunked_forward
from lcx.attention.kernels.splash import KernelNotAvailableError, SplashKernel
from lcx.attention.kernels.splash_intervals import _HI_BITS, LANES, MAX_KV_CHUNK, SUBLANES, _mask_fn, _Plan
from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes

_F32 = jnp.float32
_LOG2E = math.log2(math.e)
_INSTALL = 'pip install "lcx[tokamax]" (tokamax needs Python >= 3.12)'
# Tiling rules: (block, unit in tokens, what tokamax tiles by it)
_RULES = (
    ("block_q", SUBLANES, "the forward's query blocks, tiled by the 8 TPU sublanes"),
    ("block_kv", LANES, "key blocks, tiled by the 128 TPU lanes"),
    ("block_q_dkv", LANES, "the fused backward's query blocks, which it puts on the 128 lanes"),
    ("block_kv_dkv", LANES, "the fused backward's key blocks, tiled by the 128 lanes"),
)


def _tokamax():
    """Tokamax's splash kernel module, or :class:`KernelNotAvailableError` saying how to get it."""
    if sys.version_info < (3, 12):
        raise KernelNotAvailableError(
            f"plan.attention.kernel='tokamax' needs Python >= 3.12 (tokamax's floor); this is Python "
            f"{sys.version.split()[0]}. Use Python >= 3.12 and {_INSTALL}, or set plan.attention.kernel='splash' "
            "(the same algorithm on JAX's splash kernel) or 'xla'"
        )
    try:
        from tokamax._src.ops.experimental.tpu.splash_attention import splash_attention_kernel as sk
    except ImportError as e:
        raise KernelNotAvailableError(
            f"plan.attention.kernel='tokamax' needs the tokamax package, which failed to import ({e}); {_INSTALL}, "
            "or set plan.attention.kernel='splash' (the same algorithm on JAX's splash kernel) or 'xla'"
        ) from e
    return sk


def _block_list(sk, lo, hi, empty, bq: int, bkv: int, n_kv: int, *, dkv: bool):
    """Tokamax ``MaskInfo`` (dynamic grid) of one kv chunk, from the query intervals.

    Args:
      lo, hi: int32 ``[Tp]`` each query's visible sorted keys ``[lo, hi)``.
      empty: bool ``[Tp]`` rows that see no key of the chunk.
      bq, bkv, n_kv: query block, kv block (tokens) and kv blocks in the chunk.
      dkv: the dK/dV kernel's list (rows: kv blocks) rather than the forward's (rows: q blocks).
    """
    nq = lo.shape[0] // bq
    start = jnp.arange(n_kv, dtype=jnp.int32) * bkv
    live = ~empty[:, None]
    some = ((lo[:, None] < start + bkv) & (hi[:, None] > start) & live).reshape(nq, bq, n_kv).any(axis=1)
    every = ((lo[:, None] <= start) & (hi[:, None] >= start + bkv) & live).reshape(nq, bq, n_kv).all(axis=1)
    state = some.astype(jnp.int32) + every.astype(jnp.int32)  # 0 skip, 1 partial, 2 full
    if dkv:
        state = state.T
    active = state > 0
    if dkv:  # a kv block no query sees is still visited once, so that its zero dK/dV are written
        active = active.at[:, 0].set(active[:, 0] | ~active.any(axis=1))
    count = active.sum(dtype=jnp.int32).reshape(1)
    # the padding entries (beyond the grid) must differ from every row: tokamax starts and ends a
    # row's accumulation where consecutive entries' rows differ (``find_bounds``)
    rows, cols = jnp.nonzero(active, size=active.size, fill_value=-1)
    block_mask = jnp.where(jnp.arange(active.size) < count[0], state[rows, cols], 0)
    q_sequence = (jnp.left_shift(lo, _HI_BITS) | hi).astype(jnp.int32)
    return sk.MaskInfo(
        mask_next=None,
        active_rows=rows.astype(jnp.int32),
        active_cols=cols.astype(jnp.int32),
        block_mask=block_mask,
        num_active_blocks=count,
        partial_mask_blocks=None,
        q_sequence=q_sequence,
    )


def _config(sk, plan: _Plan):
    """Tokamax's ``SplashConfig`` for this tiling (its defaults otherwise: base-2 exponentials,
    fused reciprocal, fused backward); interpret mode off TPU."""
    return sk.SplashConfig(
        block_q=plan.bq,
        block_kv=plan.bkv,
        block_kv_compute=plan.bkv,
        block_q_dkv=plan.bq_dkv,
        block_kv_dkv=plan.bkv_dkv,
        block_kv_dkv_compute=plan.bkv_dkv,
        interpret=interpret(),
    )


def _forward_chunk(sk, plan: _Plan, q, k, v, lo, hi, empty):
    """Tokamax's forward over one sorted kv chunk: ``q`` ``[N, Tp, H]`` (scaled), ``k, v``
    ``[K, C, H]``; float32 ``out`` ``[N, Tp, H]`` and natural-log ``lse`` ``[N, Tp]``, empty
    rows ``0`` / ``-inf``. The one call of tokamax's private forward (0.0.17 signature)."""
    info = _block_list(sk, lo, hi, empty, plan.bq, plan.bkv, plan.chunk // plan.bkv, dkv=False)
    out, stats = sk._splash_attention_forward(
        info,
        q,
        k,
        v,
        None,
        None,
        mask_value=sk.base.DEFAULT_MASK_VALUE,
        is_mqa=False,
        config=_config(sk, plan),
        save_residuals=True,
        mask_function=_mask_fn,
        fwd_mask_sparsity=1.0,
    )
    lse = stats["logsumexp"].astype(_F32) / _LOG2E  # base 2 -> natural log
    return jnp.where(empty[None, :, None], 0.0, out.astype(_F32)), jnp.where(empty[None, :], -jnp.inf, lse)


def _backward_chunk(sk, plan: _Plan, q, k, v, lse2, dout, delta, lo, hi, empty):
    """Tokamax's fused backward over one sorted kv chunk with the GLOBAL base-2 ``lse2`` and
    ``delta`` (``[N, Tp]``): ``(dq, dk, dv)`` float32, dq w.r.t. the scaled ``q``. The one call
    of tokamax's private fused backward (0.0.17 signature)."""
    info = _block_list(sk, lo, hi, empty, plan.bq_dkv, plan.bkv_dkv, plan.chunk // plan.bkv_dkv, dkv=True)
    grads = sk._splash_attention_bwd_dkv(
        q,
        k,
        v,
        None,
        lse2,
        dout,
        delta,
        **plan.dkv_blocks,
        is_mqa=False,
        mask_info=info,
        mask_value=sk.base.DEFAULT_MASK_VALUE,
        mask_function=_mask_fn,
        config=_config(sk, plan),
        dkv_mask_sparsity=1.0,
    )
    return tuple(g.astype(_F32) for g in grads)


class TokamaxKernel(AbstractComposedKernel):
    """Tokamax's Pallas splash attention (interpret mode off TPU) with sorted-interval masks.

    Attributes:
      blocks: ``block_q``: query block in tokens of the forward, a multiple of 8 (clamped to the
        query length rounded up to 128). ``block_kv``: key/value block in tokens of the forward, a
        multiple of 128 and ``<= 16384``. ``block_q_dkv``: query block in tokens of the fused
        backward (tokamax's ``SplashConfig.block_q_dkv``), a multiple of 128; None:
        ``lcm(block_q, 128)``. ``block_kv_dkv``: key/value block in tokens of the fused backward,
        a multiple of 128 and ``<= 16384``; None: ``block_kv``.

    Raises:
      KernelNotAvailableError: Python < 3.12 or tokamax not installed (module docstring).
      ValueError: block sizes tokamax cannot tile, naming the block.
    """

    blocks: BlockSizes = eqx.field(static=True)
    mosaic_calls_per_chunk: ClassVar[tuple[int, int] | None] = (1, 1)  # the forward kernel; the fused dQ/dK/dV kernel

    def __init__(self, *blocks: BlockSizes | int | None, **block_sizes: int | None):
        self.blocks = as_blocks(blocks, block_sizes)

    @classmethod
    def check_blocks(cls, blocks: BlockSizes) -> None:
        """Tokamax's tiling rules (module docstring), then whether tokamax imports here."""
        for name, unit, what in _RULES:
            b = getattr(blocks, name)
            too_long = "kv" in name and b is not None and b > MAX_KV_CHUNK
            if b is not None and (b < unit or b % unit or too_long):
                cap = f" and <= {MAX_KV_CHUNK}" if "kv" in name else ""
                raise ValueError(
                    f"plan.attention.kernel='tokamax' needs plan.attention.{name} to be a positive multiple of {unit} "
                    f"tokens{cap} ({what}), got {b}; e.g. {min(MAX_KV_CHUNK, max(unit, -(-b // unit) * unit))}, "
                    "or use kernel='xla' for other block sizes"
                )
        unit = math.lcm(blocks.block_kv, blocks.backward[1])
        if unit > MAX_KV_CHUNK:
            raise ValueError(
                f"plan.attention.kernel='tokamax' needs kv chunks of whole blocks of both plan.attention.block_kv "
                f"({blocks.block_kv}) and block_kv_dkv ({blocks.block_kv_dkv}), whose least common multiple {unit} "
                f"exceeds {MAX_KV_CHUNK} tokens; make one a multiple of the other"
            )
        _tokamax()

    # -- memory price (the ledger): splash's, the same Pallas tiling with its tiles in VMEM ------
    @classmethod
    def forward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        return SplashKernel.forward_bytes(call, blocks)

    @classmethod
    def backward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """splash's (dout and the float32 dq, dk, dv) plus tokamax's three zeroed dQ partial
        buffers in the query's dtype, ``3 b t n h a`` (its fused kernel's ``dq_reduction_steps=3``,
        the only one of its dynamic grid)."""
        return SplashKernel.backward_bytes(call, blocks) + cls.prologue_bytes(call)

    @classmethod
    def prologue_bytes(cls, call: KernelCall) -> int:
        """The three zeroed dQ partial buffers, ``3 b t n h a``: zeros, ready before the cotangent."""
        return 3 * call.local_batch * call.q_len * call.q_heads * call.head_dim * call.act_bytes

    def step_tile_bytes(self, batch: int, q_len: int, kv_len: int, group: int) -> int:
        return 0  # tiles in VMEM

    def forward(self, q: QueryBlock, kv: KVBlock, *, mask: Mask) -> OutLse:
        sk, plan = _tokamax(), _Plan.of(q.q.shape[1], kv.k.shape[1], self.blocks)
        return chunked_forward(plan, mask, q, kv, functools.partial(_forward_chunk, sk, plan))

    def backward(self, q: QueryBlock, kv: KVBlock, ct: Cotangent, *, mask: Mask) -> Grads:
        sk, plan = _tokamax(), _Plan.of(q.q.shape[1], kv.k.shape[1], self.blocks)
        return chunked_backward(plan, mask, q, kv, ct, functools.partial(_backward_chunk, sk, plan), _LOG2E)
