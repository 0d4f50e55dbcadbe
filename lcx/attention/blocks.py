"""The values attention passes around: a query block, a key/value block, an output's cotangent.

Kernels (:mod:`lcx.attention.kernels`), the local flash attention (:mod:`lcx.attention.flash`)
and the context-parallel strategies (:mod:`lcx.attention.strategies`) all move the same groups
of arrays together: queries with their global positions and segment ids, keys and values with
theirs, and in the backward the logsumexp, the output's cotangent and ``delta``. Each group is
one frozen pytree (a ``NamedTuple``), so a signature names one block instead of seven arrays,
``jax.tree.map`` moves a K/V block with its positions (the ring's hop) and ``lax.scan`` /
``lax.cond`` carry it as it is.

Einsum letters (Gemma convention): B batch, T query length, S key length, N query heads,
K kv heads, H head dim.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

# jax.custom_vjp's backward returns None for an input with no cotangent (the integer positions and
# segment ids); the fields' array types cannot say so, hence the cast at this library boundary
_NO_COTANGENT = cast(Array, None)


class QueryBlock(NamedTuple):
    """Queries with their global positions and segment ids.

    Attributes:
      q: queries ``[B, T, N, H]``, any float dtype, unscaled (the kernel applies ``1/sqrt(H)``).
      pos: int32 ``[B, T]`` global positions.
      seg: int32 ``[B, T]`` segment ids; negative: padding (:mod:`lcx.attention.masks`).
    """

    q: Float[Array, "B T N H"]
    pos: Int[Array, "B T"]
    seg: Int[Array, "B T"]

    def cotangent(self, dq: Float[Array, "B T N H"]) -> QueryBlock:
        """This block's cotangent for a ``jax.custom_vjp`` backward: ``dq`` in ``q``'s dtype, none
        for the positions and segment ids."""
        return QueryBlock(dq.astype(self.q.dtype), _NO_COTANGENT, _NO_COTANGENT)


class KVBlock(NamedTuple):
    """Keys and values with their global positions and segment ids.

    Attributes:
      k, v: keys and values ``[B, S, K, H]`` (K kv heads; the query heads ``N % K == 0``).
      pos: int32 ``[B, S]`` global positions.
      seg: int32 ``[B, S]`` segment ids; negative: padding.
    """

    k: Float[Array, "B S K H"]
    v: Float[Array, "B S K H"]
    pos: Int[Array, "B S"]
    seg: Int[Array, "B S"]

    def cotangent(self, dk: Float[Array, "B S K H"], dv: Float[Array, "B S K H"]) -> KVBlock:
        """This block's cotangent for a ``jax.custom_vjp`` backward: ``dk``, ``dv`` in the dtypes
        of ``k``, ``v``, none for the positions and segment ids."""
        return KVBlock(dk.astype(self.k.dtype), dv.astype(self.v.dtype), _NO_COTANGENT, _NO_COTANGENT)


class Cotangent(NamedTuple):
    """What a flash-attention backward reads of the FINAL output (over all key blocks).

    Attributes:
      lse: float32 ``[B, T, N]`` the final logsumexp (natural log; ``-inf``: no visible key).
      dout: cotangent of the output ``[B, T, N, H]``.
      delta: float32 ``[B, T, N]`` ``sum(dout * out, -1)`` (:func:`output_delta`), less the
        logsumexp's own cotangent when it is an output too (:func:`lse_delta`).
    """

    lse: Float[Array, "B T N"]
    dout: Float[Array, "B T N H"]
    delta: Float[Array, "B T N"]

    @classmethod
    def of(
        cls,
        out: Float[Array, "B T N H"],
        lse: Float[Array, "B T N"],
        dout: Float[Array, "B T N H"],
        dlse: Float[Array, "B T N"] | None = None,
    ) -> Cotangent:
        """The cotangent of a final ``(out, lse)`` (float32 ``out``) given ``dout`` and, when
        the logsumexp is an output too, its cotangent ``dlse`` (None: it is not)."""
        return cls(lse, dout, lse_delta(output_delta(out, dout), dlse))


def output_delta(out: Float[Array, "B T N H"], dout: Float[Array, "B T N H"]) -> Float[Array, "B T N"]:
    """float32 ``delta = sum(dout * out, -1)`` ``[B, T, N]`` of the flash-attention backward
    (Dao et al. 2022, arXiv:2205.14135, Algorithm 2), from the GLOBAL output."""
    return jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)


def lse_delta(delta: Float[Array, "B T N"], dlse: Float[Array, "B T N"] | None) -> Float[Array, "B T N"]:
    """The flash backward's ``delta`` when the logsumexp is an output too: ``delta - dlse``.

    With ``P = exp(s - lse)``: ``d out / d s_j = P_j (v_j - out)`` and ``d lse / d s_j = P_j``, so
    ``dS = P * (dP - delta) + P * dlse = P * (dP - (delta - dlse))``; the same substitution gives
    the sink gradient (:func:`~lcx.attention.sinks.sinks_grad`). ``dlse`` None: ``delta``.
    """
    return delta if dlse is None else delta - dlse.astype(delta.dtype)


OutLse = tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]
"""``(out, lse)``: float32 output ``[B, T, N, H]`` normalised over the keys seen, and float32
``[B, T, N]`` logsumexp of their scaled logits (``out = 0``, ``lse = -inf``: no key seen)."""

Grads = tuple[Float[Array, "B T N H"], Float[Array, "B S K H"], Float[Array, "B S K H"]]
"""``(dq, dk, dv)`` with the shapes of a :class:`QueryBlock`'s ``q`` and a :class:`KVBlock`'s
``k`` and ``v``."""
