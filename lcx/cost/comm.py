"""Communication per training step, per strategy, and the ring overlap condition.

Bytes are what ONE device sends (= receives, for these symmetric collectives) in one training
step, summed over layers. Ring all-gather / reduce-scatter / all-to-all over ``P`` devices move
``(P - 1) / P`` of the gathered size per device (Thakur, Rabenseifner & Gropp 2005, "Optimization
of collective communication operations in MPICH"); a ring hop moves one K/V block.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Unpack

from lcx.attention.strategies import Traffic
from lcx.cost.breakdown import param_bytes_per_device
from lcx.cost.flops import ModelDims
from lcx.cost.local import LocalStep, StepArgs, StepSizes
from lcx.cost.policy import ActivationPolicy
from lcx.sharding import Plan


@dataclasses.dataclass(frozen=True)
class CommBytes(Traffic):
    """Bytes one device sends in one training step, by pattern: the strategy's own collectives
    (the :class:`~lcx.attention.strategies.pricing.Traffic` fields: ``all_gather`` for the
    allgather strategy's K/V, ``all_to_all`` for Ulysses' (a2a, usp), ``ring`` for the K/V and
    dK/dV hops (ring, usp; overlappable with attention compute), ``ring_hops`` and
    ``ring_hop_bytes``) and the parameters'.

    Attributes:
      param_gather: parameter all-gathers of sharded (FSDP / ZeRO-3) parameters, forward and
        backward.
      grad_reduction: gradient all-reduce / reduce-scatter over the replicated axes.
    """

    param_gather: float = 0.0
    grad_reduction: float = 0.0

    @property
    def total(self) -> float:
        return self.all_gather + self.param_gather + self.all_to_all + self.ring + self.grad_reduction

    def as_dict(self) -> dict[str, float]:
        """The fields by name, collectives first in the order of :attr:`total`, then the hops."""
        return {k: getattr(self, k) for k in COMM_FIELDS}


COMM_FIELDS = ("all_gather", "param_gather", "all_to_all", "ring", "grad_reduction", "ring_hops", "ring_hop_bytes")
"""The order :meth:`CommBytes.as_dict` lists its fields in (reports and ``plan.json``)."""


def ring_overlap_min_block(
    peak_flops: float,
    link_bandwidth: float,
    *,
    n_heads: int = 1,
    n_kv_heads: int | None = None,
    bytes_per_element: int = 2,
    causal: bool = False,
) -> float:
    """Smallest K/V block c (tokens per device) for which a ring hop hides behind compute.

    One hop: the device computes its c queries against a c-token K/V block, ``4 c^2 N H`` FLOPs
    (halved on average when causal and zigzag-balanced), while sending the next block,
    ``2 c K H bytes`` bytes. Compute time >= transfer time gives
    ``c >= (F / B) * (2 K bytes) / (4 N) = (F / B) * K bytes / (2 N)`` — ``c >= F / B`` for
    multi-head attention in 16-bit, and the GQA factor ``K / N`` shrinks it (Liu et al. 2023,
    arXiv:2310.01889, section 3).

    Args:
      peak_flops: F, FLOP/s per device.
      link_bandwidth: B, bytes/s per device over the ring link (one way).
      n_heads: N query heads; n_kv_heads: K kv heads (default N: no GQA).
      bytes_per_element: K/V element size (2 for bf16/fp16).
      causal: credit only half the pairs of a hop (zigzag-balanced causal ring).

    Returns:
      c in tokens (a float; round up for a block size).
    """
    K = n_heads if n_kv_heads is None else n_kv_heads
    c = peak_flops / link_bandwidth * K * bytes_per_element / (2 * n_heads)
    return c * (2 if causal else 1)


def attention_replays(policy: ActivationPolicy) -> int:
    """1 when ``policy`` replays attention's forward in the backward (its collectives too), else 0."""
    return (
        1
        if (
            policy.remat in ("full", "dots_with_no_batch_dims_saveable")
            or (policy.remat == "custom" and not policy.keeps_context)
        )
        else 0
    )


