"""The abstract context-parallel attention strategy.

A strategy is what one device does inside ``jax.shard_map`` with its sequence shard of q, k, v,
positions and segment ids: which collectives move what, and how often it calls the per-device
:class:`~lcx.attention.kernels.Kernel`. Strategies follow Equinox's abstract/final pattern: this
class declares the interface, each concrete strategy is a final class implementing it once, and
``lcx.attention.strategies.STRATEGIES`` maps the plan's name to the class, so a fifth strategy is
one new file plus one registry line.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping

import equinox as eqx
from jaxtyping import Array, Float, Int

from lcx.attention.kernels import Kernel
from lcx.attention.masks import Mask

Shape = tuple[int, ...]


class Strategy(eqx.Module):
    """Abstract context-parallel attention strategy (per-device program inside ``shard_map``).

    Attributes:
      kernel: the per-device attention kernel.
      mask: the visibility predicate on global positions and segment ids.
    """

    kernel: eqx.AbstractVar[Kernel]
    mask: eqx.AbstractVar[Mask]

    @classmethod
    @abc.abstractmethod
    def from_plan(cls, kernel: Kernel, mask: Mask, seq_axes: tuple[str, ...], axis_sizes: Mapping[str, int],
                  config) -> Strategy:
        """Build the strategy from a plan's sequence axes, mesh axis sizes and attention config.

        Args:
          kernel: the per-device kernel (from ``plan.attention.kernel``).
          mask: the mask.
          seq_axes: mesh axes the sequence is split over, major to minor (may be empty).
          axis_sizes: size of every mesh axis.
          config: the plan's :class:`~lcx.sharding.AttentionConfig`.

        Raises:
          ValueError: the strategy cannot run on these axes.
        """

    @abc.abstractmethod
    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        """Refuse, before anything compiles, local shapes this strategy cannot serve.

        Args:
          q_shape: per-device query shape ``(B, T, N, H)`` (after the plan's sharding).
          kv_shape: per-device key/value shape ``(B, T, K, H)``.

        Raises:
          ValueError: with the numbers and the fix.
        """

    @abc.abstractmethod
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
        """Attention of this device's query shard against the whole (sharded) sequence.

        Runs inside ``jax.shard_map``; every argument is this device's shard along the sequence
        (and batch/heads where the plan shards them). ``sinks``: float32 ``[N]`` sink logits of
        this device's (pre-all-to-all) query heads, replicated over batch and sequence, or None
        (:mod:`lcx.attention.sinks`). ``return_lse`` (static): also return the logsumexp.
        Negative segment ids are padding (:mod:`lcx.attention.masks`).

        Returns this device's output shard ``[B, T, N, H]`` in ``q.dtype``, or with
        ``return_lse`` ``(out, lse)`` with ``lse`` float32 ``[B, T, N]`` of the same rows and
        heads (sinks included; ``-inf``: no visible key and no sink). Differentiable in ``q``,
        ``k``, ``v`` and ``sinks`` from both outputs (the sinks' cotangent is this device's
        contribution: ``shard_map`` sums it over the devices).
        """
