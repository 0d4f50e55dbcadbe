"""The abstract context-parallel attention strategy.

A strategy is what one device does inside ``jax.shard_map`` with its sequence shard of q, k, v,
positions and segment ids: which collectives move what, and how often it calls the per-device
:class:`~lcx.attention.kernels.AbstractKernel`. It is also everything the rest of lcx needs to
know about it, as class-level methods of its final class: the plan rules it adds
(:meth:`AbstractStrategy.check_plan_axes`, :meth:`AbstractStrategy.check_plan_dims`, called by
:meth:`lcx.sharding.Plan.validate`), the meshes the planner tries for it
(:meth:`AbstractStrategy.search_meshes`) and its price for the cost ledger (its kernel call's
shape, its own buffers and residuals, the bytes it moves, its causal imbalance and ring hops;
pure arithmetic on :class:`~lcx.attention.strategies.pricing.AttentionShard`).

Strategies follow Equinox's abstract/final pattern: this class declares the interface (abstract
methods only), each concrete strategy is a final class implementing it once, and
``lcx.attention.strategies.STRATEGIES`` maps the plan's name to the class, so a fifth strategy is
one new file plus one registry line.
"""

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING

import equinox as eqx
from jaxtyping import Array, Float

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.flash import Output
from lcx.attention.kernels import AbstractKernel
from lcx.attention.masks import Mask
from lcx.attention.strategies.pricing import AttentionShard, RingHop, SearchMesh, Traffic
from lcx.sharding.plan import AttentionConfig, Plan

# Equinox's documented spelling (pyright reads an abstract ClassVar as a ClassVar only so). No
# `from __future__ import annotations` in this module: Equinox reads AbstractClassVar from the
# evaluated annotation, and refuses it as a string.
if TYPE_CHECKING:
    from typing import ClassVar as AbstractClassVar
else:
    from equinox import AbstractClassVar

Shape = tuple[int, ...]


