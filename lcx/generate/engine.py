"""Prefill, decode step and the generation loop (MaxText maxengine's split: ``prefill`` a batch
of prompts into a KV cache, then ``decode_step`` one token per row at a time; ``generate`` runs
both).

The prompt is laid out and sharded over the context axes exactly as a training batch
(:mod:`lcx.generate.prompts`), its attention runs under the plan's strategy and kernel for each
layer kind, and each layer's K/V stay where the prefill computed them; the cache layout and its
append and ring rules are :mod:`lcx.generate.cache`'s; a decode step attends each new query to
every device's shard and merges by logsumexp (:mod:`lcx.generate.layers`).
"""

from __future__ import annotations

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from jaxtyping import Array, Float, Int, PRNGKeyArray

from lcx.generate.cache import CacheGroup, CacheLayout, KVCache, cache_layout, ring_sources, write_slots
from lcx.generate.layers import (
    KV_AXES,
    PER_TOKEN,
    decode_layer,
    layer_block,
    output_logits,
    prefill_layer,
    scanned_periods,
)
from lcx.generate.prompts import as_rows, check_request, prepare
from lcx.generate.sampling import check_sampling, sample
from lcx.models.llama import Llama
from lcx.models.sharding import shard_model
from lcx.sharding import MeshPlan, Plan, bind
from lcx.sharding import axes as ax


class DecodeState(eqx.Module):
    """What a decode step reads and writes.

    Attributes:
      caches: one :class:`KVCache` per cache group (``CacheLayout.groups``).
      pos: int32 ``[B]``: the global position of the token each row feeds next.
      step: int32 ``[]``: decode steps taken (the append rule's clock).
    """

    caches: tuple[KVCache, ...]
    pos: Int[Array, " B"]
    step: Int[Array, ""]


class Prefilled(eqx.Module):
    """The result of :func:`prefill`: the decode state, the first next-token logits and the
    static description of the cache and the batch."""

    state: DecodeState
    logits: Float[Array, "B V"]
    layout: CacheLayout = eqx.field(static=True)
    rows: int = eqx.field(static=True)


def _mesh_plan(plan: Plan | MeshPlan) -> MeshPlan:
    return plan if isinstance(plan, MeshPlan) else bind(plan)


def prefill(
    model: Llama,
    prompts: Sequence[Sequence[int] | np.ndarray] | np.ndarray,
    *,
    plan: Plan | MeshPlan,
    max_new_tokens: int,
) -> Prefilled:
    """Run the prompts through the model under ``plan`` and build the context-parallel KV cache.

    Args:
      model: the :class:`Llama` (its parameters are placed by the plan's rules).
      prompts: a list of int token arrays (any lengths >= 1) or an int ``[B, T]`` array.
      plan: a :class:`Plan` (bound to all devices) or :class:`MeshPlan`.
      max_new_tokens: tokens to be generated per row (sizes the cache).

    Returns:
      :class:`Prefilled`: logits float32 ``[B', V]`` of each row's next token (``B'`` the batch
      padded to the data degree; the first ``rows`` are the caller's).

    Raises:
      ValueError: an empty prompt, a token id outside the vocabulary, a prompt longer than the
        RoPE range without scaling (:func:`lcx.generate.prompts.check_request`); a
        ``PlanError`` (a ``ValueError``) where a layer kind's strategy refuses every padded
        length (:func:`lcx.generate.prompts.padded_length`). Raised before compiling.
    """
    mp = _mesh_plan(plan)
    rows = as_rows(prompts)
    check_request(rows, model.config, max_new_tokens)
    batch = prepare(rows, mp, [model.layer_options(k).mask for k in model.config.layer_kinds])
    layout = cache_layout(
        model.config.layer_kinds,
        degree=mp.context_degree,
        prompt_len=batch.prompt_len,
        max_new_tokens=max_new_tokens,
    )
    placed: Llama = shard_model(model, mp)  # pyright: ignore[reportAssignmentType]  # same tree, placed
    per_token = mp.activation_sharding(PER_TOKEN)
    tokens, positions, segment_ids = (
        jax.device_put(x, per_token) for x in (batch.tokens, batch.positions, batch.segment_ids)
    )
    last = np.take_along_axis(batch.inverse, batch.lengths[:, None].astype(np.int64) - 1, axis=1)[:, 0]
    P = mp.context_degree
    rings = tuple(
        tuple(jnp.asarray(a) for a in ring_sources(batch.lengths, batch.inverse, g.local_slots * P, P))
        for g in layout.groups
        if g.is_ring
    )
    lengths = jnp.asarray(batch.lengths)
    state, logits = _prefill(
        placed, tokens, positions, segment_ids, jnp.asarray(last), lengths, rings, layout=layout, plan=mp
    )
    return Prefilled(state, logits, layout, batch.rows)


