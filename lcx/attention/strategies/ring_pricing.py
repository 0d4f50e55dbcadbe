"""Ring attention's arithmetic: how many kv heads one pass of the ring carries, and its price.

Pure integer arithmetic on shapes and dtypes (no arrays, no collectives), kept apart from the
program in :mod:`lcx.attention.strategies.ring` so that each file stays under the project's
~400-line limit (the design notes' "one room per concern"): the program stays there; the numbers
the program and the cost ledger must agree on (kv heads per pass, bytes in flight, ring hops)
live here. ring.py imports every name below, so ``lcx.attention.strategies.ring.heads_per_pass``
and the others keep working from there; USP prices its ring stage with the same functions.

This module is a helper of an existing strategy, not a strategy: it defines no class and
registers nothing. The final :class:`~lcx.attention.strategies.ring.Ring` in ring.py still
carries all of the ring's plan rules and price methods (they call these functions), so a new
strategy remains one file plus one line in :data:`lcx.attention.strategies.STRATEGIES`.
"""

from __future__ import annotations

import jax.numpy as jnp

from lcx.attention.strategies.pricing import Traffic

# per-pass K (or V) shard size above which the ring runs one kv head per pass
PASS_BYTES = 2**20


def heads_per_pass(kv_shape: tuple[int, ...], dtype, tile_bytes: int = 0) -> int:
    """Default kv heads per ring pass: all of them while one pass's working set -- the local K
    shard ``[B, T, K, H]`` plus the kernel's per-step tiles of all K heads (``tile_bytes`` per kv
    head, :meth:`~lcx.attention.kernels.AbstractKernel.step_tile_bytes`) -- is at most 1 MiB, else ONE
    (attention is independent per kv head and its query group).

    Per-device memory of a ring is a few K/V-sized buffers (the shard in use, the next one in
    flight, and in the backward the travelling dK/dV accumulators and their next hop) plus the
    kernel's tiles. Running the ring once per kv head divides all of those by K, so only the
    float32 output, dQ and the per-head tiles remain whole-shard sized: per-device memory then
    falls as 1/P with the ring size. The price is K times more (K times smaller) transfers,
    which hurts only where a hop's latency, not its bytes, dominates: small shards, which keep
    all heads in one pass -- unless the tiles are what is large (8 heads of 256 x 256 float32
    logits are 2 MiB each: at 4,096 tokens on 8 devices that made the ring's temp 14.6 MiB
    instead of 2.3, at the same speed on the CPU benchmark).
    """
    B, T, K, H = kv_shape
    return K if B * T * K * H * jnp.dtype(dtype).itemsize + K * tile_bytes <= PASS_BYTES else 1


def ring_passes(kvh, q, k):
    """(number of passes, q heads per pass, kv heads per pass)."""
    K = k.shape[2]
    return K // kvh, q.shape[2] // K * kvh, kvh


def ring_buffer_bytes(b: int, length: int, kv_heads: int, head_dim: int, act_bytes: int, *, backward: bool) -> int:
    """Bytes a ring keeps in flight on one device: the next K/V block (``length`` tokens of
    ``kv_heads`` heads) with its positions and segment ids, and in the ``backward`` the next hop
    of the float32 dK/dV accumulators."""
    grads = 2 * b * length * kv_heads * head_dim * 4 if backward else 0
    return 2 * b * length * kv_heads * head_dim * act_bytes + 2 * b * length * 4 + grads


def ring_traffic(
    b: int, block: int, kv_heads: int, head_dim: int, act_bytes: int, size: int, *, layers: int, replay: int
) -> Traffic:
    """Ring hops of a ring of ``size`` devices on blocks of ``block`` tokens: ``size - 1``
    forward K/V hops (again for a replay), ``size - 1`` in the backward plus ``size`` hops of
    float32 dK/dV accumulators (:func:`~lcx.attention.strategies.ring._backward`)."""
    hop_bytes = 2 * b * block * kv_heads * head_dim * act_bytes
    hops = layers * ((size - 1) * (1 + replay) + (size - 1) + size)
    ring = layers * (hop_bytes * (size - 1) * (2 + replay) + size * hop_bytes * 4 / act_bytes)
    return Traffic(ring=ring, ring_hops=hops, ring_hop_bytes=hop_bytes)
