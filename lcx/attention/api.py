"""The public context-parallel attention function. (Interim: strategies land in lcx/attention/strategies.)"""

from __future__ import annotations

import jax
from jaxtyping import Array, Float, Int

from lcx.attention.masks import Mask
from lcx.attention.reference import reference_attention
from lcx.sharding import MeshPlan, Plan, bind


def attention(
    q: Float[Array, "B T N H"],
    k: Float[Array, "B T K H"],
    v: Float[Array, "B T K H"],
    *,
    plan: Plan | MeshPlan,
    mask: Mask,
    positions: Int[Array, "B T"] | None = None,
    segment_ids: Int[Array, "B T"] | None = None,
) -> Float[Array, "B T N H"]:
    """Context-parallel attention on global arrays (interim implementation: no sequence axes only)."""
    mp = plan if isinstance(plan, MeshPlan) else bind(plan)
    if mp.plan.seq_axes:
        raise NotImplementedError("context-parallel strategies are being built (issue 4)")
    return reference_attention(q, k, v, mask=mask, positions=positions, segment_ids=segment_ids)
