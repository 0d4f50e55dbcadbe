"""Next-token cross-entropy as a global sum over valid tokens.

The loss of a step is ``sum of token losses over valid tokens / global number of valid tokens``
(not a mean of per-device or per-sequence means), so it does not depend on how the batch and the
sequence are split, nor on the sequence layout (a sum is order-free; nothing un-permutes zigzag).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int


def token_nll(logits: Float[Array, "B T V"], targets: Int[Array, "B T"]) -> Float[Array, "B T"]:
    """Negative log-likelihood in nats of each target token, computed in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def loss_sum_and_count(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], loss_mask: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """``(sum of masked token NLL in nats, number of valid tokens)``, both float32 scalars."""
    m = loss_mask.astype(jnp.float32)
    return jnp.sum(token_nll(logits, targets) * m), jnp.sum(m)
