"""Ring attention: K/V blocks rotate peer to peer; queries stay put.

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
Context", arXiv:2310.01889. The P devices of the sequence axes form a ring. At step ``s`` device
``i`` holds the K/V shard of device ``i - s`` (with that shard's global positions and segment
ids, so every mask is evaluated exactly, whatever the layout), runs the local kernel on it and
merges the partial result in float32 through the logsumexp. The transfer for step ``s + 1`` is
issued before the kernel of step ``s`` so that communication can overlap compute; the last step
sends nothing (P-1 K/V hops in forward).

Backward is a custom VJP (as in MaxText and ring-flash-attention): only the local q/k/v, the
float32 output and the logsumexp are saved; K/V rotate again, each with its dK/dV accumulator
travelling one hop behind it (the accumulator is updated by the kernel, then sent on), and dQ
accumulates locally. After P-1 K/V hops a final hop returns every accumulator to its owner.
Memory per device is O(S/P) in training as well as inference.

Both directions use the kernel's accumulating form (:meth:`AbstractKernel.forward_start` /
``forward_step`` / ``forward_finish``, ``backward_start`` / ``backward_step`` /
``backward_finish``): the query side (q; in backward also dout, logsumexp and delta) is prepared
once per pass, not once per ring step, and every step folds its K/V block into running results
kept in the kernel's own layout (for the xla kernel: the online softmax state, the blocked dQ,
and the travelling dK/dV updated in place), so a step allocates no whole-shard partial results.

Steps whose K/V block the mask hides entirely (decided from min/max of the block's positions and
segment ids, :meth:`Mask.may_be_visible`) skip the kernel with ``lax.cond``: with a contiguous
layout and a causal mask, device ``i`` computes only ``i + 1`` of its ``P`` steps. With the
zigzag layout every step has work (that is the point of it: each device does the same amount),
and the kernel skips the hidden tiles inside each step instead, provided its blocks do not
straddle the two zigzag chunks of a shard: keep ``plan.attention.block_q <= S / (2P)``.

Large shards run the ring once per kv head (with its G query heads), one pass after another
(:func:`heads_per_pass`): attention is independent per kv head, and every ring buffer (the K/V
in use and in flight, the travelling dK/dV) shrinks K-fold, so per-device memory falls as 1/P.
Measured (compiled temporaries of forward+backward, S = 16384, 8 heads of 64, float32, zigzag,
256-token blocks): 19.6 / 10.4 / 5.8 MiB at P = 2, 4, 8 (forward alone 12.8 / 6.8 / 3.7): nine
one-head ``[B, T, 1, H]`` float32 buffers (prepared q and dout, dQ, dK/dV, the K/V in use and
in flight) plus 1.3-1.6 MiB of per-tile temporaries that do not shrink with P.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from lcx.attention.blocks import Cotangent, KVBlock, OutLse, QueryBlock, lse_delta, output_delta
from lcx.attention.flash import Output
from lcx.attention.kernels.base import AbstractKernel, kernel_scope
from lcx.attention.kernels.base import merge_partials as merge_partials  # re-exported by lcx.attention.strategies
from lcx.attention.masks import Mask
from lcx.attention.names import name_context
from lcx.attention.sinks import merge_sinks, row_sinks, sinks_grad
from lcx.attention.strategies.base import AbstractContextStrategy, Shape
from lcx.attention.strategies.pricing import AttentionShard, RingHop, Traffic
from lcx.attention.strategies.ring_pricing import PASS_BYTES as PASS_BYTES  # the pass rule's threshold
from lcx.attention.strategies.ring_pricing import heads_per_pass, ring_buffer_bytes, ring_passes, ring_traffic

_F32 = jnp.float32


def _shift(tree, axes, size):
    """Send every leaf to the next device of the ring (``i -> i + 1 mod P``)."""
    if size == 1:
        return tree
    perm = [(i, (i + 1) % size) for i in range(size)]
    return jax.tree.map(lambda x: lax.ppermute(x, axes, perm), tree)


def _forward(kernel: AbstractKernel, mask: Mask, axes, size: int, q: QueryBlock, kv: KVBlock) -> OutLse:
    # the query side is prepared once for all P steps; the running result stays in the kernel's
    # layout (for the xla kernel: its online softmax state, continued block after block)
    prepared, acc = kernel.forward_start(q, kv_heads=kv.k.shape[2])

    def block(acc, kv: KVBlock):
        def visible():
            with kernel_scope(kernel, "forward_step"):
                return kernel.forward_step(prepared, acc, kv, mask=mask)

        return lax.cond(mask.may_be_visible(q.pos, kv.pos, q.seg, kv.seg), visible, lambda: acc)

    def step(carry, _):
        acc, kv = carry
        nxt = _shift(kv, axes, size)  # issued before the kernel: independent of it, so it overlaps
        return (block(acc, kv), nxt), None

    (acc, kv), _ = lax.scan(step, (acc, kv), None, length=size - 1)
    return kernel.forward_finish(prepared, block(acc, kv))  # last block: no transfer after it


def _head_slice(x, i, n):
    return lax.dynamic_slice_in_dim(x, i * n, n, axis=2)


def _head_update(x, part, i):
    return lax.dynamic_update_slice_in_dim(x, part.astype(x.dtype), i * part.shape[2], axis=2)


def _pass_blocks(q: QueryBlock, kv: KVBlock, i, nh: int, kh: int) -> tuple[QueryBlock, KVBlock]:
    """Pass ``i``'s query heads (``nh`` of them) and kv heads (``kh``); positions are shared."""
    q_i = q._replace(q=_head_slice(q.q, i, nh))
    return q_i, kv._replace(k=_head_slice(kv.k, i, kh), v=_head_slice(kv.v, i, kh))


