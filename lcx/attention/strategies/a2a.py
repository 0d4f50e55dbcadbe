"""All-to-all (DeepSpeed-Ulysses) context parallelism.

Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509. Activations arrive sharded over the
sequence; an all-to-all turns that into sharding over heads (each of the U devices holds all S
tokens of N/U query heads), every device runs ordinary local attention on its heads, and a second
all-to-all returns to sequence sharding. Communication per device ``(2 N + 2 K) * H * S / U``
elements over ``(U-1)/U`` of the links, independent of U for a fixed per-device length; memory is
O(S * N / U) per device.

GQA: query head ``n`` uses kv head ``n // G`` (``G = N / K``). After the all-to-all device ``u``
holds query heads ``[u N/U, (u+1) N/U)``:

- ``K % U == 0``: device ``u`` gets kv heads ``[u K/U, (u+1) K/U)``, exactly the ones its
  query heads use.
- ``U % K == 0`` (fewer kv heads than the degree, MQA included): each kv head is replicated
  ``r = U / K`` times before the all-to-all (and only that many: K*r = U heads travel), so device
  ``u`` gets kv head ``u // r``. Its query heads ``n = u N/U + j`` (``j < G/r``) use kv head
  ``floor(u/r + j/G) = u // r`` since ``(u mod r)/r + j/G <= 1 - 1/G < 1``: the grouping holds.
- otherwise the heads cannot be split and the strategy refuses with a ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.flash import Output, flash_blocks
from lcx.attention.kernels import AbstractKernel
from lcx.attention.masks import Mask
from lcx.attention.sinks import local_head_sinks
from lcx.attention.strategies.base import AbstractContextStrategy, Shape
from lcx.attention.strategies.pricing import AttentionShard, RingHop, Traffic
from lcx.sharding import axes as ax
from lcx.sharding.plan import PlanError


def kv_replication(n_heads: int, n_kv_heads: int, degree: int, allow: bool, *, who: str, axes) -> int:
    """How many times each kv head must be replicated for an all-to-all of ``degree`` devices.

    Args:
      n_heads: query heads per device before the all-to-all.
      n_kv_heads: kv heads per device before the all-to-all.
      degree: Ulysses degree U (devices in the all-to-all).
      allow: ``plan.attention.allow_kv_replication``.
      who, axes: strategy name and mesh axes, for the error message.

    Returns:
      ``r >= 1``: 1 when ``K % U == 0``, else ``U / K``.

    Raises:
      ValueError: ``N % U != 0``; ``K`` neither divisible by U nor dividing it; replication
        needed but not allowed.
    """
    if n_heads % degree:
        raise ValueError(
            f"{who}: the Ulysses degree {degree} (mesh axes {axes}) must divide the {n_heads} query heads "
            f"per device; use a Ulysses degree that divides {n_heads}, or strategy='ring'/'allgather' "
            "(or 'usp' with a smaller ulysses axis)"
        )
    if n_kv_heads % degree == 0:
        return 1
    if degree % n_kv_heads:
        raise ValueError(
            f"{who}: {n_kv_heads} kv heads per device cannot be split over the Ulysses degree {degree} "
            f"(mesh axes {axes}): {degree} is neither a divisor nor a multiple of {n_kv_heads}; use a Ulysses "
            f"degree that divides or is a multiple of {n_kv_heads}, or strategy='ring'/'allgather'"
        )
    if not allow:
        raise ValueError(
            f"{who}: {n_kv_heads} kv heads per device are fewer than the Ulysses degree {degree} (mesh axes "
            f"{axes}) and plan.attention.allow_kv_replication is false; set it to true (each kv head is then "
            f"replicated {degree // n_kv_heads} times), or use a Ulysses degree dividing {n_kv_heads}"
        )
    return degree // n_kv_heads


def check_ulysses_plan(
    plan, who: str, u_axes: tuple[str, ...], mesh_shape: Mapping[str, int], dims: Mapping[str, int], n_devices: int
) -> None:
    """The plan-level form of :func:`kv_replication` (A2A and USP), on the model's head counts.

    Args:
      plan: the plan.
      who: strategy name, for the message.
      u_axes: mesh axes of the all-to-all.
      mesh_shape: resolved mesh axis sizes.
      dims: logical axis sizes (``heads``, ``kv_heads``; either may be missing).
      n_devices: devices of the mesh (for the degrees the message suggests).

    Raises:
      PlanError: the Ulysses degree does not divide the query heads per device, or neither
        divides nor is a multiple (with ``allow_kv_replication``) of the kv heads per device.
    """
    a = plan.attention
    U = math.prod(mesh_shape[m] for m in u_axes)
    tp = math.prod(mesh_shape[m] for m in plan.activation_rules.get(ax.HEADS, ()))
    tkv = math.prod(mesh_shape[m] for m in plan.activation_rules.get(ax.KV_HEADS, ()))
    heads = dims.get(ax.HEADS)
    kv = dims.get(ax.KV_HEADS)
    if heads is not None:
        local = heads // tp
        if local % U:
            raise PlanError(
                f"{who}: the Ulysses degree {U} (mesh axes {u_axes}) must divide the "
                f"{local} query heads per device ({heads} heads / {tp} tensor); use a Ulysses degree "
                f"that divides {local}, or strategy=ring/allgather"
            )
    if kv is not None:
        local_kv = kv // tkv
        if local_kv % U and not (U % local_kv == 0 and a.allow_kv_replication):
            near = sorted(
                {d for d in range(1, n_devices + 1) if n_devices % d == 0 and (local_kv % d == 0 or d % local_kv == 0)}
            )
            raise PlanError(
                f"{who}: the Ulysses degree {U} (mesh axes {u_axes}) must divide the "
                f"{local_kv} KV heads per device or be a multiple of it with "
                f"plan.attention.allow_kv_replication=true (currently {a.allow_kv_replication}); "
                f"use a Ulysses degree in {near}, "
                "or strategy=ring/usp to put the rest of the context degree on a ring"
            )


def ulysses_buffer_bytes(b: int, length: int, q_heads: int, kv_heads: int, head_dim: int, act_bytes: int) -> int:
    """Bytes of the head-layout q/k/v after the all-to-all (``length`` tokens of ``q_heads`` and
    ``kv_heads`` heads) and the four gathered int32 position / segment-id rows."""
    return b * length * head_dim * (q_heads + 2 * kv_heads) * act_bytes + 4 * b * length * 4


def ulysses_residual_bytes(s: AttentionShard, U: int) -> int:
    """Bytes the kernel's saved k/v after an all-to-all of degree ``U`` exceed the local ones: k/v
    of ``Kr / U`` kv heads over ``L = U T`` tokens instead of ``K`` over T (``Kr = max(K, U)``,
    replicated kv heads), and the four gathered position / segment arrays ``4 b L`` int32."""
    if U == 1:
        return 0
    b, T, K = s.local_batch, s.local_len, s.kv_heads
    kh, L = max(K, U) // U, T * U
    return max(0, 2 * b * (L * kh - T * K) * s.head_dim * s.act_bytes) + 4 * b * L * 4


def ulysses_all_to_all(s: AttentionShard, U: int, *, layers: int, replay: int) -> float:
    """Bytes of the all-to-alls of degree ``U``: q, k, v in and the output back,
    ``b T (2N + 2Kr) H a (U-1)/U`` per pass; the backward moves the same again, a replay adds a
    forward."""
    if U <= 1:
        return 0.0
    b, T, N, H, a = s.local_batch, s.local_len, s.heads, s.head_dim, s.act_bytes
    Kr = max(s.kv_heads, U)
    return b * T * (2 * N + 2 * Kr) * H * a * (U - 1) / U * layers * (2 + replay)


def seq_to_heads(x: Float[Array, "B T M H"], axes: tuple[str, ...]) -> Float[Array, "B TU Mu H"]:
    """All-to-all: sequence-sharded ``[B, T, M, H]`` -> head-sharded ``[B, T*U, M/U, H]``.

    The gathered sequence is ordered by the devices' linear index over ``axes`` (the order in
    which the plan splits the sequence), the same order as :func:`gather_seq`.
    """
    return lax.all_to_all(x, axes, split_axis=2, concat_axis=1, tiled=True)


def heads_to_seq(x: Float[Array, "B TU Mu *H"], axes: tuple[str, ...]) -> Float[Array, "B T M *H"]:
    """Inverse of :func:`seq_to_heads` (also for a logsumexp ``[B, T*U, M/U]``)."""
    return lax.all_to_all(x, axes, split_axis=1, concat_axis=2, tiled=True)


def gather_seq(x: Int[Array, "B T"], axes: tuple[str, ...]) -> Int[Array, "B TU"]:
    """All-gather positions / segment ids along the sequence, in :func:`seq_to_heads` order."""
    return lax.all_gather(x, axes, axis=1, tiled=True)


def ulysses_in(q: QueryBlock, kv: KVBlock, axes: tuple[str, ...], replication: int) -> tuple[QueryBlock, KVBlock]:
    """Sequence -> head sharding of q/k/v (kv heads replicated ``replication`` times first), with
    the positions and segment ids of the whole Ulysses group gathered alongside."""
    k, v = kv.k, kv.v
    if replication > 1:
        # only as many copies as the all-to-all needs: K * r = U heads travel, one per device
        k, v = (jnp.repeat(x, replication, axis=2) for x in (k, v))
    q_h, k, v = (seq_to_heads(x, axes) for x in (q.q, k, v))
    q_pos, k_pos, q_seg, k_seg = (gather_seq(x, axes) for x in (q.pos, kv.pos, q.seg, kv.seg))
    return QueryBlock(q_h, q_pos, q_seg), KVBlock(k, v, k_pos, k_seg)


def ulysses_out(
    res: Float[Array, "B TU Nu H"] | tuple[Float[Array, "B TU Nu H"], Float[Array, "B TU Nu"]], axes: tuple[str, ...]
) -> Output:
    """Head -> sequence sharding of the output (and of the logsumexp ``[B, T U, N/U]`` with it)."""
    if isinstance(res, tuple):
        out, lse = res
        return heads_to_seq(out, axes), heads_to_seq(lse, axes)
    return heads_to_seq(res, axes)


class Ulysses(AbstractContextStrategy):
    """DeepSpeed-Ulysses: all-to-all from sequence to head sharding, local attention, and back.

    Attributes:
      kernel: per-device kernel.
      mask: mask predicate.
      axes: mesh axes of the all-to-all (= the sequence axes), major to minor.
      degree: Ulysses degree U, the product of their sizes.
      allow_kv_replication: replicate kv heads when ``K < U`` and ``U % K == 0``.
    """

    kernel: AbstractKernel
    mask: Mask = eqx.field(static=True)
    axes: tuple[str, ...] = eqx.field(static=True)
    degree: int = eqx.field(static=True)
    allow_kv_replication: bool = eqx.field(static=True, default=True)
    name: ClassVar[str] = "a2a"
    output_all_to_all: ClassVar[bool] = True

    @classmethod
    def from_plan(cls, kernel, mask, seq_axes, axis_sizes: Mapping[str, int], config) -> Ulysses:
        return cls(
            kernel=kernel,
            mask=mask,
            axes=tuple(seq_axes),
            degree=math.prod(axis_sizes[a] for a in seq_axes),
            allow_kv_replication=config.allow_kv_replication,
        )

    def check(self, q_shape: Shape, kv_shape: Shape) -> None:
        kv_replication(q_shape[2], kv_shape[2], self.degree, self.allow_kv_replication, who="a2a", axes=self.axes)

    def __call__(
        self, q: QueryBlock, kv: KVBlock, sinks: Float[Array, " N"] | None = None, return_lse: bool = False
    ) -> Output:
        if self.degree == 1:
            return flash_blocks(q, kv, mask=self.mask, kernel=self.kernel, sinks=sinks, return_lse=return_lse)
        r = kv_replication(
            q.q.shape[2], kv.k.shape[2], self.degree, self.allow_kv_replication, who="a2a", axes=self.axes
        )
        q, kv = ulysses_in(q, kv, self.axes, r)
        # after the all-to-all this device holds N/U of the query heads: only their sinks
        sinks = None if sinks is None else local_head_sinks(sinks, self.axes, self.degree)
        res = flash_blocks(q, kv, mask=self.mask, kernel=self.kernel, sinks=sinks, return_lse=return_lse)
        return ulysses_out(res, self.axes)

    # -- plan rules and price (module docstring); the all-to-all spans the context degree P ------
    @classmethod
    def check_plan_dims(cls, plan, mesh_shape, dims, n_devices) -> None:
        check_ulysses_plan(plan, "a2a", plan.seq_axes, mesh_shape, dims, n_devices)

    @classmethod
    def kernel_call(cls, s: AttentionShard) -> tuple[int, int, int, int]:
        P = s.context_degree  # all S tokens of N/P heads (kv heads replicated up to P)
        return s.seq_len, s.seq_len, s.heads // P, max(s.kv_heads, P) // P

    @classmethod
    def buffer_bytes(cls, s: AttentionShard, *, backward: bool) -> int:
        _, _, nq, nk = cls.kernel_call(s)
        return ulysses_buffer_bytes(s.local_batch, s.seq_len, nq, nk, s.head_dim, s.act_bytes)

    @classmethod
    def residual_bytes(cls, s: AttentionShard) -> int:
        return ulysses_residual_bytes(s, s.context_degree)

    @classmethod
    def traffic(cls, s: AttentionShard, *, layers: int, replay: int) -> Traffic:
        if s.context_degree <= 1:
            return Traffic()
        return Traffic(all_to_all=ulysses_all_to_all(s, s.context_degree, layers=layers, replay=replay))

    @classmethod
    def imbalance_degree(cls, context_degree: int, ulysses_degree: int) -> int:
        return 1  # every device computes all S tokens of its heads: balanced

    @classmethod
    def ring_hop(cls, seq_len, context_degree, ulysses_degree, n_heads, n_kv_heads) -> RingHop | None:
        return None