class AbstractStrategy(eqx.Module):
    """Abstract context-parallel attention strategy (per-device program inside ``shard_map``).

    Attributes:
      kernel: the per-device attention kernel.
      mask: the visibility predicate on global positions and segment ids.
      output_all_to_all: (class) the output returns to sequence sharding through an
        all-to-all, so with ``remat=none`` in float32 the sequence-layout output ``wo`` reads is
        saved besides the kernel's head-layout one (the ledger counts it).
    """

    kernel: eqx.AbstractVar[AbstractKernel]
    mask: eqx.AbstractVar[Mask]
    output_all_to_all: AbstractClassVar[bool]

    # ---------------------------------------------------------------------------- the program
    @classmethod
    @abc.abstractmethod
    def from_plan(
        cls,
        kernel: AbstractKernel,
        mask: Mask,
        seq_axes: tuple[str, ...],
        axis_sizes: Mapping[str, int],
        config: AttentionConfig,
    ) -> "AbstractStrategy":
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
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        """Attention of this device's query shard against the whole (sharded) sequence.

        Runs inside ``jax.shard_map``, under ``jax.named_scope("lcx.<class name>")``
        (:func:`lcx.attention.attention` names it); ``q`` (``[B, T, N, H]``) and ``kv``
        (``[B, T, K, H]``), with their global positions and segment ids, are this device's shard
        along the sequence (and batch/heads where the plan shards them). ``sinks``: float32 ``[N]``
        sink logits of this device's (pre-all-to-all) query heads, replicated over batch and
        sequence, or None (:mod:`lcx.attention.sinks`). ``return_lse`` (static): also return the
        logsumexp. Negative segment ids are padding
        (:mod:`lcx.attention.masks`).

        Returns this device's output shard ``[B, T, N, H]`` in ``q.dtype``, or with
        ``return_lse`` ``(out, lse)`` with ``lse`` float32 ``[B, T, N]`` of the same rows and
        heads (sinks included; ``-inf``: no visible key and no sink). Differentiable in ``q``,
        ``k``, ``v`` and ``sinks`` from both outputs (the sinks' cotangent is this device's
        contribution: ``shard_map`` sums it over the devices).
        """

    # ---------------------------------------------------------------------------- plan rules
    @classmethod
    @abc.abstractmethod
    def check_plan_axes(cls, plan: Plan) -> None:
        """The strategy's rules on the plan's mesh axes (run when a :class:`Plan` is built).

        Raises:
          PlanError: naming the axes and the fix.
        """

    @classmethod
    @abc.abstractmethod
    def check_plan_dims(
        cls, plan: Plan, mesh_shape: Mapping[str, int], dims: Mapping[str, int], n_devices: int
    ) -> None:
        """The strategy's rules on the model's sizes (run by :meth:`Plan.validate` given ``dims``).

        Args:
          plan: the plan.
          mesh_shape: resolved mesh axis sizes.
          dims: sizes of logical axes (``heads``, ``kv_heads``, ...; ``seq``, ``batch`` if known).
          n_devices: devices of the mesh.

        Raises:
          PlanError: naming the numbers and the fix.
        """

    @classmethod
    @abc.abstractmethod
    def check_layer(cls, mask: Mask, plan: Plan, mesh_shape: Mapping[str, int], seq_len: int) -> None:
        """Refuse, before anything compiles, a layer kind this strategy cannot run.

        Called once per layer kind of the model (``mask.kind``: ``global``, ``sliding`` or
        ``chunked``) with the plan that would run it.

        Args:
          mask: the layer kind's mask (window or chunk in tokens).
          plan: the plan (its ``attention.layout`` and sequence axes).
          mesh_shape: resolved mesh axis sizes.
          seq_len: S, tokens of one sequence (before the context split).

        Raises:
          PlanError: naming the kind, the numbers and the fix.
        """

    @classmethod
    @abc.abstractmethod
    def search_meshes(cls, data: int, context: int) -> tuple[SearchMesh, ...]:
        """Meshes the planner tries for this strategy at data degree ``data`` and context degree
        ``context`` (possibly none)."""

    # ---------------------------------------------------------------------------- pricing
    @classmethod
    @abc.abstractmethod
    def all_to_all_degree(cls, config: AttentionConfig, mesh_shape: Mapping[str, int]) -> int:
        """The all-to-all degree U priced in :class:`AttentionShard` (1: none, or the whole
        context degree for a strategy whose all-to-all spans it)."""

    @classmethod
    @abc.abstractmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        """``(query tokens, key tokens, q heads, kv heads)`` of one kernel call on one device."""

    @classmethod
    @abc.abstractmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        """Bytes of the strategy's own buffers in one attention layer's forward (or backward),
        besides the kernel's."""

    @classmethod
    @abc.abstractmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        """Bytes the kernel's saved residuals exceed the local q, k, v (what the kernel's custom
        VJP saves is the K/V it was called with)."""

    @classmethod
    @abc.abstractmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        """Bytes one device sends in one training step over ``layers`` layers (``replay``: 1 when
        the remat policy replays attention's forward in the backward)."""

    @classmethod
    @abc.abstractmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        """Devices over which the sequence layout's causal imbalance applies (1: balanced)."""

    @classmethod
    @abc.abstractmethod
    def ring_hop(
        cls, seq_len: int, context_degree: int, ulysses_degree: int, n_heads: int, n_kv_heads: int
    ) -> RingHop | None:
        """The ring hop whose overlap with compute the ledger checks (None: no ring)."""


class AbstractContextStrategy(AbstractStrategy):
    """A strategy over whatever mesh axes split the sequence, with no all-to-all axis of its own
    (allgather, ring, a2a): no rule on the plan's axes, every layer kind, one ``(data, context)``
    search mesh, and all-to-all degree 1 (a2a's all-to-all spans the whole context degree, which its pricing
    reads). These four methods are final here; the subclasses implement the rest.

    Attributes:
      name: (class) the strategy's name in ``plan.attention.strategy``, which names its mesh.
    """

    name: AbstractClassVar[str]

    @classmethod
    def check_plan_axes(cls, plan: Plan) -> None:
        return None  # whatever axes split the sequence

    @classmethod
    def check_layer(cls, mask: Mask, plan: Plan, mesh_shape: Mapping[str, int], seq_len: int) -> None:
        return None  # every mask: the kernel applies it on global positions

    @classmethod
    def search_meshes(cls, data: int, context: int) -> tuple[SearchMesh, ...]:
        return (SearchMesh((("data", data), ("context", context)), "context", name=cls.name),)

    @classmethod
    def all_to_all_degree(cls, config: AttentionConfig, mesh_shape: Mapping[str, int]) -> int:
        return 1


Strategy = AbstractStrategy
"""Alias of :class:`AbstractStrategy` (the name users' scripts import)."""