def _forward_passes(kernel, mask, axes, size: int, kvh: int, q: QueryBlock, kv: KVBlock) -> OutLse:
    n, nh, kh = ring_passes(kvh, q.q, kv.k)
    if n == 1:
        return _forward(kernel, mask, axes, size, q, kv)
    B, T, N, H = q.q.shape

    def one(i, carry):
        out, lse = carry
        o, l = _forward(kernel, mask, axes, size, *_pass_blocks(q, kv, i, nh, kh))
        return _head_update(out, o, i), _head_update(lse, l, i)

    init = (jnp.zeros((B, T, N, H), _F32), jnp.full((B, T, N), -jnp.inf, _F32))
    return lax.fori_loop(0, n, one, init)


def _forward_sinks(kernel, mask, axes, size: int, kvh: int, q: QueryBlock, kv: KVBlock, sinks) -> OutLse:
    out, lse = _forward_passes(kernel, mask, axes, size, kvh, q, kv)
    # the sink joins the GLOBAL softmax once, after every ring step and pass
    return (out, lse) if sinks is None else merge_sinks(out, lse, row_sinks(sinks, q.seg))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _ring(kernel, mask, axes, size, kvh, with_lse, q: QueryBlock, kv: KVBlock, sinks):
    out, lse = _forward_sinks(kernel, mask, axes, size, kvh, q, kv, sinks)
    return (out.astype(q.q.dtype), lse) if with_lse else out.astype(q.q.dtype)


def _ring_fwd(kernel, mask, axes, size, kvh, with_lse, q: QueryBlock, kv: KVBlock, sinks):
    out, lse = _forward_sinks(kernel, mask, axes, size, kvh, q, kv, sinks)
    out, lse = name_context(out, lse)  # remat: custom can keep or offload them (model.remat_context)
    return ((out.astype(q.q.dtype), lse) if with_lse else out.astype(q.q.dtype)), (q, kv, out, lse, sinks)


def _ring_bwd(kernel, mask, axes, size, kvh, with_lse, res, ct):
    # with sinks, out and lse include them, so the kernels' backward below is exact unchanged
    q, kv, out, lse, sinks = res
    dout, dlse = ct if with_lse else (ct, None)
    n, nh, kh = ring_passes(kvh, q.q, kv.k)
    if n == 1:
        dq, dk, dv = _backward(kernel, mask, axes, size, q, kv, Cotangent.of(out, lse, dout, dlse))
    else:

        def one(i, carry):
            sl = lambda x: _head_slice(x, i, nh)
            cot = Cotangent.of(sl(out), sl(lse), sl(dout), None if dlse is None else sl(dlse))
            parts = _backward(kernel, mask, axes, size, *_pass_blocks(q, kv, i, nh, kh), cot)
            return tuple(_head_update(acc, part, i) for acc, part in zip(carry, parts))

        zeros = tuple(jnp.zeros(x.shape, x.dtype) for x in (q.q, kv.k, kv.v))
        dq, dk, dv = lax.fori_loop(0, n, one, zeros)
    # the sinks need delta over all heads; the passes above each take their own heads' slice
    ds = None if sinks is None else sinks_grad(lse_delta(output_delta(out, dout), dlse), lse, sinks).astype(sinks.dtype)
    return q.cotangent(dq), kv.cotangent(dk, dv), ds


