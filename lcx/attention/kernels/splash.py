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
  ``lower = (q_seg, q_pos - window + 1)`` (``-inf`` position without a window) and
  ``upper = (q_seg, q_pos)`` if causal, ``(q_seg, q_pos + window - 1)`` for a bidirectional
  window, ``(q_seg, +inf)`` otherwise (drop ``q_seg`` without a document mask).

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
runs) with the global ``lse`` and ``delta = sum(dout * out)`` as their residuals. These are
private functions of JAX 0.10.2; the adapter pins their signatures in one place
(:func:`_splash_bwd`), and the tests compare against the dense reference so an API change
fails loudly.

**Scale.** Splash does not scale logits; the adapter multiplies q by ``1/sqrt(H)`` once
(:func:`_prescale`, the one place the scale lives) and applies the same factor to dQ by the
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

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from lcx.attention.kernels.base import KernelCall, as_blocks, merge_partials, output_delta
from lcx.attention.kernels.composed import AbstractComposedKernel
from lcx.attention.kernels.splash_intervals import _HI_BITS as _HI_BITS
from lcx.attention.kernels.splash_intervals import LANES as LANES
from lcx.attention.kernels.splash_intervals import MAX_KV_CHUNK as MAX_KV_CHUNK
from lcx.attention.kernels.splash_intervals import SUBLANES as SUBLANES
from lcx.attention.kernels.splash_intervals import _block_info, _intervals, _mask_fn, _Plan, _round_up
from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes

_F32 = jnp.float32


class KernelNotAvailableError(NotImplementedError):
    """The plan names a kernel that cannot run here (e.g. its library is missing)."""


def _splash_modules():
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi
    except ImportError as e:  # pragma: no cover - depends on the installed JAX
        raise KernelNotAvailableError(
            f"plan.attention.kernel='splash' needs jax.experimental.pallas splash attention, which failed to import "
            f"({e}); install a JAX with Pallas or set plan.attention.kernel='xla'"
        ) from e
    return sk, mi


def _prescale(x: Array) -> Array:
    # The ONE place the softmax scale lives (splash itself never scales): the forward multiplies
    # q by it, the backward reuses it for the chain rule of that same linear map.
    return x * jnp.asarray(1.0 / (x.shape[-1] ** 0.5), x.dtype)


