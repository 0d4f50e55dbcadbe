"""The ``splash`` kernel: Pallas splash attention (block-sparse flash attention) behind lcx's
:class:`~lcx.attention.kernels.AbstractKernel` interface.

Splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``, shipped with JAX) is the
TPU kernel MaxText runs its context-parallel strategies on. Its masks are static NumPy objects
over *indices* ``(q index, kv index)``, whereas lcx masks are predicates on *data*: global
positions and segment ids that the zigzag layout permutes and that change at every ring step.
This adapter bridges the two without any static mask and without host metadata:

**Sorted-interval masks.** Every lcx mask is an interval condition on one sort key of the keys:

- key ``(segment id, position)`` (lexicographic) with a document mask, ``position`` without;
- query ``t`` sees exactly the keys with ``lower(t) <= key <= upper(t)``, where
  ``lower = (q_seg, q_pos - window + 1)`` with a window, ``(q_seg, (q_pos // chunk) * chunk)``
  with chunks (``-inf`` position with neither) and ``upper = (q_seg, q_pos)`` if causal,
  ``(q_seg, q_pos + window - 1)`` for a bidirectional window, ``(q_seg, (q_pos // chunk + 1) *
  chunk - 1)`` for bidirectional chunks, ``(q_seg, +inf)`` otherwise (drop ``q_seg`` without a
  document mask).

So once the K/V block is sorted by that key, the keys a query sees are one contiguous index
range ``[lo(t), hi(t))``, found by binary search (``O(T log S)``). Both bounds are packed into
one int32 per query and handed to splash as ``MaskInfo.q_sequence`` -- the per-query *data*
splash's computable masks read -- with the mask function ``lo <= kv_index < hi`` evaluated
inside the kernel on the kv index it already computes. This is exact for ANY positions and
segment ids (any layout, any ring step, packed documents with positions restarting at 0), so
nothing is ever refused for its layout and nothing depends on a recognised one.

Block sparsity comes from splash's own scalar-prefetched ``block_mask``/``data_next`` arrays,
computed on device for every call from the intervals (a ``[T/block_q, C/block_kv]`` grid per
call): kv blocks that no query of a query block sees are skipped, as splash skips them for its
static masks. Host memory for masks: none. Device memory per call: ``3 x 4 x (T/bq) x (C/bkv)``
bytes of block metadata plus ``O(T + C)`` int32 (see ``docs/splash_kernel.md`` for 14M tokens).

Packing two bounds in 31 bits limits one splash call to ``C <= 16384`` keys (:data:`MAX_KV_CHUNK`);
longer K/V blocks are cut into equal chunks of at most that many keys, sorted independently,
and merged through the logsumexp (forward) or summed/concatenated (backward) -- exactly like
ring steps.

**Backward with the GLOBAL logsumexp.** The interface's backward is flash-style: dQ, dK, dV of
this K/V block given the final ``out`` and ``lse`` over all blocks. Splash's custom VJP only
differentiates its own forward, so the adapter calls splash's backward kernels directly
(``_splash_attention_bwd_dq`` and ``_splash_attention_bwd_dkv``, the same Pallas kernels its VJP
runs) with the global ``lse`` and ``delta = sum(dout * out)`` as their residuals. These, and the
forward with ``save_residuals``, are JAX-private; :mod:`lcx.attention.kernels.jax_splash` alone
imports them, after checking the JAX version and their signatures
(:class:`KernelNotAvailableError` otherwise), and the tests compare against the dense reference
so a change they miss still fails loudly.

**Scale.** Splash does not scale logits; the adapter multiplies q by ``1/sqrt(H)`` once
(:func:`~lcx.attention.kernels.sorted_chunks.prescale`, the one place the scale lives) and applies the same factor to dQ by the
chain rule. ``lse`` returned by splash is then the natural-log logsumexp of the scaled logits,
as the interface requires.

**GQA.** Splash's MHA kernel maps query head ``n`` to kv head ``n // (N/K)``; K/V are passed
at their own head count and never repeated (MQA is ``K = 1``).

**Rows without a visible key.** Splash would return ``0/0`` or an average over masked keys for
them; the adapter knows them exactly (``lo >= hi``) and returns ``out = 0``, ``lse = -inf``; in
backward their ``lse`` is replaced by 0, which makes every masked probability
``exp(mask_value) = 0``.

**Backward blocks.** ``block_q_dkv`` / ``block_kv_dkv`` (splash's ``BlockSizes`` names; None:
the dQ kernel's blocks) tile splash's dK/dV kernel, with its own block-sparsity metadata; the dQ
kernel uses the forward's blocks (its query block rounded up to a multiple of 128 when the
forward's is not, see below). Padded lengths and kv chunks are then multiples of all blocks.

**Padding** (a negative segment id, :mod:`lcx.attention.masks`): padding keys are sorted after
the real keys of their chunk, beyond every query's interval, and padding queries are empty rows,
so no query sees a padding key and a padding query gets ``out = 0``, ``lse = -inf`` and zero
gradients; blocks made only of padding have ``block_mask = 0`` and are skipped.

**Block sizes: the kernel's own rule.** Mosaic tiles the last two dimensions of every block by
(8 sublanes, 128 lanes) unless a block spans the whole dimension. In splash's forward kernel
(``_splash_attention_forward`` of JAX 0.10.2) the query block ``bq`` is a sublane dimension
only (q and out blocks ``(bq, head_dim)``, the mask data and logsumexp ``(bq, 128)``), and the
kernel checks ``block_kv_compute % 128 == 0``: so ``block_q`` must be a multiple of 8 and the
kv blocks multiples of 128. Its backward kernels take the logsumexp and ``di`` with ``bq`` on
LANES (dQ: blocks ``(1, bq)``; dK/dV: ``(8, bq)``, and its segment-id path raises unless
``bq % 128 == 0``), so their query blocks must be multiples of 128: ``block_q_dkv`` is checked
as such, and the dQ kernel runs on ``lcm(block_q, 128)`` queries when ``block_q`` is not a
multiple of 128 (None ``block_q_dkv`` likewise). The padded query length is a multiple of every
query block. Interpret mode (Pallas on CPU/GPU, what the tests run) is chosen automatically when
``jax.default_backend()`` is not ``"tpu"``; sequences shorter than a block are padded up to one
block with invisible queries/keys.
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp

from lcx.attention.blocks import Cotangent, Grads, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels.base import KernelCall, as_blocks
from lcx.attention.kernels.composed import AbstractComposedKernel
from lcx.attention.kernels.interpret import interpret
from lcx.attention.kernels.jax_splash import KernelNotAvailableError as KernelNotAvailableError
from lcx.attention.kernels.jax_splash import SplashInternals, splash_internals
from lcx.attention.kernels.sorted_chunks import chunked_backward, chunked_forward
from lcx.attention.kernels.splash_intervals import LANES as LANES
from lcx.attention.kernels.splash_intervals import MAX_KV_CHUNK as MAX_KV_CHUNK
from lcx.attention.kernels.splash_intervals import SUBLANES as SUBLANES
from lcx.attention.kernels.splash_intervals import _block_info, _mask_fn, _Plan, _round_up
from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes

_F32 = jnp.float32


class SplashKernel(AbstractComposedKernel):
    """Pallas splash attention (interpret mode off TPU) with sorted-interval masks.

    Build it with ``SplashKernel(BlockSizes(...))`` or ``SplashKernel(block_q=..., ...)``.

    Attributes:
      blocks: ``block_q``: query block in tokens of the forward, a multiple of 8 (clamped to the
        query length rounded up to 128); the dQ kernel runs on ``lcm(block_q, 128)`` queries when
        it is not a multiple of 128 (module docstring). ``block_kv``: key/value block in tokens,
        a multiple of 128 and ``<= 16384``. ``block_q_dkv``: query block in tokens of the dK/dV
        backward kernel (splash's ``BlockSizes.block_q_dkv``), a multiple of 128; None: the dQ
        kernel's query block. ``block_kv_dkv``: key/value block in tokens of the dK/dV backward
        kernel, a multiple of 128 and ``<= 16384``; None: ``block_kv``.

    Raises:
      ValueError: block sizes that splash cannot tile.
      KernelNotAvailableError: this JAX has no Pallas splash attention.
    """

    blocks: BlockSizes = eqx.field(static=True)
    mosaic_calls_per_chunk: ClassVar[tuple[int, int] | None] = (
        1,
        2,
    )  # the forward kernel; the dQ and the dK/dV kernels

    def __init__(self, *blocks: BlockSizes | int | None, **block_sizes: int | None):
        self.blocks = as_blocks(blocks, block_sizes)

    @classmethod
    def check_blocks(cls, blocks: BlockSizes) -> None:
        """Splash's tiling rules (module docstring), then whether splash imports here."""
        if blocks.block_q < SUBLANES or blocks.block_q % SUBLANES:
            raise ValueError(
                f"plan.attention.kernel='splash' needs plan.attention.block_q to be a positive multiple of {SUBLANES} "
                f"tokens (the TPU sublanes splash's forward tiles queries by), got {blocks.block_q}; e.g. "
                f"{max(SUBLANES, _round_up(blocks.block_q, SUBLANES))}, or use kernel='xla' for other block sizes"
            )
        for name in ("block_kv", "block_q_dkv", "block_kv_dkv"):
            b = getattr(blocks, name)
            if b is not None and (b < LANES or b % LANES):
                raise ValueError(
                    f"plan.attention.kernel='splash' needs plan.attention.{name} to be a positive multiple of {LANES} "
                    f"tokens (the TPU lane width splash tiles {'keys' if 'kv' in name else 'backward queries'} by), "
                    f"got {b}; e.g. {max(LANES, _round_up(b, LANES))}, or use kernel='xla' for other block sizes"
                )
        for name in ("block_kv", "block_kv_dkv"):
            b = getattr(blocks, name)
            if b is not None and b > MAX_KV_CHUNK:
                raise ValueError(
                    f"plan.attention.kernel='splash' needs plan.attention.{name} <= {MAX_KV_CHUNK} tokens (two "
                    f"15-bit key indices share one int32 of mask data), got {b}"
                )
        lcm = math.lcm(blocks.block_kv, blocks.block_kv_dkv) if blocks.block_kv_dkv is not None else 0
        if lcm > MAX_KV_CHUNK:
            raise ValueError(
                f"plan.attention.kernel='splash' needs kv chunks of whole blocks of both plan.attention.block_kv "
                f"({blocks.block_kv}) and block_kv_dkv ({blocks.block_kv_dkv}), whose least common multiple "
                f"{lcm} exceeds {MAX_KV_CHUNK} tokens; make one a multiple of the other"
            )
        splash_internals()  # KernelNotAvailableError before anything compiles

    # -- memory price (the ledger: lcx.cost.attention_memory); tiles live in VMEM, 0 HBM -------
    @classmethod
    def forward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """The float32 output and logsumexp, ``b t n (h + 1)``."""
        return 4 * call.local_batch * call.q_len * call.q_heads * (call.head_dim + 1)

    @classmethod
    def backward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """dout (``a`` bytes) and the float32 dq, dk, dv outputs."""
        b, t, s, n, k, h = call.local_batch, call.q_len, call.kv_len, call.q_heads, call.kv_heads, call.head_dim
        return b * t * n * h * call.act_bytes + 4 * b * (t * n * h + 2 * s * k * h)

    @classmethod
    def prologue_bytes(cls, call: KernelCall) -> int:
        return 0  # the Pallas calls allocate their accumulators themselves

    def step_tile_bytes(self, batch: int, q_len: int, kv_len: int, group: int) -> int:
        return 0  # tiles in VMEM

    def forward(self, q: QueryBlock, kv: KVBlock, *, mask: Mask) -> OutLse:
        sp = splash_internals()
        plan = _Plan(q.q.shape[1], kv.k.shape[1], self.blocks.block_q, self.blocks.block_kv)  # forward blocks only
        block_sizes = sp.block_sizes(block_q=plan.bq, block_kv=plan.bkv, block_kv_compute=plan.bkv)

        def chunk(qh, kc, vc, lo_c, hi_c, empty_c):
            info, _ = _block_info(sp, lo_c, hi_c, plan.bq, plan.bkv, plan.chunk // plan.bkv, empty_c)
            o_c, (l_c,) = sp.forward(
                info,
                qh,
                kc,
                vc,
                None,
                None,
                block_sizes=block_sizes,
                residual_checkpoint_name=None,
                save_residuals=True,
                **_settings(sp),
            )
            o_c = jnp.where(empty_c[None, :, None], 0.0, o_c.astype(_F32))
            return o_c, jnp.where(empty_c[None, :], -jnp.inf, l_c.astype(_F32))

        return chunked_forward(plan, mask, q, kv, chunk)

    def backward(self, q: QueryBlock, kv: KVBlock, ct: Cotangent, *, mask: Mask) -> Grads:
        sp = splash_internals()
        plan = _Plan.of(q.q.shape[1], kv.k.shape[1], self.blocks)

        def chunk(qh, kc, vc, lse, doh, di, lo_c, hi_c, empty_c):
            dq_info, dkv_info = _block_info(sp, lo_c, hi_c, plan.bq_dq, plan.bkv, plan.chunk // plan.bkv, empty_c)
            if (plan.bq_dkv, plan.bkv_dkv) != (plan.bq_dq, plan.bkv):  # the dK/dV kernel's own grid
                _, dkv_info = _block_info(
                    sp, lo_c, hi_c, plan.bq_dkv, plan.bkv_dkv, plan.chunk // plan.bkv_dkv, empty_c
                )
            grads = _splash_bwd(sp, qh, kc, vc, lse, doh, di, dq_info, dkv_info, plan)
            return tuple(g.astype(_F32) for g in grads)

        return chunked_backward(plan, mask, q, kv, ct, chunk, None)


def _settings(sp: SplashInternals) -> dict:
    """What every splash call of lcx passes alike: MHA (GQA by head index, K/V never repeated),
    splash's mask value, the sorted-interval mask function, interpret mode off TPU."""
    return {"is_mqa": False, "mask_value": sp.mask_value, "mask_function": _mask_fn, "interpret": interpret()}


def _splash_bwd(sp: SplashInternals, q, k, v, lse, do, di, dq_info, dkv_info, plan: _Plan):
    """Splash's own backward kernels with the GLOBAL ``lse`` and ``di = sum(dout * out)``.

    JAX-private functions, reached through :mod:`lcx.attention.kernels.jax_splash`; ``q`` is already
    scaled, so dK comes out right and dQ is w.r.t. the scaled q. The dQ kernel runs on the
    dQ kernel's blocks ``plan.bq_dq x plan.bkv`` (``dq_info``'s grid), the dK/dV kernel on
    ``plan.bq_dkv x plan.bkv_dkv`` (``dkv_info``'s grid).
    """
    layout = sp.head_dim_minor
    common = dict(attn_logits_soft_cap=None, q_layout=layout, k_layout=layout, v_layout=layout, **_settings(sp))
    operands = (q, k, v, None, None, lse, do, di)  # both kernels: no segment ids, the global lse and di
    dq = sp.bwd_dq(*operands, bq=plan.bq_dq, bkv=plan.bkv, mask_info=dq_info, **common)
    _, dk, dv = sp.bwd_dkv(*operands, **plan.dkv_blocks, use_fused_bwd_kernel=False, mask_info=dkv_info, **common)
    return dq, dk, dv
