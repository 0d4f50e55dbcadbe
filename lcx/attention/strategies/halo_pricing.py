"""The halo exchange's arithmetic: which tokens each device needs from which device, and its price.

Pure integer arithmetic on a mask, a sequence layout and shapes (no arrays, no collectives), kept
apart from the program in :mod:`lcx.attention.strategies.halo` as ring's numbers are kept in
:mod:`~lcx.attention.strategies.ring_pricing`: the program reads :func:`halo_geometry` to build its
``ppermute`` rounds at trace time, and the cost ledger reads the same geometry through
:class:`~lcx.attention.strategies.halo.Halo`'s price methods, so the two cannot disagree.

**Layout chunks.** Every layout hands device ``d`` some ``k`` whole chunks of ``c`` consecutive
tokens of the original sequence (``S = k P c``): contiguous ``k = 1`` (chunk ``d``), zigzag
``k = 2`` (chunks ``d`` and ``2P - 1 - d``), balanced ``k`` from
:func:`lcx.sharding.layout.balanced_chunks` at the plan's layout block ``max(block_q, block_kv)``
(which chunks, per row, from the row's documents: not known before the data arrives).

**Halo length** ``h`` (tokens a chunk needs from the tokens just before it, in the original order;
:func:`halo_tokens`): a causal sliding window ``W`` needs ``W - 1``; chunked attention (chunk ``C``)
needs ``C - 1`` with documents (positions restart, so the chunk grid moves with every document),
and without documents ``max_j (j c mod C)`` over the layout chunks' starts ``j c``: 0 when every
layout chunk starts on an attention-chunk boundary (``c % C == 0``), nothing to exchange then.
Both assume what ``lcx.data`` writes and the layouts keep: in the original order, the positions of
one document (of the whole row, without a document mask) grow by one from token to token.

**Rounds** (:class:`HaloRound`, one ``ppermute`` each): with ``h <= c`` (a longer halo is
refused, :func:`halo_refusal`), a chunk needs only the last ``h`` tokens of the chunk before it.
Contiguous: one round, ``d -> d + 1``. Zigzag: two, ``d -> d + 1`` (first chunks) and
``d -> d - 1`` (second chunks; device ``P - 1``'s second chunk follows its own first, no
transfer). Balanced: who holds the chunk before a chunk depends on the row's data, and a
``ppermute``'s pairs are static, so every device sends the tails of all ``k`` of its chunks to
every other device in ``P - 1`` rounds (``(P - 1) k h`` keys received; those no query sees are
masked by the kernel, as padding is). Each round carries K and V (``2 h K H a`` bytes per row)
and int32 positions and segment ids (``2 h 4``); the backward sends the same K/V cotangents back
(the transpose of a ``ppermute`` is the reverse one). On arrival each tail is padded locally to
:attr:`HaloGeometry.piece` keys (never sent) so the kernel's key length keeps ``c``'s divisors.
"""

from __future__ import annotations

import dataclasses

from lcx.attention.masks import Mask
from lcx.attention.strategies.pricing import AttentionShard, Traffic
from lcx.sharding.layout import balanced_chunks


@dataclasses.dataclass(frozen=True)
class HaloRound:
    """One ``ppermute`` of the halo exchange.

    Attributes:
      src_slots: the sender's local layout chunks whose last ``h`` tokens it sends, in order
        (the message is ``len(src_slots) * h`` tokens).
      pairs: ``(sender, receiver)`` linear device indices over the sequence axes.
    """

    src_slots: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...]

    def receives(self, degree: int) -> tuple[bool, ...]:
        """Per device: does it receive in this round (others get the ``ppermute``'s zeros)."""
        dst = {d for _, d in self.pairs}
        return tuple(d in dst for d in range(degree))


