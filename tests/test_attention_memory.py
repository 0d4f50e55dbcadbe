"""Per-device memory of attention inside a scan over layers.

A model calls attention inside ``lax.scan`` over its layers, where positions and segment ids are
loop-invariant. Unless attention ties them to the layer's queries, JAX's scan linearization
hoists everything derived from positions alone -- the mask tile of every (query block, key
block) pair of every ring step -- out of the loop as a saved residual: O(S^2 / P) bytes per
device (lcx.attention.api._tie_masks_to_queries). These tests compile (nothing runs) the
gradient of one attention layer and of a two-layer scan and require the scan to cost less
than two layers' worth of temporaries; with the hoisting it cost 5.5-7.6x one layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from lcx.attention import attention
from lcx.attention.masks import Mask
from lcx.sharding import bind
from lcx.sharding.config import preset as plan_preset

# compiled-memory checks of the layer scan: long to compile: the floor stack (-m 'not slow') skips them
pytestmark = pytest.mark.slow

S, B, N, K, H, BLOCK = 4096, 1, 4, 1, 32, 128


def _temp_bytes(fn, *args) -> int:
    return jax.jit(jax.grad(fn, (0, 1, 2))).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_scan_over_layers_does_not_save_mask_tiles(strategy):
    plan = plan_preset(strategy).with_mesh(data=1, context=8).with_attention(block_q=BLOCK, block_kv=BLOCK)
    mp = bind(plan, jax.devices()[:8])
    mask = Mask(causal=True, document=True)
    q = jax.ShapeDtypeStruct((B, S, N, H), jnp.float32)
    kv = jax.ShapeDtypeStruct((B, S, K, H), jnp.float32)
    ids = jax.ShapeDtypeStruct((B, S), jnp.int32)

    def one(q, k, v, pos, seg):
        return jnp.sum(attention(q, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg) ** 2)

    def two(q, k, v, pos, seg):
        def layer(x, _):
            return attention(x, k, v, plan=mp, mask=mask, positions=pos, segment_ids=seg), None

        y, _ = lax.scan(layer, q, None, length=2)
        return jnp.sum(y**2)

    t1 = _temp_bytes(one, q, kv, kv, ids, ids)
    t2 = _temp_bytes(two, q, kv, kv, ids, ids)
    # the full mask stack alone would be (P - 1) * (T / 128)^2 tiles of 64 KiB: 7 MiB here
    assert t2 < 2 * t1, (
        f"{strategy}: two scanned layers need {t2 / 2**20:.1f} MiB of temporaries, one needs {t1 / 2**20:.1f}"
    )
