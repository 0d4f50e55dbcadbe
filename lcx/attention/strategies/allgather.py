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

import equinox as eqx
from jax import lax
from jaxtyping import Array, Float, Int

from lcx.attention.flash import flash_attention
from lcx.attention.kernels import Kernel
from lcx.attention.masks import Mask
from lcx.attention.strategies.base import Shape, Strategy


class AllGather(Strategy):
    """All-gather K/V over the sequence axes; local queries attend to the full K/V.

    Attributes:
      kernel: per-device kernel.
      mask: mask predicate.
      axes: mesh axes the sequence is split over (major to minor); ``()``: context degree 1.
    """

    kernel: Kernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config) -> AllGather:
        return cls(kernel=kernel, mask=mask, axes=tuple(seq_axes))

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        return None  # any head counts; sequence divisibility is checked by the caller

    def __call__(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B T K H"],
        v: Float[Array, "B T K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B T"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B T"],
        sinks: Float[Array, " N"] | None = None,
        return_lse: bool = False,
    ) -> Float[Array, "B T N H"] | tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
        if self.axes:
            k, v, k_pos, k_seg = (lax.all_gather(x, self.axes, axis=1, tiled=True) for x in (k, v, k_pos, k_seg))
        return flash_attention(q, k, v, q_pos, k_pos, q_seg, k_seg, mask=self.mask, kernel=self.kernel, sinks=sinks,
                               return_lse=return_lse)