@dataclasses.dataclass(frozen=True)
class HaloGeometry:
    """Where a device's halo comes from (module docstring).

    Attributes:
      chunk_len: c, tokens of one layout chunk.
      slots: k, layout chunks per device.
      halo: h, tokens a chunk takes from the chunk before it (0: nothing to exchange).
      rounds: the ``ppermute`` rounds (empty when ``halo == 0`` or one device).
      degree: P, devices the sequence is split over.
    """

    chunk_len: int
    slots: int
    halo: int
    rounds: tuple[HaloRound, ...]
    degree: int

    @property
    def piece(self) -> int:
        """Tokens one received tail takes in the kernel call: ``h`` padded (locally, with padding
        tokens that are never sent) to the least divisor of ``c`` that is ``>= h``, so the kernel's
        ``T + received`` keys keep the divisors of ``c`` and its blocks stay whole (the xla kernel
        shrinks a block to a divisor of the key length: 4096 + 2 x 1023 keys would give it blocks
        of 166 tokens)."""
        return next(d for d in range(self.halo, self.chunk_len + 1) if self.chunk_len % d == 0) if self.halo else 0

    @property
    def received(self) -> int:
        """Halo keys a device holds besides its own ``k c`` (every round's tails, each padded to
        :attr:`piece`; the kernel call has ``k c + received`` keys)."""
        return sum(len(r.src_slots) for r in self.rounds) * self.piece

    @property
    def sent(self) -> int:
        """Most tokens one device sends (the busiest device's messages, over all rounds)."""
        per_device = [
            sum(len(r.src_slots) for r in self.rounds if any(src == d for src, _ in r.pairs))
            for d in range(self.degree)
        ]
        return max(per_device, default=0) * self.halo


def layout_chunks(layout: str, seq_len: int, degree: int, layout_block: int) -> tuple[int, int]:
    """``(c, k)``: tokens per layout chunk and chunks per device (module docstring)."""
    if degree <= 1:
        return seq_len, 1
    k = {"contiguous": 1, "zigzag": 2}.get(layout) or balanced_chunks(seq_len, degree, layout_block)
    return seq_len // (k * degree), k


