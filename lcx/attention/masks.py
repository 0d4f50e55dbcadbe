"""Attention masks as predicates on global positions and segment ids.

Every mask lcx supports is a function of ``(q_pos, k_pos, q_seg, k_seg)`` only, so one kernel
path serves every sequence layout (contiguous, zigzag, balanced) and every context-parallel strategy: the
positions and segment ids travel with their tokens (and, in ring steps, with K/V).

**Padding.** A NEGATIVE segment id marks a padding token, whatever the mask: it sees no key and
no query sees it (every predicate below is False for a pair with a negative id on either side,
with or without ``document``). Its attention output is 0, its gradients are 0 and its logsumexp
is ``-inf``, and blocks or ring steps made only of padding are skipped like any hidden block
(:meth:`Mask.may_be_visible` is False for them). ``lcx.data`` marks padding with ``-1``.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Int

QPos = Int[ArrayLike, "*b t"]
"""int32 global positions or segment ids of the queries ``[..., t]`` (any array-like)."""
KPos = Int[ArrayLike, "*b s"]
"""int32 global positions or segment ids of the keys ``[..., s]`` (any array-like)."""


class _Ids(NamedTuple):
    """One side's positions and segment ids as jax arrays (None: no segment ids)."""

    pos: Array
    seg: Array | None


def _block(pos: ArrayLike, seg: ArrayLike | None) -> _Ids:
    return _Ids(jnp.asarray(pos), None if seg is None else jnp.asarray(seg))


