"""One decoder layer for generation: the prefill form (returns its K/V) and the decode form
(attends one new token per row to the context-parallel KV cache).

Both read the model's own modules (:class:`lcx.models.llama.Block`: norms, projections, MLP) and
its per-kind options (:meth:`lcx.models.Llama.layer_options`: mask, RoPE table, sinks), so the
arithmetic is the training forward's; only the attention call differs.

Decode attention (:func:`decode_attention`) runs in ``jax.shard_map`` over the plan's mesh: each
device writes the new token's K/V into its slot if it owns it (:func:`lcx.generate.cache.write_slots`),
attends the new queries to its own K/V shard with the per-device kernel
(:class:`~lcx.attention.XlaKernel`: a one-token query is a matrix-vector product; Pallas
tiles target the prefill), and the P partial results ``(out, lse)`` are gathered over the context
axes and merged by their logsumexp with :func:`lcx.attention.merge_partials`, in device order on
every device, the merge a ring-attention step does (Liu et al. 2023, arXiv:2310.01889). The
sinks join once, after the merge (:func:`lcx.attention.merge_sinks`), as in every strategy.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int, PyTree

from lcx.attention import KVBlock, Mask, QueryBlock, XlaKernel, attention, merge_partials, merge_sinks
from lcx.attention.sinks import row_sinks
from lcx.models.llama import Block, LayerOptions, Llama
from lcx.sharding import MeshPlan
from lcx.sharding import axes as ax

PER_TOKEN = (ax.BATCH, ax.SEQ)
KV_AXES = (ax.BATCH, ax.SEQ, ax.HEADS, ax.HEAD_DIM)
"""Logical axes of one layer's cache ``[B, S, K, H]`` (kv heads follow the query heads' mesh
axes, as in :func:`lcx.attention.attention`)."""


def layer_block(model: Llama, layer: int) -> Block:
    """Decoder layer ``layer``'s :class:`Block`, its floating-point parameters cast to the
    model's compute dtype (as the forward casts each layer inside its scan)."""
    return cast_block(jax.tree.map(lambda a: a[layer] if isinstance(a, jax.Array) else a, model.blocks), model)


def cast_block(block: Block, model: Llama) -> Block:
    """``block`` (one layer's parameters) with its floating-point arrays in the model's compute dtype."""
    dtype = jnp.dtype(model.config.dtype)
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, block)


def scanned_periods(model: Llama) -> tuple[int, PyTree, Callable[[PyTree, int], Block]]:
    """``(n, periods, block)``: the number ``n`` of whole periods of the layer pattern, their
    parameters stacked ``[n, P, ...]`` (a scan's ``xs``, as the training forward scans them), and
    ``block(params, r)``: the :class:`Block` of kind ``r`` from one period's parameters, cast
    (:func:`cast_block`). The ``n_layers mod P`` remainder layers are left to :func:`layer_block`."""
    P = len(model.config.period_kinds)
    n = model.config.n_layers // P
    dynamic, static = eqx.partition(model.blocks, eqx.is_array)
    periods = jax.tree.map(lambda a: a[: n * P].reshape(n, P, *a.shape[1:]), dynamic)
    return n, periods, lambda params, r: cast_block(eqx.combine(jax.tree.map(lambda a: a[r], params), static), model)


def prefill_layer(
    block: Block,
    x: Float[Array, "B T D"],
    positions: Int[Array, "B T"],
    segment_ids: Int[Array, "B T"],
    *,
    layer: LayerOptions,
    plan: MeshPlan,
) -> tuple[Float[Array, "B T D"], Float[Array, "B T K H"], Float[Array, "B T K H"]]:
    """One layer over the laid-out prompt (the model's block, attention under the plan's
    strategy for the layer's kind); also returns the layer's K (after RoPE) and V."""
    with jax.named_scope("lcx.generate.prefill_layer"):
        q, k, v = block.attn.project(block.attn_norm(x), positions, layer.rope)
        sinks = block.attn.sinks if layer.sinks else None
        o = attention(q, k, v, plan=plan, mask=layer.mask, positions=positions, segment_ids=segment_ids, sinks=sinks)
        assert not isinstance(o, tuple)  # return_lse=False: the output alone
        return plan.constrain(block.finish(x, block.attn.output(o)), (ax.BATCH, ax.SEQ, ax.EMBED)), k, v


