"""The per-row, per-kv-chunk driver the two Pallas kernels share (``splash``, ``tokamax``).

Both kernels run the same algorithm (:mod:`lcx.attention.kernels.splash`, module docstring):
per batch row, cut the K/V block into kv chunks of at most
:data:`~lcx.attention.kernels.splash_intervals.MAX_KV_CHUNK` keys, sort every chunk by the
mask's key (:func:`sorted_intervals`), call the Pallas kernel once per chunk with each query's
visible interval, and merge the chunks' partial results through the logsumexp (forward) or add
and un-sort them (backward). Only the call on one chunk differs between them; it is the
``chunk`` argument of :func:`chunked_forward` and :func:`chunked_backward`. Heads-first layout
``[heads, tokens, H]`` inside, the interface's ``[B, tokens, heads, H]`` outside.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from lcx.attention.blocks import Cotangent, Grads, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels.base import merge_partials
from lcx.attention.kernels.splash_intervals import _intervals, _Plan
from lcx.attention.masks import Mask

_F32 = jnp.float32

ChunkOutLse = tuple[Float[Array, "N Tp H"], Float[Array, "N Tp"]]
"""``(out, lse)`` of one batch row in the heads-first layout: float32 ``[N, Tp, H]``, ``[N, Tp]``."""

ForwardChunk = Callable[..., ChunkOutLse]
"""``(qh, kc, vc, lo, hi, empty) -> (out, lse)`` on one sorted kv chunk: scaled queries
``[N, Tp, H]``, keys and values ``[K, C, H]`` in sorted order, int32 ``[Tp]`` intervals and the
bool ``[Tp]`` rows that see no key of the chunk; float32 ``out`` ``[N, Tp, H]`` and natural-log
``lse`` ``[N, Tp]``, empty rows ``0`` / ``-inf``."""

BackwardChunk = Callable[..., tuple[Float[Array, "N Tp H"], Float[Array, "K C H"], Float[Array, "K C H"]]]
"""``(qh, kc, vc, lse, dout, delta, lo, hi, empty) -> (dq, dk, dv)`` on one sorted kv chunk,
with the GLOBAL (finite) ``lse`` and ``delta`` ``[N, Tp]`` and ``dout`` ``[N, Tp, H]``; float32,
``dq`` w.r.t. the scaled queries, ``dk, dv`` in the chunk's sorted order."""


def prescale(x: Array) -> Array:
    """``x / sqrt(H)`` in ``x``'s dtype. The ONE place the softmax scale lives (the Pallas
    kernels never scale): the forward multiplies q by it, the backward reuses it for the chain
    rule of that same linear map."""
    return x * jnp.asarray(1.0 / (x.shape[-1] ** 0.5), x.dtype)