@eqx.filter_jit
def _prefill(
    model: Llama, tokens, positions, segment_ids, last, lengths, rings, *, layout: CacheLayout, plan: MeshPlan
):
    cfg = model.config
    x = plan.constrain(model.embed_tokens(tokens), (ax.BATCH, ax.SEQ, ax.EMBED))
    rings = dict(zip((i for i, g in enumerate(layout.groups) if g.is_ring), rings, strict=True))

    def run(x, kind, block, g):  # one layer: its output and the K/V its cache group keeps
        x, k, v = prefill_layer(block, x, positions, segment_ids, layer=model.layer_options(kind), plan=plan)
        if g in rings:  # keep only the ring's keys now: one layer's whole K/V is live at a time
            index = rings[g][0][:, :, None, None]
            k, v = jnp.take_along_axis(k, index, axis=1), jnp.take_along_axis(v, index, axis=1)
        return x, (k, v)

    kinds = cfg.period_kinds
    n, periods, period_block = scanned_periods(model)
    slots = _period_slots(layout, len(kinds), n)
    scanned: tuple = ()
    if n:  # one scan over the pattern's periods, as decoding (compile time does not grow with depth)

        def period(x, params):
            kvs = []
            for r, kind in enumerate(kinds):
                x, kv = run(x, kind, period_block(params, r), slots[r][0])
                kvs.append(kv)
            return x, tuple(kvs)

        x, scanned = jax.lax.scan(period, x, periods)  # scanned[r]: K, V [n, ...] of kind r's layers
    remainder = {}
    for i in range(n * len(kinds), cfg.n_layers):  # the pattern's first kinds
        x, remainder[i] = run(x, cfg.layer_kinds[i], layer_block(model, i), layout.layer_slot[i][0])
    logits = output_logits(model, jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0])
    caches = []
    for gi, g in enumerate(layout.groups):
        k, v = (_group_stack(g, gi, slots, scanned, remainder, t, n * len(kinds)) for t in (0, 1))
        if g.is_ring:
            _, pos, seg = rings[gi]
        else:
            k, v, pos, seg = _append_slots(plan, g, k, v, positions, segment_ids)
        caches.append(_constrain_cache(plan, KVCache(k, v, pos, seg)))
    state = DecodeState(tuple(caches), lengths.astype(jnp.int32), jnp.zeros((), jnp.int32))
    return state, logits


def _group_stack(g: CacheGroup, gi: int, slots, scanned: tuple, remainder: dict, t: int, n_scanned: int):
    """Cache group ``gi``'s K (``t`` 0) or V (1) ``[L_g, ...]``, its layers in order: those of the
    scanned periods (``scanned[r][t]``: ``[n, ...]`` of the period's kind ``r``; period ``p``'s
    kinds of this group at ``p * m + j0``, :func:`_period_slots`), then the remainder layers."""
    here = [r for _, r in sorted((j0, r) for r, (group, _, j0) in enumerate(slots) if group == gi)]
    parts = [remainder[i][t][None] for i in g.layers if i >= n_scanned]
    if n_scanned and here:  # [n, m, ...] -> [n * m, ...]: layer p * m + j0 in the group's order
        a = jnp.stack([scanned[r][t] for r in here], 1)
        parts.insert(0, a.reshape(-1, *a.shape[2:]))
    return jnp.concatenate(parts)


def _append_slots(plan: MeshPlan, g: CacheGroup, k, v, positions, segment_ids):
    """Each device's prompt shard followed by its empty decode slots (position 0, segment -1);
    local, in ``shard_map``: nothing moves between devices."""
    extra = g.local_slots - g.prompt_slots
    stack, ids = plan.plan.activation_spec((None, *KV_AXES)), plan.plan.activation_spec(PER_TOKEN)

    def local(k, v, pos, seg):
        pad = lambda a, fill: jnp.pad(a, [(0, 0)] * (a.ndim - 3) + [(0, extra)] + [(0, 0)] * 2, constant_values=fill)
        grow = lambda a, fill: jnp.pad(a, ((0, 0), (0, extra)), constant_values=fill)
        return pad(k, 0), pad(v, 0), grow(pos, 0), grow(seg, -1)

    fn = jax.shard_map(
        local, mesh=plan.mesh, in_specs=(stack, stack, ids, ids), out_specs=(stack, stack, ids, ids), check_vma=False
    )
    return fn(k, v, positions, segment_ids)