@dataclasses.dataclass(frozen=True)
class Mask:
    """Which keys a query may attend to.

    Attributes:
      causal: key visible only if ``k_pos <= q_pos``.
      document: key visible only if ``k_seg == q_seg`` (packed sequences; segment ids).
      window: sliding window in tokens: key visible only if ``q_pos - k_pos < window`` (and, when
        not causal, also ``k_pos - q_pos < window``). ``None`` means no window.
      chunk: chunked attention in tokens (Llama 4's local layers): key visible only if it lies in
        the same aligned chunk as the query, ``q_pos // chunk == k_pos // chunk``. ``None`` means
        no chunks. A mask has a window or chunks, not both.

    Whatever the fields, a pair whose query or key has a negative segment id (padding) is never
    visible (module docstring); without segment ids nothing is padding.

    ``Mask()`` is causal; ``Mask(causal=False)`` is full (bidirectional) attention.

    Raises:
      ValueError: ``window < 1``, ``chunk < 1``, or both a window and chunks.
    """

    causal: bool = True
    document: bool = False
    window: int | None = None
    chunk: int | None = None

    def __post_init__(self):
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be >= 1 token or None, got {self.window}")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"attention chunk must be >= 1 token or None, got {self.chunk}")
        if self.window is not None and self.chunk is not None:
            raise ValueError(
                f"a mask has a sliding window ({self.window}) or chunks ({self.chunk}), not both; "
                "set one of them to None"
            )

    @property
    def kind(self) -> str:
        """The layer kind this mask serves: ``"chunked"`` (chunks set), ``"sliding"`` (a window)
        or ``"global"`` (neither), the names a plan gives a strategy per kind by."""
        return "chunked" if self.chunk is not None else "sliding" if self.window is not None else "global"

    def visible(
        self, q_pos: QPos, k_pos: KPos, q_seg: QPos | None = None, k_seg: KPos | None = None
    ) -> Bool[Array, "*b t s"]:
        """Boolean ``[..., T, S]``: True where query t may attend to key s (False wherever
        ``q_seg`` or ``k_seg``, when given, is negative: padding)."""
        q, k = _block(q_pos, q_seg), _block(k_pos, k_seg)
        self._check_segments(q, k)
        qp, kp = q.pos[..., :, None], k.pos[..., None, :]
        ok = self._positions_pass(qp, qp, kp, kp)  # [..., T, S]: every pair on its own
        if q.seg is not None and k.seg is not None and self.document:
            ok = ok & (q.seg[..., :, None] == k.seg[..., None, :])
        if q.seg is not None:
            ok = ok & (q.seg[..., :, None] >= 0)
        if k.seg is not None:
            ok = ok & (k.seg[..., None, :] >= 0)
        return ok

    def may_be_visible(
        self, q_pos: QPos, k_pos: KPos, q_seg: QPos | None = None, k_seg: KPos | None = None
    ) -> Bool[Array, ""]:
        """Scalar bool: False only if NO query of the block may attend to any key of the block.

        A cheap, conservative block test used to skip work (kernel blocks, ring steps): it looks
        only at the minimum and maximum positions and segment ids of each batch row, O(t + s)
        instead of the O(t * s) of :meth:`visible`. Each condition below is necessary for a
        visible pair, so a False result is exact; a True result may still hide every pair (the
        block is then computed and masked element-wise, which is correct, only slower):

        - causal: some ``k_pos <= q_pos``  <=>  ``min(k_pos) <= max(q_pos)``;
        - window: some ``q_pos - k_pos < window``  <=>  ``min(q_pos) - max(k_pos) < window``
          (and, not causal, ``min(k_pos) - max(q_pos) < window``);
        - chunk: the ranges of chunk indices ``[min // chunk, max // chunk]`` overlap;
        - document: the ranges ``[min, max]`` of query and key segment ids overlap;
        - padding (any mask, when segment ids are given): some query and some key have a
          segment id ``>= 0``  <=>  ``max(q_seg) >= 0`` and ``max(k_seg) >= 0``.

        Args:
          q_pos: int32 global query positions ``[..., t]``.
          k_pos: int32 global key positions ``[..., s]``.
          q_seg: int32 query segment ids (required by a document mask).
          k_seg: int32 key segment ids (required by a document mask).

        Returns:
          bool ``[]``: True if any batch row may have a visible (query, key) pair.
        """
        q, k = _block(q_pos, q_seg), _block(k_pos, k_seg)
        self._check_segments(q, k)
        ok = self._positions_pass(q.pos.min(-1), q.pos.max(-1), k.pos.min(-1), k.pos.max(-1))
        if q.seg is not None and k.seg is not None and self.document:
            ok = ok & (k.seg.max(-1) >= q.seg.min(-1)) & (k.seg.min(-1) <= q.seg.max(-1))
        if q.seg is not None:
            ok = ok & (q.seg.max(-1) >= 0)
        if k.seg is not None:
            ok = ok & (k.seg.max(-1) >= 0)
        return jnp.any(ok)

    def all_visible(
        self, q_pos: QPos, k_pos: KPos, q_seg: QPos | None = None, k_seg: KPos | None = None
    ) -> Bool[Array, ""]:
        """Scalar bool: True only if EVERY query of the block may attend to every key of it.

        The other half of the cheap block test (min/max only, O(t + s)): a True result lets a
        kernel skip the element-wise mask entirely. Each condition below is sufficient for all
        pairs of a batch row to be visible, so a True result is exact; a False result may still
        have every pair visible (the block is then masked element-wise, which is correct):

        - causal: ``max(k_pos) <= min(q_pos)``;
        - window: ``max(q_pos) - min(k_pos) < window`` (and, not causal,
          ``max(k_pos) - min(q_pos) < window``);
        - chunk: every query and key position lies in one and the same chunk;
        - document: every query and key segment id is one and the same value;
        - padding (any mask, when segment ids are given): ``min(q_seg) >= 0`` and
          ``min(k_seg) >= 0``.

        Args: as :meth:`any_visible` (int32 ``[..., t]`` / ``[..., s]`` positions and segment ids).

        Returns:
          bool ``[]``: True if in every batch row every (query, key) pair is visible.
        """
        q, k = _block(q_pos, q_seg), _block(k_pos, k_seg)
        self._check_segments(q, k)
        # the may_be_visible test with each range's ends swapped: the farthest pair must pass
        ok = self._positions_pass(q.pos.max(-1), q.pos.min(-1), k.pos.max(-1), k.pos.min(-1))
        if q.seg is not None and k.seg is not None and self.document:
            qs_min, qs_max = q.seg.min(-1), q.seg.max(-1)
            ok = ok & (qs_min == qs_max) & (k.seg.min(-1) == qs_min) & (k.seg.max(-1) == qs_min)
        if q.seg is not None:
            ok = ok & (q.seg.min(-1) >= 0)
        if k.seg is not None:
            ok = ok & (k.seg.min(-1) >= 0)
        return jnp.all(ok)

    def _check_segments(self, q: _Ids, k: _Ids) -> None:
        if self.document and (q.seg is None or k.seg is None):
            raise ValueError("a document mask needs segment ids for queries and keys")

    def _positions_pass(self, q_lo: Array, q_hi: Array, k_lo: Array, k_hi: Array) -> Array:
        """bool, broadcast of the inputs: the causal, window and chunk conditions, ``k_lo <= q_hi``,
        ``q_lo - k_hi < window``, (not causal) ``k_lo - q_hi < window`` and
        ``k_lo // chunk <= q_hi // chunk``, ``q_lo // chunk <= k_hi // chunk``. On one pair per
        element give each position twice; on the ranges of a block, the ends that make each
        condition easiest (:meth:`may_be_visible`) or hardest (:meth:`all_visible`) to meet."""
        ok = jnp.ones(jnp.broadcast_shapes(q_lo.shape, k_lo.shape), bool)
        if self.causal:
            ok = ok & (k_lo <= q_hi)
        if self.window is not None:
            ok = ok & (q_lo - k_hi < self.window)
            if not self.causal:
                ok = ok & (k_lo - q_hi < self.window)
        if self.chunk is not None:
            c = self.chunk
            ok = ok & (k_lo // c <= q_hi // c) & (q_lo // c <= k_hi // c)
        return ok

    @property
    def is_full(self) -> bool:
        return not self.causal and not self.document and self.window is None and self.chunk is None


CAUSAL = Mask()
FULL = Mask(causal=False)
