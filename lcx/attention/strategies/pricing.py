"""Values a strategy's pricing methods take and return (pure data, no JAX).

The cost ledger (:mod:`lcx.cost`) builds an :class:`AttentionShard` from a model config and a
plan and asks the plan's strategy class for its price; the strategy answers with plain integers
and these small frozen values, so the ledger never branches on a strategy's name.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class AttentionShard:
    """One attention layer as one device of a context-parallel plan sees it.

    Attributes:
      local_batch: b, sequences per device.
      seq_len: S, tokens per sequence (global).
      context_degree: P, devices the sequence is split over.
      ulysses_degree: U, the all-to-all degree of a strategy that puts only part of P on one
        (USP's ``ulysses_axis``); 1 otherwise (A2A's all-to-all spans P and reads P).
      heads: N, query heads per device (after tensor parallelism).
      kv_heads: K, kv heads per device (at least 1).
      head_dim: H.
      act_bytes: a, bytes per activation element (2 for bfloat16).
      window: the layer's sliding window in tokens (None: none). Read only by strategies that
        price a layer kind differently (``halo``); the defaults describe today's global layer.
      chunk: the layer's attention chunk in tokens (None: none), likewise.
      documents: packed documents whose positions restart (a chunked layer's grid then moves
        with each document); True, the conservative default.
      layout: ``plan.attention.layout`` (``halo`` reads which tokens each device holds).
      layout_block: the balanced layout's block, ``max(block_q, block_kv)`` in tokens.
    """

    local_batch: int
    seq_len: int
    context_degree: int
    ulysses_degree: int
    heads: int
    kv_heads: int
    head_dim: int
    act_bytes: int
    window: int | None = None
    chunk: int | None = None
    documents: bool = True
    layout: str = "zigzag"
    layout_block: int = 512

    @classmethod
    def from_model(
        cls,
        cfg: Any,
        *,
        seq_len: int,
        local_batch: int,
        context_degree: int,
        ulysses_degree: int = 1,
        tensor_degree: int = 1,
        act_bytes: int = 2,
    ) -> AttentionShard:
        """From a model config (``n_heads``, ``n_kv_heads``, ``head_dim``): heads split over the
        tensor degree, kv heads at least one per device."""
        return cls(
            local_batch=local_batch,
            seq_len=seq_len,
            context_degree=context_degree,
            ulysses_degree=ulysses_degree,
            heads=cfg.n_heads // tensor_degree,
            kv_heads=max(1, cfg.n_kv_heads // tensor_degree),
            head_dim=cfg.head_dim,
            act_bytes=act_bytes,
        )

    @property
    def local_len(self) -> int:
        """T = S / P, tokens per device."""
        return self.seq_len // self.context_degree


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes one device sends in one training step, by collective (see :class:`lcx.cost.CommBytes`).

    Attributes:
      all_gather: K/V all-gathers.
      all_to_all: Ulysses all-to-alls.
      ring: K/V (and dK/dV) ring hops.
      ring_hops: ring hops per step.
      ring_hop_bytes: bytes of one forward K/V hop.
    """

    all_gather: float = 0.0
    all_to_all: float = 0.0
    ring: float = 0.0
    ring_hops: int = 0
    ring_hop_bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class RingHop:
    """A ring hop the ledger checks for overlap with compute: ``block`` K/V tokens of
    ``n_kv_heads`` kv heads per hop, against the compute of ``n_heads`` query heads."""

    block: int
    n_heads: int
    n_kv_heads: int


@dataclasses.dataclass(frozen=True)
class SearchMesh:
    """A mesh the planner tries for a strategy.

    Attributes:
      mesh: ``((axis, size), ...)`` major to minor.
      seq: the ``seq`` activation rule (mesh axis or axes).
      attention: ``plan.attention`` fields the mesh needs (USP: its two axes).
      name: the plan's name in tables.
    """

    mesh: tuple[tuple[str, int], ...]
    seq: str | tuple[str, ...]
    attention: tuple[tuple[str, Any], ...] = ()
    name: str = ""