def decode_layer(
    block: Block,
    x: Float[Array, "B 1 D"],
    positions: Int[Array, " B"],
    cache: tuple[Array, Array, Array, Array],
    index: int | Int[Array, ""],
    write: tuple[Int[Array, " B"], Int[Array, " B"]],
    *,
    layer: LayerOptions,
    plan: MeshPlan,
) -> tuple[Float[Array, "B 1 D"], Array, Array]:
    """One layer for one new token per row: write its K/V into the cache, attend, MLP.

    Args:
      block: the layer's :class:`Block` (:func:`layer_block`).
      x: ``[B, 1, D]`` the new tokens' residual stream.
      positions: int32 ``[B]`` their global positions.
      cache: the layer's group ``(k, v, pos, seg)``, K/V ``[L_g, B, S, K, H]``, ids ``[B, S]``
        (ids already hold the new tokens).
      index: this layer's index in its group (an int, or an int32 scalar inside the scan over
        periods).
      write: ``(owner, slot)`` int32 ``[B]``: the device and local slot of each new token.
      layer: the layer's options.
      plan: the plan (mesh and context axes).

    Returns:
      ``(x, k, v)``: the layer's output ``[B, 1, D]`` and the group's updated K/V.
    """
    with jax.named_scope("lcx.generate.decode_layer"):
        q, k, v = block.attn.project(block.attn_norm(x), positions[:, None], layer.rope)
        sinks = block.attn.sinks if layer.sinks else None
        o, ck, cv = decode_attention(plan, layer.mask, q, k, v, cache, index, write, positions, sinks)
        return block.finish(x, block.attn.output(o)), ck, cv


def decode_attention(
    mesh_plan: MeshPlan,
    mask: Mask,
    q: Float[Array, "B 1 N H"],
    k: Float[Array, "B 1 K H"],
    v: Float[Array, "B 1 K H"],
    cache: tuple[Array, Array, Array, Array],
    index: int | Int[Array, ""],
    write: tuple[Int[Array, " B"], Int[Array, " B"]],
    positions: Int[Array, " B"],
    sinks: Float[Array, " N"] | None,
) -> tuple[Float[Array, "B 1 N H"], Array, Array]:
    """The new token's K/V written to its owner's slot, then attention of the new queries to the
    whole cache: per device on its shard, merged over the context axes by logsumexp (module
    docstring). Arguments as :func:`decode_layer`; returns ``(out, k_cache, v_cache)``."""
    plan = mesh_plan.plan
    axes, P = plan.seq_axes, mesh_plan.context_degree
    ck, cv, cpos, cseg = cache
    stack = plan.activation_spec((None, *KV_AXES))
    q_spec = plan.activation_spec((ax.BATCH, None, ax.HEADS, ax.HEAD_DIM))
    row = plan.activation_spec((ax.BATCH,))
    owner, slot = write

    def local(q, k, v, ck, cv, cpos, cseg, owner, slot, qpos, index, *s):
        me = lax.axis_index(axes) if P > 1 else 0
        b = jnp.arange(q.shape[0])

        def put(cache, new):  # only the owner's slot changes: O(B K H) per layer and step
            val = jnp.where((owner == me)[:, None, None], new[:, 0].astype(cache.dtype), cache[index, b, slot])
            return cache.at[index, b, slot].set(val)

        ck, cv = put(ck, k), put(cv, v)
        qseg = jnp.zeros_like(qpos)
        kernel = XlaKernel(block_q=1, block_kv=ck.shape[2])  # one tile: the whole local shard
        out, lse = kernel.forward(QueryBlock(q, qpos, qseg), KVBlock(ck[index], cv[index], cpos, cseg), mask=mask)
        if P > 1:
            outs, lses = lax.all_gather(out, axes), lax.all_gather(lse, axes)
            out, lse = outs[0], lses[0]
            for i in range(1, P):  # device order, the same on every device
                out, lse = merge_partials(out, lse, outs[i], lses[i])
        if s:
            out, lse = merge_sinks(out, lse, row_sinks(s[0], qseg))
        return out.astype(q.dtype), ck, cv

    in_specs = (q_spec, q_spec, q_spec, stack, stack, plan.activation_spec(PER_TOKEN), plan.activation_spec(PER_TOKEN))
    in_specs += (row, row, plan.activation_spec((ax.BATCH, None)), PartitionSpec())
    args = (q, k, v, ck, cv, cpos, cseg, owner, slot, positions[:, None], jnp.asarray(index, jnp.int32))
    if sinks is not None:
        in_specs += (plan.activation_spec((ax.HEADS,)),)
        args += (sinks.astype(jnp.float32),)
    fn = jax.shard_map(
        local,
        mesh=mesh_plan.mesh,
        in_specs=in_specs,
        out_specs=(q_spec, stack, stack),
        check_vma=False,  # as lcx.attention.attention: every spec is explicit
    )
    return fn(*args)


def output_logits(model: Llama, x: Float[Array, "B D"]) -> Float[Array, "B V"]:
    """float32 next-token logits of the last layer's output ``x`` (final norm, output head, as
    :meth:`lcx.models.Llama.logits`)."""
    head = model.output_head()
    return jnp.einsum("BD,DV->BV", model.final_norm(x), head, preferred_element_type=jnp.float32)


__all__ = [
    "cast_block",
    "decode_attention",
    "decode_layer",
    "layer_block",
    "output_logits",
    "prefill_layer",
    "scanned_periods",
]
