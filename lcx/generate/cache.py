"""The KV cache of context-parallel decoding: its geometry, its slot rules and its size.

A cache is model-independent: per cache group, K and V ``[L_g, B, S_g, K, H]`` (the L_g layers
of the group, batch, slots, kv heads, head dim) with the global position and segment id of the
token each slot holds, ``[B, S_g]`` (segment id ``-1``: an empty slot, which no query sees,
:mod:`lcx.attention.masks`). The slot axis is sharded over the plan's context axes exactly as the
sequence is in training: device ``d`` of the ``P`` context devices holds slots
``[d S_g / P, (d + 1) S_g / P)``.

Two groups (:class:`CacheGroup`), by what a layer kind can still see:

- **global** layers keep every key. The prefill's K/V stay where the prefill computed them (the
  plan's layout: contiguous, zigzag or balanced; nothing moves), and each device's shard is
  followed by ``A = ceil(max_new_tokens / P)`` empty slots. **Append rule**: the token fed at
  decode step ``i`` (0, 1, ...) goes to device ``i mod P``, local slot ``T / P + i // P``
  (round robin), so after any step the devices' token counts differ by at most one.
- **sliding** (window W) and **chunked** (chunk C) layers keep only the last ``span`` positions
  (``span = W``, resp. ``C``: a later query sees no older key), in a ring of ``R = P m`` slots,
  ``m = ceil(min(span, T + max_new_tokens) / P)``. **Slot rule**: position ``p`` lives on device
  ``p mod P``, local slot ``(p // P) mod m``; the ``R >= span`` most recent positions have
  distinct slots, and every device holds exactly ``m`` slots whatever the step. The prefill
  gathers the last ``R`` prompt keys of each row into their slots right after each layer (one
  cross-device gather per layer, done once; only one layer's whole prompt K/V is live at a time);
  a decode step overwrites position ``p - R``, which no query sees any more.

Every layer kind with the same ring size shares one group (their slots hold the same positions).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from lcx.cost import kv_cache_bytes_per_device
from lcx.models.kinds import LayerKind


class KVCache(eqx.Module):
    """One cache group's keys, values and the position / segment id of every slot.

    Attributes:
      k: ``[L_g, B, S_g, K, H]`` keys after RoPE, in the model's compute dtype.
      v: ``[L_g, B, S_g, K, H]`` values.
      pos: int32 ``[B, S_g]`` global position of the token in each slot.
      seg: int32 ``[B, S_g]`` its segment id: 0 for a token, ``-1`` for an empty slot or prompt
        padding (invisible to every query).
    """

    k: Float[Array, "L B S K H"]
    v: Float[Array, "L B S K H"]
    pos: Int[Array, "B S"]
    seg: Int[Array, "B S"]


@dataclasses.dataclass(frozen=True)
class CacheGroup:
    """The geometry of one cache group (module docstring).

    Attributes:
      span: None for global layers (every key); else the ring's reach in tokens (window or chunk).
      layers: indices of the decoder layers in this group, in order.
      local_slots: slots per device, ``S_g / P``.
      prompt_slots: global groups: the prefill's local slots ``T / P`` (the rest are appended);
        ring groups: 0.
    """

    span: int | None
    layers: tuple[int, ...]
    local_slots: int
    prompt_slots: int

    @property
    def is_ring(self) -> bool:
        return self.span is not None


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """Where every layer's K/V live during decoding: the groups, and which group and index each
    decoder layer has (a static, hashable value; :func:`cache_layout` builds it).

    Attributes:
      groups: the cache groups, global first.
      layer_slot: ``(group, index in group)`` per decoder layer.
      degree: context degree P.
      prompt_len: padded prompt length T in tokens (a multiple of the layout's chunks).
      max_new_tokens: tokens generated per row.
    """

    groups: tuple[CacheGroup, ...]
    layer_slot: tuple[tuple[int, int], ...]
    degree: int
    prompt_len: int
    max_new_tokens: int


def kind_span(kind: LayerKind) -> int | None:
    """The keys a later query of a layer of ``kind`` can still see: its window (sliding), its
    chunk (chunked), or None (global: all)."""
    return kind.window if kind.kind == "sliding" else kind.chunk if kind.kind == "chunked" else None


def cache_layout(kinds: Sequence[LayerKind], *, degree: int, prompt_len: int, max_new_tokens: int) -> CacheLayout:
    """The cache groups of a model whose layers have ``kinds`` (one per layer).

    Args:
      kinds: the layer kinds, one per decoder layer (``ModelConfig.layer_kinds``).
      degree: context degree P (devices the slots are split over).
      prompt_len: padded prompt length T in tokens, divisible by P.
      max_new_tokens: tokens generated per row (>= 1).

    Returns:
      The :class:`CacheLayout`.
    """
    P, T, n = degree, prompt_len, max_new_tokens
    by_size: dict[int | None, list[int]] = {}
    for i, kind in enumerate(kinds):
        span = kind_span(kind)
        key = None if span is None else math.ceil(min(span, T + n) / P)
        by_size.setdefault(key, []).append(i)
    keys = sorted(by_size, key=lambda k: -1 if k is None else k)
    groups, slot = [], [(0, 0)] * len(kinds)
    for g, key in enumerate(keys):
        layers = tuple(by_size[key])
        for j, layer in enumerate(layers):
            slot[layer] = (g, j)
        if key is None:
            groups.append(CacheGroup(None, layers, T // P + math.ceil(n / P), T // P))
        else:
            groups.append(CacheGroup(key * P, layers, key, 0))
    return CacheLayout(tuple(groups), tuple(slot), P, T, n)


def ring_sources(lengths: np.ndarray, inverse: np.ndarray, ring: int, degree: int) -> tuple[np.ndarray, ...]:
    """Where a ring group's slots come from after the prefill (host arithmetic, int32).

    Slot ``g`` (device ``d = g // m``, local ``j = g % m``, ``m = ring / P``) holds the positions
    ``p = d + P j (mod ring)``; after a prompt of ``n`` tokens, the newest such ``p < n``.

    Args:
      lengths: int ``[B]`` prompt lengths n (tokens).
      inverse: int ``[B, T]``: ``inverse[b, p]`` is where the laid-out prompt holds position p.
      ring: ring size R in slots (a multiple of P).
      degree: P.

    Returns:
      ``(index, pos, seg)``, each int32 ``[B, R]``: the laid-out index each slot gathers from (0
      for an empty slot), its position, its segment id (0, or ``-1`` for an empty slot).
    """
    m = ring // degree
    g = np.arange(ring)
    residue = (g // m) + degree * (g % m)  # the position class of each slot, mod R
    last = lengths[:, None] - 1 - residue[None, :]
    pos = residue[None, :] + ring * np.floor_divide(last, ring)
    ok = last >= 0
    pos = np.where(ok, pos, 0)
    index = np.take_along_axis(inverse, pos, axis=1)
    return (
        np.where(ok, index, 0).astype(np.int32),
        pos.astype(np.int32),
        np.where(ok, 0, -1).astype(np.int32),
    )


def write_slots(group: CacheGroup, step: Int[Array, ""], pos: Int[Array, " B"], degree: int):
    """The (device, local slot) that decode ``step``'s token of each row is written to.

    Global groups: the append rule, ``(step mod P, T / P + step // P)`` for every row; ring
    groups: the slot rule of the token's position ``pos``, ``(pos mod P, (pos // P) mod m)``.

    Returns:
      ``(owner, slot)``, int32 ``[B]`` each.
    """
    if group.is_ring:
        return pos % degree, (pos // degree) % group.local_slots
    owner = jnp.broadcast_to(step % degree, pos.shape)
    return owner, jnp.broadcast_to(group.prompt_slots + step // degree, pos.shape)


def cache_bytes_per_device(
    layout: CacheLayout, *, local_batch: int, kv_heads: int, head_dim: int, bytes_per_element: int
) -> int:
    """Bytes of the KV cache on one device (:func:`lcx.cost.kv_cache_bytes_per_device` of this
    layout's groups): K and V of every group, plus the int32 position and segment id of every slot.

    Args:
      layout: the cache geometry.
      local_batch: rows per device (batch / data degree).
      kv_heads: kv heads per device (K / tensor degree).
      head_dim: H.
      bytes_per_element: of K and V (the model's compute dtype; 4 for float32).
    """
    groups = [(len(g.layers), g.local_slots) for g in layout.groups]
    return kv_cache_bytes_per_device(
        groups, local_batch=local_batch, kv_heads=kv_heads, head_dim=head_dim, bytes_per_element=bytes_per_element
    )


__all__ = [
    "CacheGroup",
    "CacheLayout",
    "KVCache",
    "cache_bytes_per_device",
    "cache_layout",
    "kind_span",
    "ring_sources",
    "write_slots",
]
