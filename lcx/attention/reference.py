"""Plain single-device dense attention: the float32 reference every strategy is tested against."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Int

from lcx.attention.masks import Mask


def reference_attention(
    q: Float[ArrayLike, "B T N H"],
    k: Float[ArrayLike, "B S K H"],
    v: Float[ArrayLike, "B S K H"],
    *,
    mask: Mask,
    positions: Int[ArrayLike, "B T"] | None = None,
    segment_ids: Int[ArrayLike, "B T"] | None = None,
    kv_positions: Int[ArrayLike, "B S"] | None = None,
    kv_segment_ids: Int[ArrayLike, "B S"] | None = None,
    sinks: Float[ArrayLike, " N"] | None = None,
    return_lse: bool = False,
) -> Float[Array, "B T N H"] | tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
    """Dense softmax attention ``softmax(q k^T / sqrt(H) + mask) v`` (Vaswani et al. 2017).

    GQA: the N query heads form K groups of G = N / K (head n uses kv head n // G); K/V are
    never repeated. A query with no visible key returns 0 (not NaN). Negative segment ids are
    padding (see :mod:`lcx.attention.masks`): such a query sees no key and no sink, such a key is
    seen by no query. Computes in the inputs' dtype promoted with float32 for the softmax;
    returns the dtype of ``q``.

    Args:
      q: queries ``[B, T, N, H]``.
      k: keys ``[B, S, K, H]``; N divisible by K.
      v: values, shaped as ``k``.
      mask: the :class:`Mask` predicate.
      positions: int32 ``[B, T]`` query positions; default ``arange(T)``.
      segment_ids: int32 ``[B, T]`` query segment ids; default zeros.
      kv_positions: int32 ``[B, S]`` key positions; default ``positions`` (self-attention,
        T == S).
      kv_segment_ids: int32 ``[B, S]`` key segment ids; default ``segment_ids``.
      sinks: ``[N]`` per-head sink logits, or None: head ``n``'s softmax gets one more logit
        column ``sinks[n]`` whose value vector is 0 (gpt-oss attention sinks; StreamingLLM, Xiao
        et al. 2023, arXiv:2309.17453). Computed in float32.
      return_lse: also return the logsumexp.

    Returns:
      ``out`` ``[B, T, N, H]`` in ``q.dtype``; with ``return_lse``, ``(out, lse)`` with ``lse``
      float32 ``[B, T, N]``: the natural-log logsumexp of the scaled visible logits and the sink
      (when given), ``-inf`` where neither exists. Plain ``jnp`` arithmetic: differentiable by
      JAX's own rules in both outputs.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    B, T, N, H = q.shape
    K = k.shape[2]
    if N % K:
        raise ValueError(f"query heads {N} must be a multiple of kv heads {K} (GQA)")
    G = N // K
    positions = (
        jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)) if positions is None else jnp.asarray(positions)
    )
    segment_ids = jnp.zeros((B, T), jnp.int32) if segment_ids is None else jnp.asarray(segment_ids)
    kv_positions = positions if kv_positions is None else kv_positions
    kv_segment_ids = segment_ids if kv_segment_ids is None else kv_segment_ids
    qg = q.reshape(B, T, K, G, H).astype(jnp.float32) / jnp.sqrt(jnp.float32(H))
    s = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k.astype(jnp.float32))
    vis = mask.visible(positions, kv_positions, segment_ids, kv_segment_ids)[:, None, None]
    s = jnp.where(vis, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    sink = None
    if sinks is not None:
        sink = jnp.asarray(sinks).astype(jnp.float32).reshape(K, G)[None, :, :, None, None]  # head n = k G + g
        # padding queries (negative segment id) get no sink either
        sink = jnp.where((segment_ids < 0)[:, None, None, :, None], -jnp.inf, sink)
        m = jnp.maximum(m, sink)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(vis, jnp.exp(s - m), 0.0)
    l = p.sum(-1, keepdims=True)
    if sink is not None:
        l = l + jnp.exp(sink - m)  # the sink's column: in the denominator, value 0
    p = p / jnp.where(l == 0, 1.0, l)
    o = jnp.einsum("BKGTS,BSKH->BTKGH", p, v.astype(jnp.float32))
    out = o.reshape(B, T, N, H).astype(q.dtype)
    if not return_lse:
        return out
    lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)[..., 0]  # [B, K, G, T]
    return out, jnp.moveaxis(lse, 3, 1).reshape(B, T, N)
