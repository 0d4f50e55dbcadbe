"""Attention sinks: a learnable per-head logit in the softmax denominator.

Each query head ``n`` has a scalar logit ``s_n`` that joins the softmax as one extra key whose
value is 0 (the "sink" of StreamingLLM, Xiao et al. 2023, arXiv:2309.17453, learnable per head
as in OpenAI's gpt-oss, 2025 model card):

    out_t = sum_j exp(l_tj - lse'_t) v_j,    lse'_t = logaddexp(lse_t, s_n),

where ``lse_t`` is the logsumexp of the scaled visible logits ``l_tj``. A query can thus put
attention mass "nowhere"; a query with no visible key gets ``out = 0``.

Every kernel and strategy supports sinks without any change to the kernels, because the sink
only rescales the finished result:

- forward: merge the sink into the GLOBAL ``(out, lse)`` once, at the end
  (:func:`merge_sinks`): ``lse' = logaddexp(lse, s)``, ``out' = out * exp(lse - lse')``;
- backward: the flash-attention backward of every kernel (``P = exp(l - lse)``,
  ``delta = sum(dout * out)``) called with ``out'`` and ``lse'`` gives exactly the dq, dk, dv of
  the attention with sinks (its probabilities ARE ``exp(l - lse')`` and ``delta'`` is the
  derivative of the sink-normalised output), and the sink's own gradient is
  (:func:`sinks_grad`)

      d s_n = -sum_{b, t} exp(s_n - lse'_{b,t,n}) * delta'_{b,t,n},

  since ``d out_t / d s_n = -exp(s_n - lse'_t) out_t``. Inside ``shard_map`` each device returns
  its own (b, t) sum; ``shard_map``'s transpose adds those over the mesh axes the sinks are not
  sharded on (batch, sequence).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

_F32 = jnp.float32


def merge_sinks(
    out: Float[Array, "B T N H"], lse: Float[Array, "B T N"], sinks: Float[Array, " N"] | Float[Array, "B T N"]
) -> tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
    """The final attention result with the per-head sink logit merged in (float32).

    Args:
      out: float32 ``[B, T, N, H]``, attention normalised over the visible keys.
      lse: float32 ``[B, T, N]``, their logsumexp (natural log; ``-inf``: no visible key).
      sinks: ``[N]`` sink logits of the query heads (float32; ``-inf`` disables a head's sink),
        or per row ``[B, T, N]`` (:func:`row_sinks`: ``-inf`` on padding rows).

    Returns:
      ``(out', lse')`` float32: ``lse' = logaddexp(lse, s)``, ``out' = out * exp(lse - lse')``.
      Rows without a visible key keep ``out' = 0``; never NaN (``lse' = -inf`` only where
      ``lse`` and ``s`` are both ``-inf``). With ``sinks = -inf`` the result is bitwise
      ``(out, lse)``.
    """
    new = jnp.logaddexp(lse, sinks.astype(_F32))
    safe = jnp.where(jnp.isfinite(new), new, 0.0)  # avoid (-inf) - (-inf) = NaN
    return out * jnp.exp(lse - safe)[..., None], new


def row_sinks(sinks: Float[Array, " N"], q_seg: Int[Array, "B T"]) -> Float[Array, "B T N"]:
    """float32 ``[B, T, N]`` per-row sink logits: ``sinks`` on every row, ``-inf`` on padding
    rows (negative segment id, :mod:`lcx.attention.masks`), which see no key and no sink either
    (their ``lse`` stays ``-inf``, their sink gradient 0). For :func:`merge_sinks`."""
    return jnp.where((q_seg < 0)[..., None], -jnp.inf, sinks.astype(_F32)[None, None, :])


def sinks_grad(
    delta: Float[Array, "B T N"], lse: Float[Array, "B T N"], sinks: Float[Array, " N"]
) -> Float[Array, " N"]:
    """Gradient of the sink logits from this device's rows.

    Args:
      delta: float32 ``[B, T, N]`` ``sum(dout * out', -1)`` with the output WITH the sink merged
        (``out'``; :func:`lcx.attention.kernels.output_delta`, the same delta the kernels'
        backward uses).
      lse: float32 ``[B, T, N]`` the logsumexp WITH the sink (``lse'``).
      sinks: ``[N]`` the sink logits.

    Returns:
      float32 ``[N]``: ``-sum_{b,t} exp(s_n - lse'_{b,t,n}) delta_{b,t,n}`` (0 where
      ``lse' = -inf``). Sum it over the devices that hold other rows of the same heads.
    """
    fin = jnp.isfinite(lse)
    p_sink = jnp.where(fin, jnp.exp(sinks.astype(_F32) - jnp.where(fin, lse, 0.0)), 0.0)
    return -jnp.sum(p_sink * delta, axis=(0, 1))


def local_head_sinks(sinks: Float[Array, " N"], axes: tuple[str, ...], degree: int) -> Float[Array, " Nu"]:
    """The sinks of the query heads this device holds after a Ulysses all-to-all over ``axes``.

    :func:`lcx.attention.strategies.a2a.seq_to_heads` hands device ``u`` (its linear index over
    ``axes``, major to minor) the local query heads ``[u N/U, (u+1) N/U)``; kv-head replication
    changes only the kv heads, never this. Call inside ``shard_map``; the transpose of the slice
    returns each device's gradient to its own entries.
    """
    n = sinks.shape[0] // degree
    return lax.dynamic_slice_in_dim(sinks, lax.axis_index(axes) * n, n)
