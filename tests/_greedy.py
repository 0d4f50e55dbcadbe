"""A plain single-device greedy decoder for the evals tests (``lcx.evals.GenerateFn``'s
signature): each step runs the whole forward pass over the prompt and what was generated so far,
and takes the argmax of the last position. Slow and simple on purpose: the reference
``lcx.generate.generate`` is compared against, and a stand-in until it is merged."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from lcx.sharding import Plan, bind

ONE = Plan(mesh=(("data", -1),), activations={"batch": "data"})

CALLS: list[tuple[int, int]] = []
"""``(rows, max_new_tokens)`` of every call, for tests that check the runner's batching."""


@functools.cache
def _one_device():
    return bind(ONE, jax.devices()[:1])


@eqx.filter_jit
def _next(model, tokens, last):
    T = tokens.shape[1]
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tokens.shape)
    # causal: the padding after `last` is never seen by it
    logits = model(tokens, pos, jnp.ones_like(tokens), plan=_one_device())
    return jnp.argmax(logits[jnp.arange(tokens.shape[0]), last], axis=-1).astype(jnp.int32)


def greedy(model, prompts, *, plan, max_new_tokens, temperature=0.0, top_p=1.0, key=None):
    """int32 ``[len(prompts), max_new_tokens]``: greedy continuations, on the first device."""
    assert temperature == 0.0, "the test decoder is greedy only"
    CALLS.append((len(prompts), int(max_new_tokens)))
    dev = jax.devices()[0]
    m = jax.device_put(model, dev)
    lens = np.array([p.size for p in prompts])
    T = -(-(lens.max() + max_new_tokens) // 8) * 8
    buf = np.zeros((len(prompts), T), np.int32)
    for i, p in enumerate(prompts):
        buf[i, : p.size] = p
    out = np.zeros((len(prompts), max_new_tokens), np.int32)
    for j in range(max_new_tokens):
        nxt = np.asarray(_next(m, jax.device_put(jnp.asarray(buf), dev), jnp.asarray(lens + j - 1)))
        out[:, j] = nxt
        buf[np.arange(len(prompts)), lens + j] = nxt
    return out