def _constrain_cache(plan: MeshPlan, c: KVCache) -> KVCache:
    stack = jax.sharding.NamedSharding(plan.mesh, plan.plan.activation_spec((None, *KV_AXES)))
    ids = plan.activation_sharding(PER_TOKEN)
    wsc = jax.lax.with_sharding_constraint
    return KVCache(wsc(c.k, stack), wsc(c.v, stack), wsc(c.pos, ids), wsc(c.seg, ids))


def decode_step(
    model: Llama, state: DecodeState, tokens: Int[Array, " B"], *, layout: CacheLayout, plan: MeshPlan
) -> tuple[Float[Array, "B V"], DecodeState]:
    """Feed one token per row; the next-token logits and the advanced state.

    Args:
      model: the model (placed on ``plan``'s mesh, as :func:`prefill` left it).
      state: the state of :func:`prefill` or of the previous step.
      tokens: int32 ``[B']`` the tokens to feed (at positions ``state.pos``).
      layout: ``Prefilled.layout``.
      plan: the :class:`MeshPlan` of the prefill.

    Returns:
      ``(logits, state)``: float32 ``[B', V]`` and the state with the tokens' K/V in the cache
      (:mod:`lcx.generate.cache`'s append and ring rules), ``pos + 1``, ``step + 1``.

    Raises:
      ValueError: the cache is full: ``state.step`` has reached the ``max_new_tokens`` the
        prefill sized it for (reads the step from the device; :func:`generate`'s compiled loop
        never calls this).
    """
    if int(state.step) >= layout.max_new_tokens:
        raise ValueError(
            f"decode_step: the cache holds max_new_tokens={layout.max_new_tokens} decode steps and all are taken; "
            "prefill again with a larger max_new_tokens"
        )
    return _decode(model, state, tokens, layout=layout, plan=plan)


@eqx.filter_jit
def _decode(model: Llama, state: DecodeState, tokens, *, layout: CacheLayout, plan: MeshPlan):
    cfg = model.config
    pos = state.pos
    x = model.embed_tokens(tokens[:, None])
    ids, kvs, writes = [], [], []  # per group: (pos, seg) fixed for the step; (K, V) updated by its layers
    for g, c in zip(layout.groups, state.caches):
        owner, slot = write_slots(g, state.step, pos, layout.degree)
        hit = jnp.arange(c.pos.shape[1])[None, :] == (owner * g.local_slots + slot)[:, None]
        ids.append((jnp.where(hit, pos[:, None], c.pos), jnp.where(hit, 0, c.seg)))
        kvs.append((c.k, c.v))
        writes.append((owner, slot))

    def run(x, kvs: tuple, kind, block, gi: int, j):  # one layer; its group's K/V replaced in kvs
        k, v = kvs[gi]
        x, k, v = decode_layer(
            block, x, pos, (k, v, *ids[gi]), j, writes[gi], layer=model.layer_options(kind), plan=plan
        )
        return x, kvs[:gi] + ((k, v),) + kvs[gi + 1 :]

    kinds = cfg.period_kinds
    n, periods, period_block = scanned_periods(model)
    kvs = tuple(kvs)
    if n:  # one scan over the pattern's periods: compile time does not grow with depth
        slots = _period_slots(layout, len(kinds), n)

        def period(carry, xs):
            (x, kvs), (params, p) = carry, xs
            for r, kind in enumerate(kinds):
                gi, m, j0 = slots[r]
                x, kvs = run(x, kvs, kind, period_block(params, r), gi, p * m + j0)
            return (x, kvs), None

        (x, kvs), _ = jax.lax.scan(period, (x, kvs), (periods, jnp.arange(n)))
    for i in range(n * len(kinds), cfg.n_layers):  # the remainder layers: the pattern's first kinds
        x, kvs = run(x, kvs, cfg.layer_kinds[i], layer_block(model, i), *layout.layer_slot[i])
    new = tuple(_constrain_cache(plan, KVCache(*kv, *i)) for kv, i in zip(kvs, ids, strict=True))
    return output_logits(model, x[:, 0]), DecodeState(new, pos + 1, state.step + 1)


