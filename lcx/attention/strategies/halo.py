"""Halo exchange for sliding-window and chunked layers: each device fetches only the keys before
its chunks that its queries can see.

A causal sliding window ``W`` lets a query see at most the ``W - 1`` keys before it; chunked
attention (chunk ``C``) at most the keys back to its chunk's start. Under context parallelism a
device's queries thus need, besides its own keys, only the last ``h`` tokens of the layout chunk
just before each of its chunks (``h = W - 1``, or what the chunk grid needs; 0 when shard and
chunk boundaries align): O(W) bytes per device, where the ring and all-gather move O(S). Which
device holds those tokens follows from the layout (:mod:`lcx.attention.strategies.halo_pricing`,
module docstring: contiguous one ``ppermute``, zigzag two, balanced ``P - 1`` since its chunk
owners are per row and data-dependent). The received K/V, with their global positions and
segment ids, are appended to the local keys and the kernel runs once on ``T`` queries against
``T + received`` keys: the mask, a predicate on positions and segment ids, hides every received
key a query may not see, and keys of a device that received nothing in a round are marked
padding (segment id -1). So documents, GQA, sinks and ``return_lse`` are those of the kernel
call (:func:`lcx.attention.flash.flash_blocks`, as :class:`~lcx.attention.strategies.AllGather`).

**Backward** by autodiff around the kernel's custom VJP: the transpose of a ``ppermute`` is the
reverse ``ppermute``, so each halo's dK/dV goes back to the device that sent the keys and adds to
its own; positions and segment ids have no cotangent.

**Refused** (:meth:`Halo.check_layer` before compiling, :meth:`Halo.check` on local shapes): a
global layer (the fix: another strategy for that kind, e.g. ``{global: ring, sliding: halo}``);
a bidirectional window or chunk (the halo is the keys BEFORE a chunk); and a halo longer than one
layout chunk (``W - 1 > c``, e.g. ``W = 1024`` on zigzag chunks of 512 tokens), which would need
further hops: the message names ``W`` (or ``C``), the chunk length and the fixes. Decision: one
hop only; a longer window is cheaper on the ring anyway once it spans several devices' chunks.

**Assumes** (as ``lcx.data`` writes and the layouts keep) that in the original token order the
positions of one document (of the row, without a document mask) grow by one per token, so a key
the mask shows a query lies within ``h`` tokens before it.

**Planner.** ``halo`` serves layer kinds, not whole models: :meth:`Halo.search_meshes` offers no
mesh for a whole-model search; a per-kind plan names it for sliding and chunked layers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.flash import Output, flash_blocks
from lcx.attention.kernels import AbstractKernel
from lcx.attention.masks import Mask
from lcx.attention.strategies.base import AbstractStrategy, Shape
from lcx.attention.strategies.halo_pricing import (
    HaloGeometry,
    halo_buffer_bytes,
    halo_geometry,
    halo_refusal,
    halo_residual_bytes,
    halo_traffic,
    shard_geometry,
)
from lcx.attention.strategies.pricing import AttentionShard, RingHop, SearchMesh, Traffic
from lcx.sharding.errors import PlanError
from lcx.sharding.plan import AttentionConfig, Plan


def _tails(kv: KVBlock, slots: tuple[int, ...], c: int, h: int) -> KVBlock:
    """The last ``h`` tokens of each local layout chunk in ``slots`` (chunks of ``c`` tokens),
    concatenated along the sequence: ``[B, len(slots) h, ...]`` per leaf."""
    ends = [(s + 1) * c for s in slots]
    return jax.tree.map(lambda x: jnp.concatenate([x[:, e - h : e] for e in ends], axis=1), kv)


def exchange(kv: KVBlock, g: HaloGeometry, axes: tuple[str, ...]) -> KVBlock:
    """This device's keys followed by its halo (inside ``shard_map`` over ``axes``).

    Args:
      kv: the local K/V ``[B, T, K, H]`` with int32 positions and segment ids ``[B, T]``.
      g: the layer's :class:`HaloGeometry` (``T = g.slots * g.chunk_len``).
      axes: mesh axes the sequence is split over (linear index major to minor: the devices of
        ``g.rounds``' pairs).

    Returns:
      :class:`KVBlock` of ``T + g.received`` keys: every received tail of ``h`` keys followed
      by ``g.piece - h`` padding keys (its last key repeated, segment id -1); a round's keys on a device that receives nothing in it
      are padding too (segment id -1).
    """
    if not g.rounds:
        return kv
    me = lax.axis_index(axes)
    parts = [kv]
    h, pad = g.halo, g.piece - g.halo
    for r in g.rounds:
        pairs = list(r.pairs)
        got = jax.tree.map(lambda x, p=pairs: lax.ppermute(x, axes, p), _tails(kv, r.src_slots, g.chunk_len, h))
        here = jnp.asarray(r.receives(g.degree))[me]
        got = got._replace(seg=jnp.where(here, got.seg, -1))
        for i in range(len(r.src_slots)):
            tail = jax.tree.map(lambda x, i=i: x[:, i * h : (i + 1) * h], got)
            parts.append(tail)
            if pad:  # local padding, never sent: the tail's last token repeated as padding (segment
                # id -1); its position keeps the tail's range, so block tests still skip the tile
                fill = jax.tree.map(lambda x: jnp.repeat(x[:, -1:], pad, axis=1), tail)
                parts.append(fill._replace(seg=jnp.full_like(fill.seg, -1)))
    return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *parts)


class Halo(AbstractStrategy):
    """Halo exchange over the sequence axes for sliding-window and chunked layers (module
    docstring).

    Attributes:
      kernel: per-device kernel.
      mask: a causal sliding-window or chunked mask.
      axes: mesh axes the sequence is split over (major to minor); ``()``: context degree 1.
      degree: P, the product of their sizes.
      layout: ``plan.attention.layout`` (which original tokens each device holds).
      layout_block: the balanced layout's block, ``max(block_q, block_kv)`` in tokens.
    """

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    degree: int = eqx.field(static=True)
    layout: str = eqx.field(static=True, default="zigzag")
    layout_block: int = eqx.field(static=True, default=512)
    name: ClassVar[str] = "halo"
    output_all_to_all: ClassVar[bool] = False

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config: AttentionConfig) -> Halo:
        return cls(
            kernel=kernel,
            mask=mask,
            axes=tuple(seq_axes),
            degree=math.prod(axis_sizes[a] for a in seq_axes),
            layout=config.layout,
            layout_block=max(config.block_q, config.block_kv),
        )

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        """Refuse a mask or local length this halo cannot serve.

        Raises:
          ValueError: :func:`~lcx.attention.strategies.halo_pricing.halo_refusal`'s message.
        """
        why = halo_refusal(self.mask, self.layout, q_shape[1] * self.degree, self.degree, self.layout_block)
        if why is not None:
            raise ValueError(why)

    def __call__(
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        """:meth:`AbstractStrategy.__call__`: the local queries against the local keys plus the
        halo (``T + received`` keys, one kernel call).

        Raises:
          ValueError: :meth:`check`'s refusals, at trace time.
        """
        g = halo_geometry(self.mask, self.layout, q.q.shape[1] * self.degree, self.degree, self.layout_block)
        kv = exchange(kv, g, self.axes) if self.degree > 1 else kv
        return flash_blocks(q, kv, mask=self.mask, kernel=self.kernel, sinks=sinks, return_lse=return_lse)

    # -- plan rules ------------------------------------------------------------------------------
    @classmethod
    def check_plan_axes(cls, plan: Plan) -> None:
        return None  # whatever axes split the sequence

    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices) -> None:
        return None  # any head counts: K/V travel at their own head count

    @classmethod
    def check_layer(cls, mask: Mask, plan: Plan, mesh_shape: Mapping[str, int], seq_len: int) -> None:
        """Refuse a global or bidirectional layer, or a halo longer than one layout chunk.

        Raises:
          PlanError: naming the kind, ``W`` or ``C``, the chunk length and the fix.
        """
        att = plan.attention
        P = math.prod(mesh_shape[a] for a in plan.seq_axes)
        why = halo_refusal(mask, att.layout, seq_len, P, max(att.block_q, att.block_kv))
        if why is not None:
            raise PlanError(why)

    @classmethod
    def search_meshes(cls, data: int, context: int) -> tuple[SearchMesh, ...]:
        return ()  # a layer-kind strategy: offered per kind, never for a whole model (module docstring)

    # -- price (lcx.attention.strategies.halo_pricing) -------------------------------------------
    @classmethod
    def all_to_all_degree(cls, config: AttentionConfig, mesh_shape: Mapping[str, int]) -> int:
        return 1

    @classmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        return s.local_len, s.local_len + shard_geometry(s).received, s.heads, s.kv_heads

    @classmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        return halo_buffer_bytes(s)

    @classmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        return halo_residual_bytes(s)

    @classmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        return halo_traffic(s, layers=layers, replay=replay) if s.context_degree > 1 else Traffic()

    @classmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        return 1  # a query sees at most W (or C) keys wherever it sits: no causal imbalance

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        return None  # the halo arrives before the one kernel call: nothing to overlap
