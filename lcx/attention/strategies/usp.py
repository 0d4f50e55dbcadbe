"""Unified sequence parallelism (USP): Ulysses over one mesh axis, ring over another.

Fang & Zhao 2024, "USP: A Unified Sequence Parallelism Approach for Long Context Generative AI",
arXiv:2405.07719. The sequence is split over two mesh axes (``plan.attention.ulysses_axis`` of
size U and ``plan.attention.ring_axis`` of size R, in either order in ``plan.activations.seq``).
An all-to-all over the Ulysses axis turns sequence sharding into head sharding within each
Ulysses group (each device then holds ``S / R`` tokens of ``N / U`` heads, positions and segment
ids gathered alongside), ring attention over the ring axis covers the rest of the sequence, and a
second all-to-all returns to sequence sharding. Heads need only be divisible by U, not by the
whole degree U*R, and the ring carries 1/U of the K/V bytes per hop. Any further mesh axes (data,
tensor) are untouched, so USP composes with data parallelism.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
from jaxtyping import Array, Float

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.flash import Output
from lcx.attention.kernels import AbstractKernel
from lcx.attention.masks import Mask
from lcx.attention.sinks import local_head_sinks
from lcx.attention.strategies.a2a import (
    check_ulysses_plan,
    kv_replication,
    ulysses_all_to_all,
    ulysses_buffer_bytes,
    ulysses_in,
    ulysses_out,
    ulysses_residual_bytes,
)
from lcx.attention.strategies.base import AbstractStrategy, Shape
from lcx.attention.strategies.pricing import AttentionShard, RingHop, SearchMesh, Traffic
from lcx.attention.strategies.ring import Ring, ring_buffer_bytes, ring_traffic
from lcx.sharding.plan import PlanError


class USP(AbstractStrategy):
    """Ulysses all-to-all over ``ulysses_axis`` composed with a ring over ``ring_axis``.

    Attributes:
      kernel: per-device kernel.
      mask: mask predicate.
      ulysses_axis, ulysses_degree: mesh axis of the all-to-all and its size U.
      ring_axis, ring_degree: mesh axis of the ring and its size R.
      allow_kv_replication: replicate kv heads when ``K < U`` and ``U % K == 0``.
    """

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    ulysses_axis: str = eqx.field(static=True)
    ulysses_degree: int = eqx.field(static=True)
    ring_axis: str = eqx.field(static=True)
    ring_degree: int = eqx.field(static=True)
    allow_kv_replication: bool = eqx.field(static=True, default=True)
    output_all_to_all: ClassVar[bool] = True

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config) -> USP:
        u, r = config.ulysses_axis, config.ring_axis
        if sorted(seq_axes) != sorted((u, r)) or u == r:
            raise ValueError(
                f"usp: the sequence must be split over exactly the two mesh axes ulysses_axis={u!r} and "
                f"ring_axis={r!r} (either order); plan.activations.seq is {tuple(seq_axes)}"
            )
        return cls(
            kernel=kernel,
            mask=mask,
            ulysses_axis=u,
            ulysses_degree=axis_sizes[u],
            ring_axis=r,
            ring_degree=axis_sizes[r],
            allow_kv_replication=config.allow_kv_replication,
        )

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        kv_replication(
            q_shape[2],
            kv_shape[2],
            self.ulysses_degree,
            self.allow_kv_replication,
            who="usp",
            axes=(self.ulysses_axis,),
        )

    def __call__(
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        ua = (self.ulysses_axis,)
        U = self.ulysses_degree
        r = kv_replication(q.q.shape[2], kv.k.shape[2], U, self.allow_kv_replication, who="usp", axes=ua)
        if U > 1:
            q, kv = ulysses_in(q, kv, ua, r)
            # this device now holds N/U of the query heads: only their sinks
            sinks = None if sinks is None else local_head_sinks(sinks, ua, U)
        ring = Ring(kernel=self.kernel, mask=self.mask, axes=(self.ring_axis,), degree=self.ring_degree)
        res = ring(q, kv, sinks, return_lse)
        return res if U == 1 else ulysses_out(res, ua)

    # -- plan rules and price (module docstring): an all-to-all over U, a ring of R = P / U ------
    @classmethod
    def check_layer(cls, mask, plan, mesh_shape, seq_len) -> None:
        return None  # every mask: the kernel applies it on global positions

    @classmethod
    def check_plan_axes(cls, plan) -> None:
        seq, a = plan.seq_axes, plan.attention
        missing = [x for x in (a.ulysses_axis, a.ring_axis) if x not in seq]
        if missing or a.ulysses_axis == a.ring_axis or len(seq) != 2:
            raise PlanError(
                f"strategy 'usp' needs the sequence split over exactly two mesh axes, "
                f"plan.attention.ulysses_axis={a.ulysses_axis!r} and plan.attention.ring_axis={a.ring_axis!r}; "
                f"plan.activations.seq is {seq or None}"
                + (f" (missing {missing})" if missing else "")
                + f"; set activations.seq to [{a.ulysses_axis}, {a.ring_axis}] (either order) "
                "and declare both in plan.mesh"
            )

    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices) -> None:
        check_ulysses_plan(plan, "usp", (plan.attention.ulysses_axis,), mesh_shape, dims, n_devices)

    @classmethod
    def search_meshes(cls, data: int, context: int) -> tuple[SearchMesh, ...]:
        axes = (("ulysses_axis", "ulysses"), ("ring_axis", "ring"))
        return tuple(
            SearchMesh(
                (("data", data), ("ulysses", U), ("ring", context // U)),
                ("ulysses", "ring"),
                axes,
                name=f"usp{U}x{context // U}",
            )
            for U in range(2, context)
            if context % U == 0  # 1 < U < P: both parts real
        )

    @classmethod
    def all_to_all_degree(cls, config, mesh_shape) -> int:
        return mesh_shape.get(config.ulysses_axis, 1)

    @classmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        U = s.ulysses_degree  # L = U T tokens of N/U heads (kv heads replicated up to U)
        return s.local_len * U, s.local_len * U, s.heads // U, max(s.kv_heads, U) // U

    @classmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        L, _, nq, nk = cls.kernel_call(s)
        b, H, a = s.local_batch, s.head_dim, s.act_bytes
        return ulysses_buffer_bytes(b, L, nq, nk, H, a) + ring_buffer_bytes(b, L, nk, H, a, backward=backward)

    @classmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        return ulysses_residual_bytes(s, s.ulysses_degree)

    @classmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        P, U = s.context_degree, s.ulysses_degree
        if P <= 1:
            return Traffic()
        ring = ring_traffic(
            s.local_batch,
            U * s.local_len,
            max(s.kv_heads, U) // U,
            s.head_dim,
            s.act_bytes,
            P // U,
            layers=layers,
            replay=replay,
        )
        return Traffic(
            all_to_all=ulysses_all_to_all(s, U, layers=layers, replay=replay),
            ring=ring.ring,
            ring_hops=ring.ring_hops,
            ring_hop_bytes=ring.ring_hop_bytes,
        )

    @classmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        # a ring of P/U ranks, each holding U consecutive chunks after the all-to-all
        return context_degree // ulysses_degree

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        P, U = context_degree, ulysses_degree
        block = (seq_len // P) * U
        if not (block and P > 1 and P // U > 1):
            return None
        return RingHop(block, n_heads // U, max(n_kv_heads, U) // U)
