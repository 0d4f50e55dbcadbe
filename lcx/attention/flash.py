"""Local (single-device, non-distributed) flash attention with a custom VJP.

Built on a :class:`~lcx.attention.kernels.AbstractKernel`: the forward saves only ``out`` (float32) and
the logsumexp, and the backward recomputes the probabilities block by block (Dao et al. 2022,
arXiv:2205.14135), so training memory is linear in the sequence length. The all-gather and
Ulysses strategies call it on their local blocks (:func:`flash_blocks`); it is also usable on
its own (:func:`flash_attention`).
"""

from __future__ import annotations

import functools

import jax
from jaxtyping import Array, Float, Int

from lcx.attention.blocks import Cotangent, KVBlock, OutLse, QueryBlock
from lcx.attention.kernels import AbstractKernel, XlaKernel, kernel_scope
from lcx.attention.masks import Mask
from lcx.attention.names import name_context
from lcx.attention.sinks import merge_sinks, row_sinks, sinks_grad

Output = Float[Array, "B T N H"] | tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]
"""``out`` in ``q.dtype``, or with ``return_lse`` ``(out, lse)`` with ``lse`` float32."""


def flash_attention(
    q: Float[Array, "B T N H"],
    k: Float[Array, "B S K H"],
    v: Float[Array, "B S K H"],
    q_pos: Int[Array, "B T"],
    k_pos: Int[Array, "B S"],
    q_seg: Int[Array, "B T"],
    k_seg: Int[Array, "B S"],
    *,
    mask: Mask,
    kernel: AbstractKernel | None = None,
    sinks: Float[Array, " N"] | None = None,
    return_lse: bool = False,
) -> Output:
    """Memory-efficient attention of ``q`` against ``k``/``v`` on one device, differentiable.

    Args:
      q: queries ``[B, T, N, H]`` (unscaled; the kernel applies ``1/sqrt(H)``).
      k: keys ``[B, S, K, H]``, ``N % K == 0`` (GQA: head n uses kv head n // (N/K)).
      v: values, shaped as ``k``.
      q_pos: int32 global query positions ``[B, T]``.
      k_pos: int32 global key positions ``[B, S]``.
      q_seg: int32 query segment ids ``[B, T]``; negative: padding (sees no key;
        :mod:`lcx.attention.masks`).
      k_seg: int32 key segment ids ``[B, S]``; negative: padding (seen by no query).
      mask: the visibility predicate.
      kernel: per-device kernel; default ``XlaKernel()``.
      sinks: float32 ``[N]`` per-head sink logits (:mod:`lcx.attention.sinks`), or None (no
        sink: the program is exactly the one without this argument). Padding rows get no sink.
      return_lse: also return the logsumexp (static; False: the program is exactly the one
        without this argument).

    Returns:
      ``out`` ``[B, T, N, H]`` in ``q.dtype``; 0 for a query with no visible key. With
      ``return_lse``, ``(out, lse)``: ``lse`` float32 ``[B, T, N]``, the natural-log logsumexp
      of the scaled visible logits, sinks included, ``-inf`` on a row with no visible key and no
      sink (padding rows: always). Gradients flow from both outputs (``d lse / d logit = P``:
      the backward uses ``delta - dlse`` for ``delta``) to ``q``, ``k``, ``v`` (in their dtypes)
      and ``sinks`` (float32, summed over this call's rows); positions and segment ids get none.

    Raises:
      ValueError: ``N`` not a multiple of ``K``.
    """
    qb, kvb = QueryBlock(q, q_pos, q_seg), KVBlock(k, v, k_pos, k_seg)
    return flash_blocks(qb, kvb, mask=mask, kernel=kernel, sinks=sinks, return_lse=return_lse)


def flash_blocks(
    q: QueryBlock,
    kv: KVBlock,
    *,
    mask: Mask,
    kernel: AbstractKernel | None = None,
    sinks: Float[Array, " N"] | None = None,
    return_lse: bool = False,
) -> Output:
    """:func:`flash_attention` of a query block against a K/V block (the strategies' form)."""
    kernel = XlaKernel() if kernel is None else kernel
    return _flash(kernel, mask, bool(return_lse), q, kv, sinks)


def _forward(kernel: AbstractKernel, mask: Mask, q: QueryBlock, kv: KVBlock, sinks) -> OutLse:
    with kernel_scope(kernel, "forward"):
        out, lse = kernel.forward(q, kv, mask=mask)
    # None has no leaves: without sinks the traced program is the plain kernel's
    return (out, lse) if sinks is None else merge_sinks(out, lse, row_sinks(sinks, q.seg))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _flash(kernel, mask, with_lse, q: QueryBlock, kv: KVBlock, sinks):
    out, lse = _forward(kernel, mask, q, kv, sinks)
    return (out.astype(q.q.dtype), lse) if with_lse else out.astype(q.q.dtype)


def _flash_fwd(kernel, mask, with_lse, q: QueryBlock, kv: KVBlock, sinks):
    out, lse = _forward(kernel, mask, q, kv, sinks)
    out, lse = name_context(out, lse)  # remat: custom can keep or offload them (model.remat_context)
    # keep out in float32 for delta = sum(dout * out): the residuals are O(T), not O(T * S)
    return ((out.astype(q.q.dtype), lse) if with_lse else out.astype(q.q.dtype)), (q, kv, out, lse, sinks)


def _flash_bwd(kernel, mask, with_lse, res, ct):
    q, kv, out, lse, sinks = res
    dout, dlse = ct if with_lse else (ct, None)
    # with sinks, out and lse already include them: the kernel's backward is then exact
    cot = Cotangent.of(out, lse, dout, dlse)
    with kernel_scope(kernel, "backward"):
        dq, dk, dv = kernel.backward(q, kv, cot, mask=mask)
    ds = None if sinks is None else sinks_grad(cot.delta, lse, sinks).astype(sinks.dtype)
    return q.cotangent(dq), kv.cotangent(dk, dv), ds


_flash.defvjp(_flash_fwd, _flash_bwd)
