"""All-gather context parallelism (the Llama 3 / MaxText default).

Each device all-gathers K and V (at their own kv-head count: never repeated for GQA) together
with their global positions and segment ids, then its local query shard attends to the whole
sequence with the local flash kernel. Communication ``2 (P-1)/P * S * K * H`` elements per
device per layer; memory holds the full K/V, O(S) per device. Backward: the kernel's custom VJP
gives dK/dV for the full sequence and the transpose of the all-gather (a reduce-scatter) returns
each device its shard. (Grattafiori et al. 2024, "The Llama 3 Herd of Models", section 3.3.2.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
import jax
from jax import lax
from jaxtyping import Array, Float

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.flash import Output, flash_blocks
from lcx.attention.kernels import AbstractKernel
from lcx.attention.masks import Mask
from lcx.attention.strategies.base import AbstractContextStrategy, Shape
from lcx.attention.strategies.pricing import AttentionShard, RingHop, Traffic


class AllGather(AbstractContextStrategy):
    """All-gather K/V over the sequence axes; local queries attend to the full K/V.

    Attributes:
      kernel: per-device kernel.
      mask: mask predicate.
      axes: mesh axes the sequence is split over (major to minor); ``()``: context degree 1.
    """

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    name: ClassVar[str] = "allgather"
    output_all_to_all: ClassVar[bool] = False

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config) -> AllGather:
        return cls(kernel=kernel, mask=mask, axes=tuple(seq_axes))

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        return None  # any head counts; sequence divisibility is checked by the caller

    def __call__(
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        if self.axes:
            kv = jax.tree.map(lambda x: lax.all_gather(x, self.axes, axis=1, tiled=True), kv)
        return flash_blocks(q, kv, mask=self.mask, kernel=self.kernel, sinks=sinks, return_lse=return_lse)

    # -- plan rules and price (module docstring) ------------------------------------------------
    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices) -> None:
        return None  # any head counts: K/V are gathered at their own head count

    @classmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        return s.local_len, s.seq_len, s.heads, s.kv_heads  # local queries x the gathered sequence

    @classmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        # the gathered K/V and their positions and segment ids (forward and backward alike)
        b, S = s.local_batch, s.seq_len
        return 2 * b * S * s.kv_heads * s.head_dim * s.act_bytes + 2 * b * S * 4

    @classmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        # the kernel saves the gathered K/V: 2 b (S - T) K H a more, and 2 b S int32 positions/ids
        b, S, T = s.local_batch, s.seq_len, s.local_len
        return 2 * b * (S - T) * s.kv_heads * s.head_dim * s.act_bytes + 2 * b * S * 4

    @classmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        # forward all-gather, backward reduce-scatter of dK/dV (same size), a replay gathers again
        P = s.context_degree
        if P <= 1:
            return Traffic()
        b, K, H, a = s.local_batch, s.kv_heads, s.head_dim, s.act_bytes
        return Traffic(all_gather=2 * b * s.seq_len * K * H * a * (P - 1) / P * layers * (2 + replay))

    @classmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        return context_degree  # each device's queries keep the layout's share of causal work

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        return None