def halo_tokens(mask: Mask, chunk_len: int, seq_len: int) -> int:
    """h, tokens a layout chunk of ``chunk_len`` needs from just before it (module docstring).

    Raises:
      ValueError: a global mask (no window, no chunks): it needs every key, not a halo.
    """
    if mask.window is not None:
        return mask.window - 1
    if mask.chunk is None:
        raise ValueError("the halo exchange serves sliding-window and chunked masks; a global mask needs every key")
    C = mask.chunk
    if mask.document:
        return C - 1
    return max((j * chunk_len) % C for j in range(max(1, seq_len // chunk_len)))


def halo_refusal(mask: Mask, layout: str, seq_len: int, degree: int, layout_block: int) -> str | None:
    """Why ``halo`` cannot run this layer (None: it can). The checks of :meth:`Halo.check_layer`
    and :meth:`Halo.check`: a global mask, a bidirectional one, a halo longer than a layout chunk."""
    fix = "give this kind another strategy, e.g. plan.attention.strategy={global: ring, sliding: halo}"
    if mask.kind == "global":
        return f"halo serves sliding and chunked layers only, not the global kind (no window, no chunks); {fix}"
    if not mask.causal:
        return (
            f"halo exchanges the keys BEFORE each chunk, so it needs a causal mask ({mask.kind}, causal=False); {fix}"
        )
    c, _ = layout_chunks(layout, seq_len, degree, layout_block)
    h = halo_tokens(mask, c, seq_len)
    if degree > 1 and h > c:
        what = (
            f"window W = {mask.window} needs W - 1"
            if mask.window is not None
            else f"chunk C = {mask.chunk} needs up to C - 1"
        )
        return (
            f"halo: the {mask.kind} layer's {what} = {h} keys from before each chunk, more than one {layout} layout "
            f"chunk of {c} tokens (S = {seq_len} over {degree} devices), which would take more hops than the one halo "
            f"exchange does; use a longer sequence, fewer context devices"
            f"{' or the contiguous layout' if layout != 'contiguous' else ''}, or run this kind on another strategy "
            f"(e.g. plan.attention.strategy={{global: ring, {mask.kind}: ring}})"
        )
    return None


def _static_rounds(owned: list[list[int]]) -> tuple[HaloRound, ...]:
    """Rounds for a static layout: device ``d`` holds original chunks ``owned[d]`` (in local
    order); each chunk needs the tail of the chunk before it, sent by its holder unless that is
    ``d`` itself. Grouped by (sender slot, receiver slot): within a group every device sends and
    receives at most once, so each group is one ``ppermute``."""
    where = {x: (d, s) for d, xs in enumerate(owned) for s, x in enumerate(xs)}
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for d, xs in enumerate(owned):
        for s, x in enumerate(xs):
            if x - 1 in where and where[x - 1][0] != d:
                src, src_slot = where[x - 1]
                groups.setdefault((src_slot, s), []).append((src, d))
    return tuple(HaloRound((ss,), tuple(p)) for (ss, _), p in sorted(groups.items()))


def halo_geometry(mask: Mask, layout: str, seq_len: int, degree: int, layout_block: int) -> HaloGeometry:
    """The halo of one layer on ``degree`` devices (module docstring).

    Args:
      mask: a causal sliding-window or chunked mask.
      layout: ``contiguous``, ``zigzag`` or ``balanced`` (``plan.attention.layout``).
      seq_len: S, tokens per sequence.
      degree: P, devices the sequence is split over.
      layout_block: the balanced layout's block (``max(block_q, block_kv)``), tokens.

    Raises:
      ValueError: :func:`halo_refusal`'s message.
    """
    why = halo_refusal(mask, layout, seq_len, degree, layout_block)
    if why is not None:
        raise ValueError(why)
    c, k = layout_chunks(layout, seq_len, degree, layout_block)
    h = halo_tokens(mask, c, seq_len) if degree > 1 else 0
    if h == 0:
        return HaloGeometry(c, k, 0, (), degree)
    if layout == "contiguous":
        rounds = _static_rounds([[d] for d in range(degree)])
    elif layout == "zigzag":
        rounds = _static_rounds([[d, 2 * degree - 1 - d] for d in range(degree)])
    else:  # balanced: data-dependent holders, so every chunk tail to every other device
        rounds = tuple(
            HaloRound(tuple(range(k)), tuple((d, (d + t) % degree) for d in range(degree))) for t in range(1, degree)
        )
    return HaloGeometry(c, k, h, rounds, degree)


def shard_geometry(s: AttentionShard) -> HaloGeometry:
    """:func:`halo_geometry` of a priced layer (its ``window``/``chunk``/``documents``, ``layout``
    and ``layout_block`` fields).

    Raises:
      ValueError: the shard is a global layer, or :func:`halo_refusal` refuses it.
    """
    mask = Mask(document=s.documents, window=s.window, chunk=s.chunk)
    return halo_geometry(mask, s.layout, s.seq_len, s.context_degree, s.layout_block)


def halo_traffic(s: AttentionShard, *, layers: int, replay: int) -> Traffic:
    """Bytes the busiest device sends in one training step over ``layers`` layers: each forward
    (``1 + replay`` of them) sends its halo K/V (activation dtype) with int32 positions and
    segment ids, the backward sends the halo's dK/dV back (the activation dtype: the cotangent of
    K/V). Counted as point-to-point ``ppermute`` traffic (:attr:`Traffic.ring`), one hop per
    round and pass."""
    g = shard_geometry(s)
    b, K, H, a = s.local_batch, s.kv_heads, s.head_dim, s.act_bytes
    kv = 2 * b * g.sent * K * H * a
    ids = 2 * b * g.sent * 4
    hops = len(g.rounds) * layers * (2 + replay)
    return Traffic(
        ring=float(layers * ((kv + ids) * (1 + replay) + kv)),
        ring_hops=hops,
        ring_hop_bytes=float(kv + ids) / max(1, len(g.rounds)),
    )


def halo_buffer_bytes(s: AttentionShard) -> int:
    """The kernel's extended K/V (own ``T`` plus received halo keys) and their int32 positions
    and segment ids, in forward and backward alike (as all-gather's gathered K/V)."""
    L = s.local_len + shard_geometry(s).received
    return 2 * s.local_batch * L * s.kv_heads * s.head_dim * s.act_bytes + 2 * s.local_batch * L * 4


def halo_residual_bytes(s: AttentionShard) -> int:
    """What the kernel's VJP saves beyond the local q, k, v: the received halo K/V and the
    extended keys' positions and segment ids."""
    g, b = shard_geometry(s), s.local_batch
    return 2 * b * g.received * s.kv_heads * s.head_dim * s.act_bytes + 2 * b * (s.local_len + g.received) * 4
