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
from jaxtyping import Array, Float

from lcx.attention.blocks import Cotangent, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels.base import AbstractKernel, Accumulator, GradAccumulator, Prepared, merge_partials
from lcx.attention.masks import Mask


class AbstractComposedKernel(AbstractKernel):
    """An :class:`AbstractKernel` whose accumulating form is its forward and backward, per block:
    the prepared query side is the caller's :class:`~lcx.attention.blocks.QueryBlock` (and in the
    backward its :class:`~lcx.attention.blocks.Cotangent`), the running result a float32
    ``(out, lse)`` pair or dQ."""

    def forward_start(self, q: QueryBlock, *, kv_heads: int) -> tuple[Prepared, Accumulator]:
        B, T, N, H = q.q.shape
        return q, (jnp.zeros((B, T, N, H), jnp.float32), jnp.full((B, T, N), -jnp.inf, jnp.float32))

    def forward_step(self, prepared: Prepared, acc: Accumulator, kv: KVBlock, *, mask: Mask) -> Accumulator:
        (out, lse), (out_b, lse_b) = acc, self.forward(prepared, kv, mask=mask)
        return merge_partials(out, lse, out_b, lse_b)

    def forward_finish(self, prepared: Prepared, acc: Accumulator) -> OutLse:
        return acc

    def backward_start(self, q: QueryBlock, ct: Cotangent, *, kv_heads: int) -> tuple[Prepared, Accumulator]:
        return (q, ct), jnp.zeros(q.q.shape, jnp.float32)

    def backward_step(self, prepared: Prepared, acc: GradAccumulator, kv: KVBlock, *, mask: Mask) -> GradAccumulator:
        (q, ct), (dq_acc, dk, dv) = prepared, acc
        dq_b, dk_b, dv_b = self.backward(q, kv, ct, mask=mask)
        return dq_acc + dq_b, dk + dk_b, dv + dv_b

    def backward_finish(self, prepared: Prepared, dq_acc: Accumulator) -> Float[Array, "B T N H"]:
        return dq_acc