def _backward(kernel, mask, axes, size: int, q: QueryBlock, kv: KVBlock, ct: Cotangent):
    # ct.delta = rowsum(dout * out) once for all P blocks (not once per block): the float32 output
    # is then dead during the ring, one [B, T, N, H] buffer less per device. With the logsumexp
    # an output too, its cotangent enters through delta - dlse (lcx.attention.blocks.lse_delta).
    # The query side (q, dout, lse, delta) is prepared once for all P steps and dQ accumulates in
    # the kernel's layout; the kernel adds dK/dV into the travelling accumulators in place
    prepared, dq = kernel.backward_start(q, ct, kv_heads=kv.k.shape[2])

    def block(dq, kv: KVBlock, dkv):
        def visible():
            with kernel_scope(kernel, "backward_step"):
                return kernel.backward_step(prepared, (dq, *dkv), kv, mask=mask)

        dq, dk, dv = lax.cond(mask.may_be_visible(q.pos, kv.pos, q.seg, kv.seg), visible, lambda: (dq, *dkv))
        return dq, (dk, dv)

    def step(carry, _):
        dq, kv, dkv = carry
        nxt = _shift(kv, axes, size)  # prefetch the next K/V before the kernel
        dq, dkv = block(dq, kv, dkv)
        dkv = _shift(dkv, axes, size)  # the accumulator follows its K/V shard, one hop behind
        return (dq, nxt, dkv), None

    zeros_kv = (jnp.zeros(kv.k.shape, _F32), jnp.zeros(kv.v.shape, _F32))
    (dq, kv, dkv), _ = lax.scan(step, (dq, kv, zeros_kv), None, length=size - 1)
    dq, dkv = block(dq, kv, dkv)
    # device i now holds the accumulator of device i + 1's K/V: one last hop brings it home
    dk, dv = _shift(dkv, axes, size)
    return kernel.backward_finish(prepared, dq), dk, dv


_ring.defvjp(_ring_fwd, _ring_bwd)


class Ring(AbstractContextStrategy):
    """Ring attention over all sequence axes (one ring of P = context degree devices).

    Attributes:
      kernel: per-device kernel.
      mask: mask predicate.
      axes: mesh axes of the ring, the sequence axes (a tuple: an 8-device ring over a 2x4 mesh
        uses both); the linear device index over them, major to minor, is the ring order.
      degree: ring size P (the product of their sizes).
      kv_heads_per_pass: run the whole ring once per group of this many kv heads (with their G
        query heads each), one group after another; ``None``: :func:`heads_per_pass`.
    """

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    degree: int = eqx.field(static=True)
    kv_heads_per_pass: int | None = eqx.field(static=True, default=None)
    name: ClassVar[str] = "ring"
    output_all_to_all: ClassVar[bool] = False

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config) -> Ring:
        return cls(kernel=kernel, mask=mask, axes=tuple(seq_axes), degree=math.prod(axis_sizes[a] for a in seq_axes))

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        return None  # any head counts; sequence divisibility is checked by the caller

    def __call__(
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        """Ring attention of this device's ``q`` against every device's ``kv`` over
        :attr:`axes` (inside ``jax.shard_map``): :meth:`AbstractStrategy.__call__`, with the
        ``sinks`` merged once into the ring's final ``(out, lse)``.

        Raises:
          ValueError: :attr:`kv_heads_per_pass` does not divide the local kv heads.
        """
        k, kernel = kv.k, self.kernel
        K = k.shape[2]
        if self.kv_heads_per_pass is None:
            tiles = kernel.step_tile_bytes(k.shape[0], q.q.shape[1], k.shape[1], q.q.shape[2] // K)
            kvh = heads_per_pass(k.shape, k.dtype, tiles)
        else:
            kvh = int(self.kv_heads_per_pass)
        if kvh < 1 or K % kvh:
            raise ValueError(f"ring: kv_heads_per_pass={kvh} must divide the {K} kv heads per device")
        # K/V made data-dependent on the queries (a zero XLA folds away), for the reason positions
        # are in lcx.attention.api._tie_masks_to_queries: when K/V are loop-invariant in a scan
        # over layers (shared K/V), JAX hoists their P - 1 rotations out of the loop and keeps
        # every rotated copy, a [P - 1, B, T, K, H] stack (O(S) per device, not O(S / P))
        x = q.q[(0,) * q.q.ndim]
        zero = jnp.where(x == x, 0, 0).astype(k.dtype)  # NaN-safe: 0 for every x
        kv = kv._replace(k=k + zero, v=kv.v + zero)
        return _ring(kernel, self.mask, self.axes, self.degree, kvh, bool(return_lse), q, kv, sinks)

    # -- plan rules and price (module docstring) ------------------------------------------------
    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices) -> None:
        return None  # any head counts

    @classmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        return s.local_len, s.local_len, s.heads, s.kv_heads  # one T x T block per step

    @classmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        return ring_buffer_bytes(s.local_batch, s.local_len, s.kv_heads, s.head_dim, s.act_bytes, backward=backward)

    @classmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        return 0  # each step's K/V is fetched again in the backward

    @classmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        if s.context_degree <= 1:
            return Traffic()
        return ring_traffic(
            s.local_batch,
            s.local_len,
            s.kv_heads,
            s.head_dim,
            s.act_bytes,
            s.context_degree,
            layers=layers,
            replay=replay,
        )

    @classmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        return context_degree  # the ring inherits the layout's causal imbalance

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        block = seq_len // context_degree
        return RingHop(block, n_heads, n_kv_heads) if block and context_degree > 1 else None