def groups(n_heads: int, n_kv_heads: int) -> int:
    """``G = N / K`` query heads per kv head.

    Raises:
      ValueError: ``N`` not a multiple of ``K``.
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"query heads {n_heads} must be a multiple of kv heads {n_kv_heads} (GQA)")
    return n_heads // n_kv_heads


def heads_first(x: Array, length: int | None = None) -> Array:
    """``[L, heads, H]`` -> ``[heads, L', H]`` (the Pallas kernels' layout), zero-padded to
    ``length`` tokens."""
    if length is not None:
        x = jnp.pad(x, ((0, length - x.shape[0]), (0, 0), (0, 0)))
    return x.transpose(1, 0, 2)


def sorted_intervals(
    plan: _Plan,
    mask: Mask,
    q_pos: Int[Array, " T"],
    q_seg: Int[Array, " T"],
    k_pos: Int[Array, " S"],
    k_seg: Int[Array, " S"],
) -> tuple[Int[Array, "n C"], Int[Array, "n Tp"], Int[Array, "n Tp"], Bool[Array, "n Tp"]]:
    """Sort every kv chunk of one batch row by the mask's key, and each query's interval in every
    chunk.

    Returns:
      ``perm`` ``[n, C]`` (sorted index -> padded kv index), ``lo, hi`` ``[n, Tp]`` (query t
      sees the sorted keys ``[lo, hi)`` of a chunk), ``empty`` ``[n, Tp]`` bool (it sees none).
    """
    n, C = plan.n_chunks, plan.chunk
    pad_k = plan.Sp - plan.S
    # keys past S (tiling) and padding keys (negative segment id) sort after the real keys of
    # their chunk, where no query's interval reaches: n_real counts the others
    is_pad = jnp.concatenate([(k_seg < 0).astype(jnp.int32), jnp.ones(pad_k, jnp.int32)])
    kp = jnp.pad(k_pos, (0, pad_k)).reshape(n, C)
    ks = jnp.pad(k_seg, (0, pad_k)).reshape(n, C)
    is_pad = is_pad.reshape(n, C)
    idx = jnp.arange(plan.Sp, dtype=jnp.int32).reshape(n, C)
    n_real = C - is_pad.sum(axis=1, dtype=jnp.int32)
    if mask.document:
        _, ks_s, kp_s, perm = lax.sort((is_pad, ks, kp, idx), dimension=1, num_keys=3)
    else:
        _, kp_s, perm = lax.sort((is_pad, kp, idx), dimension=1, num_keys=2)
        ks_s = jnp.zeros_like(kp_s)
    pad_q = plan.Tp - plan.T
    qp = jnp.pad(q_pos, (0, pad_q))
    qs = jnp.pad(q_seg, (0, pad_q))
    q_real = (jnp.arange(plan.Tp) < plan.T) & (qs >= 0)  # padding queries are empty rows
    lo, hi = jax.vmap(lambda a, b, c: _intervals(mask, qp, qs, a, b, c))(kp_s, ks_s, n_real)
    empty = (lo >= hi) | ~q_real[None, :]
    lo = jnp.where(empty, 0, lo)
    hi = jnp.where(empty, 0, hi)
    return perm, lo, hi, empty


def chunked_forward(plan: _Plan, mask: Mask, q: QueryBlock, kv: KVBlock, chunk: ForwardChunk) -> OutLse:
    """The interface's forward (:meth:`AbstractKernel.forward`) from ``chunk``, the Pallas
    forward on one sorted kv chunk, merged over the chunks of every batch row.

    Raises:
      ValueError: the query heads are not a multiple of the kv heads.
    """
    T, N, H = q.q.shape[1:]
    groups(N, kv.k.shape[2])

    def row(q: QueryBlock, kv: KVBlock):  # one batch row: [T, N, H] and [T, N]
        perm, lo, hi, empty = sorted_intervals(plan, mask, q.pos, q.seg, kv.pos, kv.seg)
        qh = heads_first(prescale(q.q), plan.Tp)  # [N, Tp, H]
        kh, vh = (jnp.pad(x, ((0, plan.Sp - plan.S), (0, 0), (0, 0))) for x in (kv.k, kv.v))

        def step(acc: ChunkOutLse, xs) -> tuple[ChunkOutLse, None]:
            (out, lse), (perm_c, lo_c, hi_c, empty_c) = acc, xs
            out_c, lse_c = chunk(qh, heads_first(kh[perm_c]), heads_first(vh[perm_c]), lo_c, hi_c, empty_c)
            return merge_partials(out, lse, out_c, lse_c), None

        init = (jnp.zeros((N, plan.Tp, H), _F32), jnp.full((N, plan.Tp), -jnp.inf, _F32))
        (out, lse), _ = lax.scan(step, init, (perm, lo, hi, empty))
        return out.transpose(1, 0, 2)[:T], lse.T[:T]

    return jax.vmap(row)(q, kv)


def chunked_backward(
    plan: _Plan, mask: Mask, q: QueryBlock, kv: KVBlock, ct: Cotangent, chunk: BackwardChunk, lse_scale: float | None
) -> Grads:
    """The interface's backward (:meth:`AbstractKernel.backward`) from ``chunk``, the Pallas
    backward on one sorted kv chunk: dQ summed over the chunks, dK/dV un-sorted into the
    caller's kv order. ``lse_scale``: the logsumexp's unit for ``chunk`` (tokamax's base 2:
    ``log2(e)``; None: natural log).

    Raises:
      ValueError: the query heads are not a multiple of the kv heads.
    """
    T, N, H = q.q.shape[1:]
    K = kv.k.shape[2]
    groups(N, K)

    def row(q: QueryBlock, kv: KVBlock, ct: Cotangent):  # one batch row: dq [T, N, H], dk, dv [S, K, H]
        perm, lo, hi, empty = sorted_intervals(plan, mask, q.pos, q.seg, kv.pos, kv.seg)
        qh = heads_first(prescale(q.q), plan.Tp)  # [N, Tp, H]
        doh = heads_first(ct.dout.astype(q.q.dtype), plan.Tp)
        di = jnp.pad(ct.delta.astype(_F32), ((0, plan.Tp - T), (0, 0))).T  # [N, Tp]
        # a row that sees no key anywhere has lse = -inf: any finite value makes its masked
        # probabilities exp(mask_value - lse) = 0 (its dout/delta then contribute nothing)
        lse = jnp.where(jnp.isfinite(ct.lse), ct.lse, 0.0).astype(_F32)
        lse = lse if lse_scale is None else lse * lse_scale
        lse = jnp.pad(lse, ((0, plan.Tp - T), (0, 0))).T
        kh, vh = (jnp.pad(x, ((0, plan.Sp - plan.S), (0, 0), (0, 0))) for x in (kv.k, kv.v))

        def step(dq, xs):
            perm_c, lo_c, hi_c, empty_c = xs
            kc, vc = heads_first(kh[perm_c]), heads_first(vh[perm_c])
            dq_c, dk_c, dv_c = chunk(qh, kc, vc, lse, doh, di, lo_c, hi_c, empty_c)
            inv = jnp.argsort(perm_c)  # sorted chunk order -> the caller's kv order
            return dq + dq_c, (dk_c[:, inv], dv_c[:, inv])

        dq, (dk, dv) = lax.scan(step, jnp.zeros((N, plan.Tp, H), _F32), (perm, lo, hi, empty))
        # dk, dv: [n, K, C, H] -> [Sp, K, H]
        dk, dv = (x.transpose(0, 2, 1, 3).reshape(plan.Sp, K, H)[: plan.S] for x in (dk, dv))
        return prescale(dq.transpose(1, 0, 2)[:T]), dk, dv

    return jax.vmap(row)(q, kv, ct)