def _period_slots(layout: CacheLayout, kinds: int, n: int) -> tuple[tuple[int, int, int], ...]:
    """``(group, m, j0)`` per kind of the pattern's period: layer ``p * kinds + r`` of the
    scanned periods is index ``p * m + j0`` of cache group ``group`` (``m`` of the period's layers
    share that group; :func:`lcx.generate.cache.cache_layout` numbers a group's layers in order)."""
    groups = [layout.layer_slot[r][0] for r in range(kinds)]
    slots = tuple((g, groups.count(g), layout.layer_slot[r][1]) for r, g in enumerate(groups))
    for p in range(n):
        for r, (g, m, j0) in enumerate(slots):
            if layout.layer_slot[p * kinds + r] != (g, p * m + j0):  # pragma: no cover
                raise AssertionError(f"cache layout is not periodic at layer {p * kinds + r}: {layout.layer_slot}")
    return slots


def generate(
    model: Llama,
    prompts: Sequence[Sequence[int] | np.ndarray] | np.ndarray,
    *,
    plan: Plan | MeshPlan,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    key: PRNGKeyArray | None = None,
    eos_id: int | None = None,
) -> Int[Array, "B max_new_tokens"]:
    """Generate ``max_new_tokens`` tokens per prompt with context-parallel prefill and decoding.

    Args:
      model: the :class:`Llama`.
      prompts: a list of int token arrays (lengths may differ, each >= 1) or an int32 ``[B, T]``.
      plan: the sharding plan (:class:`Plan`, bound to all devices, or :class:`MeshPlan`): the
        prompt and the KV cache are sharded over its context axes as a training batch is.
      max_new_tokens: tokens per row (>= 1).
      temperature: 0 (default): greedy; > 0: sampling from ``softmax(logits / temperature)``.
      top_p: nucleus mass in ``(0, 1]`` (1: no cut).
      key: PRNG key, required when ``temperature > 0`` (step ``i`` uses ``fold_in(key, i)``).
      eos_id: a row stops after emitting this token; its remaining entries are ``eos_id``. The
        loop ends when every row has stopped. None: every row runs ``max_new_tokens``.

    Returns:
      int32 ``[B, max_new_tokens]``, row ``b`` the tokens after prompt ``b``.

    Raises:
      ValueError: bad sampling settings (:func:`lcx.generate.sampling.check_sampling`) and
        :func:`prefill`'s refusals, before compiling.
    """
    check_sampling(temperature, top_p, key)
    mp = _mesh_plan(plan)
    pre = prefill(model, prompts, plan=mp, max_new_tokens=max_new_tokens)
    key = jax.random.key(0) if key is None else key  # unused when greedy
    eos = -1 if eos_id is None else int(eos_id)
    placed = shard_model(model, mp)  # where prefill placed it (already there: no copy)
    out = _loop(
        placed, pre.state, pre.logits, key,
        layout=pre.layout, plan=mp, n=max_new_tokens, temperature=float(temperature), top_p=float(top_p), eos=eos,
    )  # fmt: skip
    return out[: pre.rows]


@eqx.filter_jit
def _loop(model, state, logits, key, *, layout, plan, n: int, temperature: float, top_p: float, eos: int):
    def draw(logits, i):
        return sample(logits, jax.random.fold_in(key, i), temperature=temperature, top_p=top_p)

    first = draw(logits, 0)
    replicated = jax.sharding.NamedSharding(plan.mesh, PartitionSpec())
    out = jnp.full((first.shape[0], n), max(eos, 0), jnp.int32).at[:, 0].set(first)
    done = first == eos

    def cond(carry):
        i, _, _, _, done = carry
        return (i < n) & ~jnp.all(done)

    def body(carry):
        i, state, tok, out, done = carry
        logits, state = _decode(model, state, tok, layout=layout, plan=plan)
        nxt = jnp.where(done, eos, draw(logits, i))
        return i + 1, state, nxt, out.at[:, i].set(nxt), done | (nxt == eos)

    carry = (jnp.ones((), jnp.int32), state, first, out, done)
    _, _, _, out, _ = jax.lax.while_loop(cond, body, carry)
    return jax.lax.with_sharding_constraint(out, replicated)


__all__ = ["DecodeState", "Prefilled", "decode_step", "generate", "prefill"]