def _interpret() -> bool:
    return jax.default_backend() != "tpu"


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
        _splash_modules()

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

    # -- per batch row, per kv chunk ------------------------------------------------------------

    def _prepare(self, plan: _Plan, mask: Mask, q_pos, q_seg, k_pos, k_seg):
        """Sort every kv chunk by the mask's key, and each query's interval in every chunk.

        Args: one batch row: ``q_pos, q_seg`` ``[T]``, ``k_pos, k_seg`` ``[S]`` int32.
        Returns: ``perm`` ``[n, C]`` (sorted index -> padded kv index), ``lo, hi`` ``[n, Tp]``,
        ``empty`` ``[n, Tp]`` bool.
        """
        n, C = plan.n_chunks, plan.chunk
        pad_k = plan.Sp - plan.S
        # keys past S (tiling) and padding keys (negative segment id) sort after the real keys of
        # their chunk, where no query's interval reaches: n_real counts the others
        is_pad = jnp.concatenate([(k_seg < 0).astype(jnp.int32), jnp.ones(pad_k, jnp.int32)])
        kp = jnp.pad(k_pos, (0, pad_k)).reshape(n, C)
        ks = jnp.pad(k_seg, (0, pad_k)).reshape(n, C)
        is_pad = is_pad.reshape(n, C)
        idx = jnp.arange(plan.Sp, dtype=jnp.int32).reshape(n, C)
        n_real = C - is_pad.sum(axis=1, dtype=jnp.int32)
        if mask.document:
            _, ks_s, kp_s, perm = lax.sort((is_pad, ks, kp, idx), dimension=1, num_keys=3)
        else:
            _, kp_s, perm = lax.sort((is_pad, kp, idx), dimension=1, num_keys=2)
            ks_s = jnp.zeros_like(kp_s)
        pad_q = plan.Tp - plan.T
        qp = jnp.pad(q_pos, (0, pad_q))
        qs = jnp.pad(q_seg, (0, pad_q))
        q_real = (jnp.arange(plan.Tp) < plan.T) & (qs >= 0)  # padding queries are empty rows
        lo, hi = jax.vmap(lambda a, b, c: _intervals(mask, qp, qs, a, b, c))(kp_s, ks_s, n_real)
        empty = (lo >= hi) | ~q_real[None, :]
        lo = jnp.where(empty, 0, lo)
        hi = jnp.where(empty, 0, hi)
        return perm, lo, hi, empty

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
        sk, mi = _splash_modules()
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        _groups(N, K)
        plan = _Plan(T, S, self.block_q, self.block_kv)
        interpret = _interpret()
        block_sizes = sk.BlockSizes(block_q=plan.bq, block_kv=plan.bkv, block_kv_compute=plan.bkv)

        def row(q, k, v, q_pos, k_pos, q_seg, k_seg):
            perm, lo, hi, empty = self._prepare(plan, mask, q_pos, q_seg, k_pos, k_seg)
            qh = _prescale(jnp.pad(q, ((0, plan.Tp - T), (0, 0), (0, 0)))).transpose(1, 0, 2)  # [N, Tp, H]
            kh = jnp.pad(k, ((0, plan.Sp - S), (0, 0), (0, 0)))
            vh = jnp.pad(v, ((0, plan.Sp - S), (0, 0), (0, 0)))

            def chunk(carry, xs):
                out, lse = carry
                perm_c, lo_c, hi_c, empty_c = xs
                kc = kh[perm_c].transpose(1, 0, 2)  # [K, C, H] sorted by the mask key
                vc = vh[perm_c].transpose(1, 0, 2)
                info, _ = _block_info(mi, lo_c, hi_c, plan.bq, plan.bkv, plan.chunk // plan.bkv, empty_c)
                o_c, (l_c,) = sk._splash_attention_forward(
                    info,
                    qh,
                    kc,
                    vc,
                    None,
                    None,
                    mask_value=sk.DEFAULT_MASK_VALUE,
                    is_mqa=False,
                    block_sizes=block_sizes,
                    residual_checkpoint_name=None,
                    save_residuals=True,
                    mask_function=_mask_fn,
                    interpret=interpret,
                )
                o_c = jnp.where(empty_c[None, :, None], 0.0, o_c.astype(_F32))
                l_c = jnp.where(empty_c[None, :], -jnp.inf, l_c.astype(_F32))
                return merge_partials(out, lse, o_c, l_c), None

            init = (jnp.zeros((N, plan.Tp, H), _F32), jnp.full((N, plan.Tp), -jnp.inf, _F32))
            (out, lse), _ = lax.scan(chunk, init, (perm, lo, hi, empty))
            return out.transpose(1, 0, 2)[:T], lse.T[:T]

        return jax.vmap(row)(q, k, v, q_pos, k_pos, q_seg, k_seg)

    def backward(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B S"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B S"],
        out: Float[Array, "B T N H"] | None,
        lse: Float[Array, "B T N"],
        dout: Float[Array, "B T N H"],
        *,
        mask: Mask,
        delta: Float[Array, "B T N"] | None = None,
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B S K H"], Float[Array, "B S K H"]]:
        sk, mi = _splash_modules()
        B, T, N, H = q.shape
        S, K = k.shape[1], k.shape[2]
        _groups(N, K)
        plan = _Plan(T, S, self.block_q, self.block_kv, self.block_q_dkv, self.block_kv_dkv)
        interpret = _interpret()

        if delta is None:
            delta = output_delta(out, dout)  # [B, T, N]

        def row(q, k, v, q_pos, k_pos, q_seg, k_seg, delta, lse, dout):
            perm, lo, hi, empty = self._prepare(plan, mask, q_pos, q_seg, k_pos, k_seg)
            padq = ((0, plan.Tp - T), (0, 0), (0, 0))
            qh = _prescale(jnp.pad(q, padq)).transpose(1, 0, 2)  # [N, Tp, H]
            doh = jnp.pad(dout, padq).astype(q.dtype).transpose(1, 0, 2)
            di = jnp.pad(delta.astype(_F32), ((0, plan.Tp - T), (0, 0))).T  # [N, Tp]
            # a row that sees no key anywhere has lse = -inf: any finite value makes its masked
            # probabilities exp(mask_value - lse) = 0 (its dout/delta then contribute nothing)
            lse_h = jnp.pad(jnp.where(jnp.isfinite(lse), lse, 0.0).astype(_F32), ((0, plan.Tp - T), (0, 0))).T
            kh = jnp.pad(k, ((0, plan.Sp - S), (0, 0), (0, 0)))
            vh = jnp.pad(v, ((0, plan.Sp - S), (0, 0), (0, 0)))

            def chunk(dq, xs):
                perm_c, lo_c, hi_c, empty_c = xs
                kc = kh[perm_c].transpose(1, 0, 2)
                vc = vh[perm_c].transpose(1, 0, 2)
                dq_info, dkv_info = _block_info(mi, lo_c, hi_c, plan.bq_dq, plan.bkv, plan.chunk // plan.bkv, empty_c)
                if (plan.bq_dkv, plan.bkv_dkv) != (plan.bq_dq, plan.bkv):  # the dK/dV kernel's own grid
                    _, dkv_info = _block_info(
                        mi, lo_c, hi_c, plan.bq_dkv, plan.bkv_dkv, plan.chunk // plan.bkv_dkv, empty_c
                    )
                dq_c, dk_c, dv_c = _splash_bwd(sk, qh, kc, vc, lse_h, doh, di, dq_info, dkv_info, plan, interpret)
                # sorted chunk order -> the caller's kv order
                inv = jnp.argsort(perm_c)
                return dq + dq_c.astype(_F32), (dk_c.astype(_F32)[:, inv], dv_c.astype(_F32)[:, inv])

            dq, (dk, dv) = lax.scan(chunk, jnp.zeros((N, plan.Tp, H), _F32), (perm, lo, hi, empty))
            # dk, dv: [n, K, C, H] -> [Sp, K, H]
            dk = dk.transpose(0, 2, 1, 3).reshape(plan.Sp, K, H)[:S]
            dv = dv.transpose(0, 2, 1, 3).reshape(plan.Sp, K, H)[:S]
            return _prescale(dq.transpose(1, 0, 2)[:T]), dk, dv

        return jax.vmap(row)(q, k, v, q_pos, k_pos, q_seg, k_seg, delta, lse, dout)


def _splash_bwd(sk, q, k, v, lse, do, di, dq_info, dkv_info, plan: _Plan, interpret: bool):
    """Splash's own backward kernels with the GLOBAL ``lse`` and ``di = sum(dout * out)``.

    The only use of JAX-private splash functions (signatures of JAX 0.10.2); ``q`` is already
    scaled, so dK comes out right and dQ is w.r.t. the scaled q. The dQ kernel runs on the
    dQ kernel's blocks ``plan.bq_dq x plan.bkv`` (``dq_info``'s grid), the dK/dV kernel on
    ``plan.bq_dkv x plan.bkv_dkv`` (``dkv_info``'s grid).
    """
    layout = sk.QKVLayout.HEAD_DIM_MINOR
    common = dict(
        is_mqa=False,
        mask_value=sk.DEFAULT_MASK_VALUE,
        attn_logits_soft_cap=None,
        q_layout=layout,
        k_layout=layout,
        v_layout=layout,
        mask_function=_mask_fn,
        interpret=interpret,
    )
    dq = sk._splash_attention_bwd_dq(
        q, k, v, None, None, lse, do, di, bq=plan.bq_dq, bkv=plan.bkv, mask_info=dq_info, **common
    )
    _, dk, dv = sk._splash_attention_bwd_dkv(
        q,
        k,
        v,
        None,
        None,
        lse,
        do,
        di,
        bq=plan.bq_dkv,
        bkv=plan.bkv_dkv,
        bkv_compute=plan.bkv_dkv,
        use_fused_bwd_kernel=False,
        mask_info=dkv_info,
        **common,
    )
    return dq, dk, dv


def _groups(n_heads: int, n_kv_heads: int) -> int:
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads {n_heads} must be a multiple of kv heads {n_kv_heads} (GQA)")
    return n_heads // n_kv_heads
