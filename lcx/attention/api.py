"""The public context-parallel attention function.

``attention(q, k, v, plan=..., mask=...)`` takes GLOBAL arrays (sharded or not), looks up the
strategy the plan names for the mask's layer kind (``plan.attention.strategy_for(mask.kind)``:
one strategy for every layer, or e.g. ring for global layers and halo for sliding ones) and the
per-device kernel (``plan.attention.kernel``), checks every shape against the plan before anything compiles, and
runs the strategy inside ``jax.shard_map`` on the plan's mesh. It works eagerly, inside an outer
``jax.jit`` whose arrays the plan shards, and under ``jax.grad``. The model calls it; so can any
user script.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from jaxtyping import Array, ArrayLike, Float, Int

from lcx.attention.blocks import KVBlock, QueryBlock
from lcx.attention.kernels import make_kernel
from lcx.attention.masks import Mask
from lcx.attention.strategies import AbstractStrategy, get_strategy
from lcx.sharding import MeshPlan, Plan, bind
from lcx.sharding import axes as ax
from lcx.sharding.layout import layout_permutation


def attention(
    q: Float[ArrayLike, "B T N H"],
    k: Float[ArrayLike, "B T K H"],
    v: Float[ArrayLike, "B T K H"],
    *,
    plan: Plan | MeshPlan,
    mask: Mask,
    positions: Int[ArrayLike, "B T"] | None = None,
    segment_ids: Int[ArrayLike, "B T"] | None = None,
    kv_positions: Int[ArrayLike, "B T"] | None = None,
    kv_segment_ids: Int[ArrayLike, "B T"] | None = None,
    sinks: Float[ArrayLike, " N"] | None = None,
    return_lse: bool = False,
    **unsupported,
) -> Float[Array, "B T N H"] | tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
    """Context-parallel softmax attention ``softmax(q k^T / sqrt(H) + mask) v`` on global arrays.

    The sequence layout (contiguous, zigzag or balanced) is whatever the data pipeline applied: positions
    and segment ids are global and travel with their tokens, so results do not depend on it.
    Only ``positions=None`` reads the layout: it stands for ``arange(T)`` laid out as the plan
    says (``plan.attention.layout`` over the context degree, :func:`lcx.sharding.apply_layout`),
    the true global position of every token of a laid-out batch.

    Padding: a NEGATIVE segment id marks a padding token (``lcx.data`` writes ``-1``), under
    every mask, strategy and kernel: it sees no key and no query sees it, so its output is 0,
    its gradients are 0 and its logsumexp is ``-inf`` (no sink either); blocks and ring steps
    made only of padding are skipped. Ids ``>= 0`` are documents (:mod:`lcx.attention.masks`).

    Not supported (refused with a ``TypeError`` that says so): attention dropout
    (``dropout_rate``, ...), a softmax scale other than ``1 / sqrt(H)`` (scale ``q`` instead),
    logit soft-capping, additive biases (ALiBi etc.; visibility is the :class:`Mask` on
    positions and segment ids), cross-attention with another key length, KV caches / decoding.

    Args:
      q: queries ``[B, T, N, H]`` (batch, sequence in tokens, heads, head dim), any float dtype.
      k: keys ``[B, T, K, H]``, ``N % K == 0`` (GQA/MQA: query head ``n`` uses kv head
        ``n // (N / K)``; K/V are never repeated except as Ulysses needs, see
        :mod:`lcx.attention.strategies.a2a`).
      v: values, shaped as ``k``.
      plan: a :class:`~lcx.sharding.MeshPlan`, or a :class:`~lcx.sharding.Plan` which is then
        bound to all of ``jax.devices()``. Its activation rules shard ``batch``, ``seq`` and
        ``heads``; K/V heads are sharded like the query heads (so each device holds the kv heads
        its query heads use).
      mask: visibility predicate (:class:`Mask`: causal, document, sliding window).
      positions: int32 ``[B, T]`` global positions of the tokens; default (None): the plan's
        layout of ``arange(T)``, ``layout_permutation(plan.attention.layout, T, P)`` with ``P``
        the context degree (``arange(T)`` itself for a contiguous layout or ``P = 1``), i.e.
        inputs laid out by the plan, as the data pipeline lays out a batch.
      segment_ids: int32 ``[B, T]`` document ids (``>= 0``), negative for padding; default zeros.
      kv_positions: int32 ``[B, T]`` key positions, if they differ from the queries' (default:
        ``positions``).
      kv_segment_ids: int32 ``[B, T]`` key segment ids, if they differ from the queries'
        (default: ``segment_ids``).
      sinks: ``[N]`` learnable per-query-head sink logits (gpt-oss; StreamingLLM, Xiao et al.
        2023, arXiv:2309.17453): each joins its head's softmax denominator as an extra key of
        value 0, ``lse' = logaddexp(lse, sinks[n])`` (:mod:`lcx.attention.sinks`). Any float
        dtype, computed in float32; sharded like the query heads. None (default): no sink, and
        the program is exactly the one without this argument. Padding rows get no sink.
      return_lse: also return the logsumexp (a Python bool, static). False (default): the
        program is exactly the one without this argument.

    Returns:
      ``out`` ``[B, T, N, H]`` in ``q.dtype``, sharded like ``q`` by the plan. A query with no
      visible key gets 0 (and zero, finite gradients for q, k, v), with or without a sink.
      With ``return_lse=True``, ``(out, lse)``: ``lse`` float32 ``[B, T, N]``, sharded like
      ``out`` without its head dim, the natural-log logsumexp over every visible key of the
      scaled logits ``q k / sqrt(H)``, the sink logit included when ``sinks`` is given
      (``logaddexp(lse, sinks[n])``), ``-inf`` on a row that sees no key and has no sink
      (padding rows: always). With it, partial results over disjoint key sets combine with
      :func:`~lcx.attention.merge_partials`. Differentiable in q, k, v and sinks, from both
      outputs (``d lse / d logit_j`` is the probability ``p_j``).

    Raises:
      ValueError: inconsistent shapes (``sinks`` not ``[N]`` or not floating point); batch,
        sequence or head counts not divisible by the mesh axes the plan maps them to; a strategy
        that cannot serve these head counts (e.g. the Ulysses degree does not divide the query
        heads); a per-kind plan that gives the mask's kind (``mask.kind``) no strategy
        (:class:`~lcx.sharding.PlanError`). Raised before compiling.
        The splash kernel also refuses block sizes its Pallas kernels cannot tile: ``block_q`` not
        a multiple of 8, ``block_kv``, ``block_q_dkv``, ``block_kv_dkv`` not multiples of 128, kv
        blocks > 16384 (:mod:`lcx.attention.kernels.splash`). ``positions=None`` with a sequence
        length the plan's layout cannot split (:func:`lcx.sharding.check_layout`).
      KernelNotAvailableError: the plan's kernel cannot run with this JAX (no Pallas splash).
      TypeError: an argument attention() does not take (e.g. ``dropout_rate``), with what it
        does not do; ``return_lse`` not a bool.
    """
    if unsupported:
        raise TypeError(_unsupported_message(unsupported))
    if not isinstance(return_lse, bool):
        raise TypeError(f"attention: return_lse must be a Python bool (it is static), got {type(return_lse).__name__}")
    mp = plan if isinstance(plan, MeshPlan) else bind(plan)
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_shapes(q, k, v)
    B, T = q.shape[:2]
    strategy, (q_spec, kv_spec, pos_spec) = build_strategy(mp, mask, q.shape, k.shape)
    positions = _default(positions, lambda: _layout_positions(mp, B, T), (B, T), "positions")
    segment_ids = _default(segment_ids, lambda: jnp.zeros((B, T), jnp.int32), (B, T), "segment_ids")
    kv_positions = _default(kv_positions, lambda: positions, (B, T), "kv_positions")
    kv_segment_ids = _default(kv_segment_ids, lambda: segment_ids, (B, T), "kv_segment_ids")

    if sinks is not None:
        sinks = jnp.asarray(sinks)
        if tuple(sinks.shape) != (q.shape[2],) or not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(
                f"attention: sinks must be a float array of shape [heads] = ({q.shape[2]},), got {sinks.dtype} "
                f"{tuple(sinks.shape)}"
            )
        sinks = sinks.astype(jnp.float32)

    in_specs = (q_spec, kv_spec, kv_spec, pos_spec, pos_spec, pos_spec, pos_spec)
    args = (q, k, v, positions, kv_positions, segment_ids, kv_segment_ids)
    if sinks is not None:
        # each device gets the sinks of the query heads it holds (the heads' mesh axes, as q);
        # replicated over batch and sequence, so shard_map's transpose sums their cotangents
        in_specs += (mp.plan.activation_spec((ax.HEADS,)),)
        args += (sinks,)
    lse_spec = mp.plan.activation_spec((ax.BATCH, ax.SEQ, ax.HEADS))
    fn = jax.shard_map(
        functools.partial(_tie_masks_to_queries, strategy, return_lse),
        mesh=mp.mesh,
        in_specs=in_specs,
        out_specs=(q_spec, lse_spec) if return_lse else q_spec,
        # check_vma=False: the custom VJPs and scans in the strategies carry values whose
        # device-variance the checker cannot infer (shard_map's varying-manual-axes check); every in/out spec is
        # explicit, so nothing relies on the check.
        check_vma=False,
    )
    return fn(*args)


def build_strategy(
    mesh_plan: MeshPlan, mask: Mask, q_shape: tuple[int, ...], kv_shape: tuple[int, ...]
) -> tuple[AbstractStrategy, tuple[PartitionSpec, PartitionSpec, PartitionSpec]]:
    """The plan's strategy for these global shapes, and the shard_map specs of q, k/v, positions.

    Args:
      mesh_plan: plan bound to a mesh.
      mask: the mask.
      q_shape: global ``(B, T, N, H)``.
      kv_shape: global ``(B, T, K, H)``.

    Returns:
      ``(strategy, (q_spec, kv_spec, pos_spec))``.

    Raises:
      ValueError: see :func:`attention`.
      KernelNotAvailableError: the plan's kernel cannot run with this JAX.
    """
    plan = mesh_plan.plan
    sizes = dict(mesh_plan.mesh.shape)
    cfg = plan.attention
    rules = plan.activation_rules

    def degree(logical):
        return math.prod(sizes[m] for m in rules.get(logical, ()))

    q_spec = plan.activation_spec((ax.BATCH, ax.SEQ, ax.HEADS, ax.HEAD_DIM))
    if rules.get(ax.HEAD_DIM):
        raise ValueError(
            f"attention cannot split head_dim (plan.activations.head_dim -> {rules[ax.HEAD_DIM]}); remove that rule"
        )
    # K/V heads follow the query heads' mesh axes whatever the kv_heads rule says: each device
    # must hold exactly the kv heads its query heads use (head n -> kv head n // G).
    kv_spec = PartitionSpec(*q_spec)
    pos_spec = plan.activation_spec((ax.BATCH, ax.SEQ))

    B, T, N, H = q_shape
    K = kv_shape[2]
    for logical, n, what in ((ax.BATCH, B, "batch"), (ax.SEQ, T, "sequence length"), (ax.HEADS, N, "query heads")):
        d = degree(logical)
        if n % d:
            raise ValueError(
                f"attention: {what} {n} is not divisible by {d}, the size of mesh axes {rules.get(logical)} that "
                f"plan.activations.{logical} maps it to; change the plan or the shape"
            )
    tp = degree(ax.HEADS)
    if K % tp:
        raise ValueError(
            f"attention: {K} kv heads cannot follow the query heads' sharding over mesh axes "
            f"{rules.get(ax.HEADS)} (size {tp}); use a tensor degree dividing {K} for the heads"
        )
    kernel = make_kernel(cfg.kernel, cfg.blocks)
    # the strategy of this layer's kind (plan.attention.strategy may name one per kind)
    strategy = get_strategy(cfg.strategy_for(mask.kind)).from_plan(kernel, mask, plan.seq_axes, sizes, cfg)
    P = degree(ax.SEQ)
    strategy.check((B // degree(ax.BATCH), T // P, N // tp, H), (B // degree(ax.BATCH), T // P, K // tp, H))
    return strategy, (q_spec, kv_spec, pos_spec)


def _tie_masks_to_queries(strategy, return_lse, q, k, v, q_pos, k_pos, q_seg, k_seg, *rest):
    """Run ``strategy`` on this device's shards with positions and segment ids made data-dependent
    on the local queries (adding an int32 zero computed from ``q``).

    Why: a model calls attention inside ``lax.scan`` over layers, where positions and segment ids
    are loop-invariant. When JAX linearizes the scan it hoists every residual that depends only
    on loop-invariant values out of the loop and keeps it for the backward pass (``jax._src.lax.
    control_flow.loops._scan_known_hoisting``). Everything the kernels derive from positions
    alone -- the additive mask tile of every (query block, key block) pair of every ring step --
    is such a residual: hoisted, it is a ``[P - 1, T / bq, T / bk, bq, bk]`` float32 stack per
    device, i.e. O(S^2 / P) memory instead of O(block^2) (measured in docs/architecture.md;
    tests/test_attention_memory.py keeps it so). The zero ties the masks to this layer's queries, so they are recomputed tile by tile; XLA folds
    the zero away. (NaN-safe: ``where(x == x, 0, 0)`` is 0 for every x.)
    """
    x = q[(0,) * q.ndim]
    zero = jnp.where(x == x, 0, 0).astype(jnp.int32)
    # profiles then read as the architecture does: lcx.Attention / lcx.Ring / lcx.XlaKernel.forward
    qb, kvb = QueryBlock(q, q_pos + zero, q_seg + zero), KVBlock(k, v, k_pos + zero, k_seg + zero)
    with jax.named_scope(f"lcx.{type(strategy).__name__}"):
        return strategy(qb, kvb, *rest, return_lse=return_lse)


def _layout_positions(mp: MeshPlan, B: int, T: int) -> Int[Array, "B T"]:
    """int32 ``[B, T]``: the global position of every token of a batch laid out by the plan
    (``positions=None``). Checks the length against the layout (:func:`check_layout`)."""
    att = mp.plan.attention
    perm = layout_permutation(att.layout, T, mp.context_degree, block=max(att.block_q, att.block_kv))
    return jnp.broadcast_to(jnp.asarray(perm, jnp.int32), (B, T))


# What attention() does not do, by the argument names other libraries use for it.
_NOT_SUPPORTED = {
    (
        "dropout_rate",
        "dropout",
        "dropout_p",
        "attn_dropout",
        "dropout_rng",
        "rng",
        "key",
        "deterministic",
        "inference",
    ): "attention dropout (none: apply dropout outside attention, or train without it)",
    ("scale", "softmax_scale", "sm_scale", "scaling"): "a softmax scale other than 1/sqrt(head_dim) (scale q instead)",
    ("logits_soft_cap", "attn_logits_soft_cap", "soft_cap", "softcap", "logit_cap"): "logit soft-capping",
    ("bias", "attn_bias", "alibi_slopes", "mask_bias"): (
        "additive attention biases (visibility is mask=Mask(...) on positions and segment ids)"
    ),
    ("causal", "is_causal", "window", "window_size", "sliding_window", "document"): (
        "mask options as arguments (they are fields of mask=Mask(causal=..., document=..., window=...))"
    ),
    ("cache", "kv_cache", "decode", "cache_index"): "KV caches / decoding (training-time self-attention only)",
}


def _unsupported_message(unsupported) -> str:
    names = sorted(unsupported)
    why = []
    for name in names:
        for aliases, what in _NOT_SUPPORTED.items():
            if name in aliases:
                why.append(
                    f"{name}=: lcx attention has no {what}" if "mask options" not in what else f"{name}=: {what}"
                )
                break
        else:
            why.append(f"{name}=: not an argument of attention()")
    return (
        "attention() got unsupported argument(s) " + ", ".join(names) + ". " + "; ".join(why) + ". attention() does "
        "not do attention dropout, custom softmax scales, logit soft-capping, additive biases, cross-attention or KV "
        "caches; see its docstring for what it takes"
    )


def _check_shapes(q: Array, k: Array, v: Array) -> None:
    if q.ndim != 4 or k.ndim != 4:
        raise ValueError(f"attention: q and k must be [batch, seq, heads, head_dim], got {q.shape} and {k.shape}")
    if k.shape != v.shape:
        raise ValueError(f"attention: k {k.shape} and v {v.shape} must have the same shape")
    if (k.shape[0], k.shape[1], k.shape[3]) != (q.shape[0], q.shape[1], q.shape[3]):
        raise ValueError(
            f"attention: k/v {k.shape} must match q {q.shape} in batch, sequence and head_dim (self-attention)"
        )
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"attention: query heads {q.shape[2]} must be a multiple of kv heads {k.shape[2]} (GQA)")


def _default(x: ArrayLike | None, make: Callable[[], Array], shape: tuple[int, int], name: str) -> Int[Array, "B T"]:
    """``x`` (``make()`` if None) as int32 ``[B, T]``.

    Raises:
      ValueError: another shape, or not an integer dtype.
    """
    x = make() if x is None else jnp.asarray(x)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"attention: {name} must have shape [batch, seq] = {shape}, got {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"attention: {name} must be integer (int32), got {x.dtype}")
    return x.astype(jnp.int32)
