"""A kernel that implements only ``forward`` and ``backward`` still serves every strategy.

:class:`AbstractComposedKernel` implements the accumulating form of
:class:`~lcx.attention.kernels.base.AbstractKernel` (``forward_start`` / ``forward_step`` /
``forward_finish`` and the ``backward_`` three) by calling the kernel's one-block forward once
per K/V block and merging the partial results through the logsumexp
(:func:`~lcx.attention.kernels.base.merge_partials`), and by summing the backward's gradient
contributions. Its subclasses (the splash kernel) are final and override none of these.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from lcx.attention.kernels.base import AbstractKernel, Accumulator, Prepared, merge_partials
from lcx.attention.masks import Mask


class AbstractComposedKernel(AbstractKernel):
    """An :class:`AbstractKernel` whose accumulating form is its forward and backward, per block:
    the prepared query side is the caller's q, positions and segment ids (and in the backward the
    logsumexp, dout and delta), the running result a float32 ``(out, lse)`` pair or dQ."""

    def forward_start(
        self, q: Float[Array, "B T N H"], q_pos: Int[Array, "B T"], q_seg: Int[Array, "B T"], *, kv_heads: int
    ) -> tuple[Prepared, Accumulator]:
        B, T, N, H = q.shape
        return (q, q_pos, q_seg), (jnp.zeros((B, T, N, H), jnp.float32), jnp.full((B, T, N), -jnp.inf, jnp.float32))

    def forward_step(
        self,
        prepared: Prepared,
        acc: Accumulator,
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        k_pos: Int[Array, "B S"],
        k_seg: Int[Array, "B S"],
        *,
        mask: Mask,
    ) -> Accumulator:
        q, q_pos, q_seg = prepared
        out_b, lse_b = self.forward(q, k, v, q_pos, k_pos, q_seg, k_seg, mask=mask)
        return merge_partials(*acc, out_b, lse_b)

    def forward_finish(
        self, prepared: Prepared, acc: Accumulator
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
        return acc

    def backward_start(
        self,
        q: Float[Array, "B T N H"],
        q_pos: Int[Array, "B T"],
        q_seg: Int[Array, "B T"],
        lse: Float[Array, "B T N"],
        dout: Float[Array, "B T N H"],
        delta: Float[Array, "B T N"],
        *,
        kv_heads: int,
    ) -> tuple[Prepared, Accumulator]:
        return (q, q_pos, q_seg, lse, dout, delta), jnp.zeros(q.shape, jnp.float32)

    def backward_step(
        self,
        prepared: Prepared,
        dq_acc: Accumulator,
        dk: Float[Array, "B S K H"],
        dv: Float[Array, "B S K H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        k_pos: Int[Array, "B S"],
        k_seg: Int[Array, "B S"],
        *,
        mask: Mask,
    ) -> tuple[Accumulator, Float[Array, "B S K H"], Float[Array, "B S K H"]]:
        q, q_pos, q_seg, lse, dout, delta = prepared
        dq_b, dk_b, dv_b = self.backward(q, k, v, q_pos, k_pos, q_seg, k_seg, None, lse, dout, mask=mask, delta=delta)
        return dq_acc + dq_b, dk + dk_b, dv + dv_b

    def backward_finish(self, prepared: Prepared, dq_acc: Accumulator) -> Float[Array, "B T N H"]:
        return dq_acc
