"""Next-token cross-entropy as a global sum over valid tokens.

The loss of a step is ``sum of token losses over valid tokens / global number of valid tokens``
(not a mean of per-device or per-sequence means), so it does not depend on how the batch and the
sequence are split, nor on the sequence layout (a sum is order-free; nothing un-permutes zigzag).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

__all__ = ["VocabTiles", "loss_sum_and_count", "token_nll", "vocab_tiled_loss_sum_and_count", "vocab_tiled_predictions"]


def token_nll(logits: Float[Array, "*b V"], targets: Int[Array, "*b"]) -> Float[Array, "*b"]:
    """Negative log-likelihood in nats of each target token (any leading axes), computed in float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def loss_sum_and_count(
    logits: Float[Array, "B T V"], targets: Int[Array, "B T"], loss_mask: Float[Array, "B T"]
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """``(sum of masked token NLL in nats, number of valid tokens)``, both float32 scalars."""
    m = loss_mask.astype(jnp.float32)
    return jnp.sum(token_nll(logits, targets) * m), jnp.sum(m)


@dataclasses.dataclass(frozen=True)
class VocabTiles:
    """How the vocabulary-tiled functions cut each device's local sequence.

    Attributes:
      tiles: number of tiles N (1: one tile, the whole local sequence).
      seq_shards: devices the sequence axis is split over (the context degree P).
      constrain: ``(array, logical_axes) -> array`` sharding constraint
        (:meth:`lcx.sharding.MeshPlan.constrain`); None: no constraint.
    """

    tiles: int
    seq_shards: int = 1
    constrain: Callable[[Array, tuple[str | None, ...]], Array] | None = None

    def pin(self, x: Array, logical_axes: tuple[str | None, ...]) -> Array:
        """``x`` constrained to ``logical_axes`` (unchanged without ``constrain``)."""
        return x if self.constrain is None else self.constrain(x, logical_axes)


def vocab_tiled_loss_sum_and_count(
    h: Float[Array, "B S D"],
    head: Float[Array, "D V"],
    targets: Int[Array, "B S"],
    loss_mask: Float[Array, "B S"],
    tiling: VocabTiles,
) -> tuple[Float[Array, ""], Float[Array, ""]]:
    """:func:`loss_sum_and_count` of ``h @ head`` without ever forming the logits ``[B, S, V]``.

    Vocabulary tiling (MaxText ``num_vocab_tiling``; "chunked" or "fused" cross-entropy in
    torchtitan and Liger-Kernel, arXiv:2410.10989): each device's local sequence of ``T = S /
    seq_shards`` tokens is cut into ``tiles`` tiles of ``T / tiles`` tokens; a ``jax.lax.scan``
    over the tiles computes one tile's float32 logits ``[B, seq_shards, T / tiles, V]``, its
    log-softmax and token NLL and reduces them to ``(loss sum, count)`` before the next tile.
    The scan body is ``jax.checkpoint``-ed with nothing saved, so the backward recomputes each
    tile's logits, forms softmax minus one-hot and accumulates ``d head`` (the scan's constant
    cotangent) and the tile's ``d h`` one tile at a time. Peak logits memory falls from
    ``B T V`` to ``B T V / tiles`` floats per device; the head matmul is done twice (forward and
    backward replay).

    The split keeps the sequence sharding: ``S`` is viewed as ``[seq_shards, T]`` (the shard
    index major, as the sequence axis is sharded) and each tile takes ``T / tiles`` tokens of
    every shard, so no tile moves data between devices. The sum is order-free, so any layout
    (contiguous, zigzag, balanced) gives the untiled result up to float32 summation order.

    Args:
      h: ``[B, S, D]`` final-norm output in the compute dtype.
      head: ``[D, V]`` output projection in the compute dtype.
      targets: int ``[B, S]`` next-token ids.
      loss_mask: ``[B, S]``, 1 for tokens in the loss.
      tiling: the tiles, the sequence shards and the sharding constraint.

    Returns:
      ``(sum of masked token NLL in nats, number of valid tokens)``, float32 scalars.

    Raises:
      ValueError: ``S`` not divisible by ``seq_shards * tiles``.
    """
    tile, _ = _tiler(h.shape[:2], tiling)
    pin = tiling.pin
    hs = pin(tile(h), (None, "batch", "seq", None, "embed"))
    ys = pin(tile(targets), (None, "batch", "seq", None))
    ms = pin(tile(loss_mask.astype(jnp.float32)), (None, "batch", "seq", None))

    @jax.checkpoint  # nothing saved: the backward replays the tile's logits from h and head
    def tile_loss(h_t: Array, y_t: Array, m_t: Array) -> tuple[Array, Array]:
        logits = jnp.einsum("BPtD,DV->BPtV", h_t, head, preferred_element_type=jnp.float32)
        logits = pin(logits, ("batch", "seq", None, "vocab"))
        return jnp.sum(token_nll(logits, y_t) * m_t), jnp.sum(m_t)

    def body(carry, xs):
        s, c = tile_loss(*xs)
        return (carry[0] + s, carry[1] + c), None

    zero = jnp.zeros((), jnp.float32)
    (s, c), _ = jax.lax.scan(body, (zero, zero), (hs, ys, ms))
    return s, c


def vocab_tiled_predictions(
    h: Float[Array, "B S D"],
    head: Float[Array, "D V"],
    targets: Int[Array, "B S"],
    tiling: VocabTiles,
) -> tuple[Int[Array, "B S"], Float[Array, "B S"]]:
    """Per-token ``(argmax of the logits, NLL of the target in nats)`` of ``h @ head``, one tile
    of the local sequence at a time (the tiles of :func:`vocab_tiled_loss_sum_and_count`), for
    evaluations that need more than the loss sum (passkey retrieval). No gradient.

    Returns:
      int32 ``[B, S]`` predictions and float32 ``[B, S]`` NLL, in the order of ``h``.

    Raises:
      ValueError: ``S`` not divisible by ``seq_shards * tiles``.
    """
    tile, untile = _tiler(h.shape[:2], tiling)
    pin = tiling.pin

    def one(xs):
        h_t, y_t = xs
        logits = pin(
            jnp.einsum("BPtD,DV->BPtV", h_t, head, preferred_element_type=jnp.float32), ("batch", "seq", None, "vocab")
        )
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), token_nll(logits, y_t)

    pred, nll = jax.lax.map(
        one, (pin(tile(h), (None, "batch", "seq", None, "embed")), pin(tile(targets), (None, "batch", "seq", None)))
    )
    return untile(pred), untile(nll)


def _tiler(bs: tuple[int, ...], tiling: VocabTiles) -> tuple[Callable[[Array], Array], Callable[[Array], Array]]:
    """``(tile, untile)``: ``[B, S, ...] <-> [N, B, P, t, ...]`` where tile ``j`` holds tokens
    ``[j t, (j + 1) t)`` of every one of the ``P`` sequence shards (``S = P N t``, the shard index
    major as the sequence axis is sharded), so tiling moves no data between devices."""
    B, S = bs
    P, n = tiling.seq_shards, tiling.tiles
    if S % (P * n):
        raise ValueError(
            f"vocabulary tiling: the sequence of {S} tokens over {P} shards does not split into {n} "
            f"tiles (S / P = {S / P:g} tokens per shard, not a multiple of {n})"
        )
    t = S // (P * n)

    def tile(x: Array) -> Array:
        return jnp.moveaxis(x.reshape(B, P, n, t, *x.shape[2:]), 2, 0)

    def untile(x: Array) -> Array:
        return jnp.moveaxis(x, 0, 2).reshape(B, S, *x.shape[4:])

    return tile, untile