def kind_traffic(local: LocalStep, policy: ActivationPolicy) -> tuple[Traffic, ...]:
    """Bytes one device sends per step for each layer kind of ``local`` (:attr:`LocalStep.kinds`,
    in order): the kind's strategy's :meth:`~lcx.attention.strategies.AbstractStrategy.traffic`
    over that kind's layers."""
    replay = attention_replays(policy)
    return tuple(k.strategy.traffic(k.attention, layers=k.layers, replay=replay) for k in local.kinds)


def total_traffic(parts: tuple[Traffic, ...]) -> Traffic:
    """The layer kinds' traffic together: bytes and hops summed, the largest forward hop kept."""
    if len(parts) == 1:
        return parts[0]
    return Traffic(
        all_gather=sum(t.all_gather for t in parts),
        all_to_all=sum(t.all_to_all for t in parts),
        ring=sum(t.ring for t in parts),
        ring_hops=sum(t.ring_hops for t in parts),
        ring_hop_bytes=max(t.ring_hop_bytes for t in parts),
    )


def comm_bytes(
    cfg: ModelDims,
    plan: Plan,
    n_devices: int,
    *,
    policy: ActivationPolicy,
    window: int | None = None,
    **step: Unpack[StepArgs],
) -> CommBytes:
    """Bytes one device sends per training step under ``plan`` (forward, backward, recompute).

    Per attention layer, with ``T = S / P``, ``b`` local sequences, ``a`` activation bytes, K/V
    at their own head count (never repeated, except Ulysses' replication up to U), as the plan's
    strategy class prices it (:meth:`~lcx.attention.strategies.AbstractStrategy.traffic`):

    - allgather: forward gathers K and V, ``2 b S K H a (P-1)/P``; backward reduce-scatters dK,
      dV (same size); a policy that replays attention gathers again.
    - a2a: q, k, v in and the output back, ``b T (2N + 2Kr) H a (U-1)/U``; the backward moves the
      same again; a replay adds a forward.
    - ring: ``P - 1`` forward hops of ``2 b T K H a``; backward ``P - 1`` K/V hops plus ``P`` hops
      of float32 dK/dV accumulators (``lcx.attention.strategies.ring``); a replay adds a forward.
    - usp: the a2a terms over U, and a ring of ``R = P / U`` on blocks of ``U T`` tokens of
      ``Kr / U`` heads.

    A model of several layer kinds (``layer_kinds``, or ``window`` for a uniform one) is priced
    per kind by the strategy the plan gives it, over that kind's layers, and summed
    (:func:`kind_traffic`).

    Gradients are reduced over every mesh axis the parameters are not sharded over (a ring
    all-reduce moves ``2 (n-1)/n`` of the local gradient bytes); parameters sharded over axes
    (FSDP/ZeRO-3) are all-gathered for the forward and again for the backward and their
    gradients reduce-scattered.

    Args:
      cfg: model dimensions.
      plan: the sharding plan.
      n_devices: devices of the step.
      policy: the activation policy (whether attention is replayed).
      window: a uniform model's sliding window in tokens (:func:`~lcx.cost.kinds.layer_groups`).
      **step: the step's sizes and dtypes (:class:`~lcx.cost.local.StepArgs`).

    Raises:
      PlanError: the plan's mesh does not fit ``n_devices``, or gives a kind no strategy.
    """
    st = StepSizes(**step)
    local = LocalStep.of(cfg, plan, n_devices, st, window=window)
    shape = local.shape
    # each kind's strategy's own collectives (:meth:`AbstractStrategy.traffic`; none at P = 1)
    att = total_traffic(kind_traffic(local, policy))
    # parameters: sharded axes -> all-gather (fwd + bwd) and reduce-scatter; replicated -> all-reduce
    p_local = param_bytes_per_device(plan, n_devices, cfg, st.param_dtype, tie_embeddings=st.tie_embeddings)
    sharded = {m for rule in plan.param_rules.values() for m in rule}
    n_shard = math.prod(shape[m] for m in sharded) if sharded else 1
    n_repl = n_devices // n_shard
    grad = pg = 0.0
    if n_shard > 1:
        full = p_local * n_shard
        pg += 2 * full * (n_shard - 1) / n_shard
        grad += full * (n_shard - 1) / n_shard
    if n_repl > 1:
        grad += 2 * p_local * (n_repl - 1) / n_repl
    return CommBytes(**dataclasses.asdict(att), param_gather=pg, grad_reduction=grad)
