"""The per-device attention kernel interface.

A kernel computes attention of a local query block against ONE key/value block, with every mask
defined on global positions and segment ids. Context-parallel strategies call it once per block
they hold (all-gather: once; ring: once per ring step) and merge partial results through the
logsumexp, which is why the kernel returns it and why its backward takes the GLOBAL output and
logsumexp (flash-attention backward, Dao et al. 2022, arXiv:2205.14135, Algorithm 2): with those,
the gradient contributions of disjoint key blocks simply add up.

Einsum letters (Gemma convention): B batch, T query length, S key length, N query heads,
K kv heads, G = N / K query heads per kv head, H head dim.
"""

from __future__ import annotations

import abc

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from lcx.attention.masks import Mask


def output_delta(out: Float[Array, "B T N H"], dout: Float[Array, "B T N H"]) -> Float[Array, "B T N"]:
    """float32 ``delta = sum(dout * out, -1)`` ``[B, T, N]`` of the flash-attention backward
    (Dao et al. 2022, arXiv:2205.14135, Algorithm 2), from the GLOBAL output."""
    return jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)


class Kernel(eqx.Module):
    """Abstract per-device attention kernel (Equinox abstract/final pattern: subclasses are final).

    GQA: query head ``n`` attends with kv head ``n // G``; implementations must never repeat
    K/V. The softmax scale ``1 / sqrt(H)`` is the kernel's business (callers pass unscaled q).
    """

    @abc.abstractmethod
    def forward(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B S"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B S"],
        *,
        mask: Mask,
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
        """Attention of ``q`` against this K/V block.

        Args:
          q: queries ``[B, T, N, H]``, any float dtype, unscaled.
          k, v: keys and values ``[B, S, K, H]``; ``N % K == 0``.
          q_pos, k_pos: int32 global positions ``[B, T]``, ``[B, S]``.
          q_seg, k_seg: int32 segment ids ``[B, T]``, ``[B, S]``.
          mask: which (query, key) pairs are visible.

        Returns:
          ``(out, lse)``: ``out`` float32 ``[B, T, N, H]`` normalised within this block, ``lse``
          float32 ``[B, T, N]`` the logsumexp of the scaled visible logits (natural log). A row
          with no visible key has ``out == 0`` and ``lse == -inf``.
        """

    @abc.abstractmethod
    def backward(
        self,
        q: Float[Array, "B T N H"],
        k: Float[Array, "B S K H"],
        v: Float[Array, "B S K H"],
        q_pos: Int[Array, "B T"],
        k_pos: Int[Array, "B S"],
        q_seg: Int[Array, "B T"],
        k_seg: Int[Array, "B S"],
        out: Float[Array, "B T N H"],
        lse: Float[Array, "B T N"],
        dout: Float[Array, "B T N H"],
        *,
        mask: Mask,
        delta: Float[Array, "B T N"] | None = None,
    ) -> tuple[Float[Array, "B T N H"], Float[Array, "B S K H"], Float[Array, "B S K H"]]:
        """Gradient contributions of this K/V block, given the GLOBAL ``out`` and ``lse``.

        With ``P = exp(s - lse)`` (the global softmax restricted to this block) and
        ``delta = sum(dout * out, -1)``: ``dV = P^T dout``, ``dS = P * (dout V^T - delta)``,
        ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. Contributions of disjoint K/V blocks add.

        Args:
          q, k, v, q_pos, k_pos, q_seg, k_seg, mask: as in :meth:`forward`.
          out: float32 ``[B, T, N, H]`` the final attention output over ALL key blocks.
          lse: float32 ``[B, T, N]`` the final logsumexp over ALL key blocks (``-inf``: no key).
          dout: cotangent of ``out`` ``[B, T, N, H]``.
          delta: optional float32 ``[B, T, N]`` ``sum(dout * out, -1)`` computed once by a caller
            that calls the backward for many K/V blocks (the ring); ``out`` is then not read and
            may be None.

        Returns:
          ``(dq, dk, dv)`` float32 with the shapes of ``q``, ``k``, ``v``; zero (never NaN) for
          rows without a visible key.
        """
