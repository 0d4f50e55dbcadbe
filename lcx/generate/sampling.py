"""Next-token sampling: greedy, temperature, nucleus (top-p), seeded.

Nucleus sampling: Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration",
arXiv:1904.09751 -- sample from the smallest set of most probable tokens whose probability
reaches ``top_p``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray


def check_sampling(temperature: float, top_p: float, key: PRNGKeyArray | None) -> None:
    """Refuse sampling settings before anything compiles.

    Raises:
      ValueError: ``temperature < 0``; ``top_p`` outside ``(0, 1]``; ``temperature > 0`` without
        a ``key`` (sampling is seeded: pass ``key=jax.random.key(seed)``).
    """
    if not temperature >= 0:
        raise ValueError(f"generate: temperature={temperature} must be >= 0 (0: greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p={top_p} must be in (0, 1] (1: no nucleus cut)")
    if temperature > 0 and key is None:
        raise ValueError(
            f"generate: temperature={temperature} samples, which needs key=jax.random.key(seed); "
            "or use temperature=0.0 for greedy decoding"
        )


def sample(
    logits: Float[Array, "B V"], key: PRNGKeyArray | None, *, temperature: float, top_p: float
) -> Int[Array, " B"]:
    """int32 ``[B]`` next tokens from float32 logits ``[B, V]``.

    ``temperature == 0``: the argmax (greedy; the lowest id on a tie). Otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the nucleus: the most probable tokens whose
    cumulative probability, before each, is below ``top_p`` (the most probable token always
    stays). ``temperature`` and ``top_p`` are static Python floats.
    """
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    assert key is not None  # check_sampling refused it earlier
    scaled = logits / jnp.float32(temperature)
    if top_p < 1:
        order = jnp.argsort(-scaled, axis=-1)
        probs = jax.nn.softmax(jnp.take_along_axis(scaled, order, axis=-1), axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs
        cut = jnp.where(before < jnp.float32(top_p), 0.0, -jnp.inf)
        keep = jnp.zeros_like(scaled).at[jnp.arange(scaled.shape[0])[:, None], order].set(cut)
        scaled = scaled + keep
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)


__all__ = ["check_sampling", "sample"]
