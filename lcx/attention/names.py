"""Names attention gives its saved values, for ``jax.checkpoint`` policies.

The flash-attention forward keeps the float32 output ``[B, T, N, H]`` and the logsumexp
``[B, T, N]`` for its backward (:mod:`lcx.attention.flash`, :mod:`lcx.attention.strategies.ring`).
Both are tagged :data:`CONTEXT` (``jax.ad_checkpoint.checkpoint_name``) inside the custom VJP's
forward, which JAX traces inline when it differentiates, so a policy that names ``"context"``
(e.g. ``jax.checkpoint_policies.save_and_offload_only_these_names``) keeps them on device or in
host memory and the backward never replays the attention forward (nor a ring's K/V hops). This is
what MaxText's ``context`` placement keeps: the splash kernel's ``residual_checkpoint_name``. The
tag is the identity outside ``jax.checkpoint``.
"""

from __future__ import annotations

from jax.ad_checkpoint import checkpoint_name
from jaxtyping import Array, Float

CONTEXT = "context"
"""Checkpoint name of the flash-attention residuals (output and logsumexp)."""


def name_context(
    out: Float[Array, "B T N H"], lse: Float[Array, "B T N"]
) -> tuple[Float[Array, "B T N H"], Float[Array, "B T N"]]:
    """``(out, lse)`` tagged :data:`CONTEXT`; values unchanged."""
    return checkpoint_name(out, CONTEXT), checkpoint_name(lse, CONTEXT)
