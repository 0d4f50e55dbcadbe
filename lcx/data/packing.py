"""Packing documents into fixed-length rows, and the per-token arrays that travel with them.

An *epoch* is the documents in some order, concatenated into one token stream and cut into rows
of ``seq_len`` tokens. Every token of every non-empty document is an input exactly once per epoch;
the last row is padded (never truncated). Empty documents hold no tokens and are skipped.

Per token (row ``b``, column ``t``) packing produces five arrays:

- ``tokens``: int32, the input token id.
- ``targets``: int32, the next token of the *same document*. A document cut by a row break keeps
  its target across the break (the last token of a row predicts the first token of the next
  row's piece, which the model cannot see, exactly as in unpacked next-token training). The last
  token of each document has no target: target 0 and loss mask 0.
- ``positions``: int32, 0 at the start of every document *piece* (the part of a document inside
  one row), counting up within the piece, so always ``< seq_len``. A piece that continues a
  document from the previous row restarts at 0: it attends only within its row anyway (it has its
  own segment id), RoPE is relative, and small positions keep rotary angles exact in float32
  and inside any ``max_seq_len`` table (the longest stdlib file is ~750k tokens).
- ``segment_ids``: int32, 1, 2, 3, ... for the successive document pieces of a row; ``-1``
  (:data:`PAD_SEGMENT`) marks padding. Attention with the document mask sees only its own
  segment; a negative id is padding to :func:`lcx.attention.attention` under every mask.
- ``loss_mask``: float32, 1.0 where the target is a real next token, else 0.0 (document ends,
  padding). The loss is ``sum(loss_mask * nll) / sum(loss_mask)``.

Padding (end of an epoch, or whole rows to fill a last evaluation batch): token 0, target 0,
loss mask 0, segment id ``-1`` (:data:`PAD_SEGMENT`), positions counting from 0 like one
pseudo-document. Attention treats a negative segment id as padding (:mod:`lcx.attention.masks`):
a padding token sees no key and no query sees it, so its attention output and gradients are 0
and blocks or ring steps made only of padding are skipped. The loss mask already excludes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

BATCH_KEYS: tuple[str, ...] = ("tokens", "targets", "positions", "segment_ids", "loss_mask")
PAD_SEGMENT = -1
"""Segment id of padding tokens (negative: padding to :func:`lcx.attention.attention`)."""


def check_packing_args(seq_len: int, global_batch: int | None = None) -> None:
    """Raise ``ValueError`` unless ``seq_len >= 2`` tokens (and ``global_batch >= 1`` rows)."""
    if int(seq_len) != seq_len or seq_len < 2:
        raise ValueError(
            f"sequence length must be an integer >= 2 tokens (one input and its target), got "
            f"{seq_len}; set train.seq_len"
        )
    if global_batch is not None and (int(global_batch) != global_batch or global_batch < 1):
        raise ValueError(f"global batch must be an integer >= 1 rows, got {global_batch}")


def _compact_dtype(max_id: int):
    for dt in (np.uint8, np.uint16, np.int32):
        if max_id <= np.iinfo(dt).max:
            return dt
    raise ValueError(f"token id {max_id} does not fit in int32")


class EpochIndex(NamedTuple):
    """Where each document of one epoch's order lies in that epoch's token stream.

    Attributes:
      order: int64 ``[N]``, packer document indices in stream order.
      begins: int64 ``[N]``, stream offset (tokens) of each document's first token.
      ends: int64 ``[N]``, stream offset one past each document's last token.
    """

    order: np.ndarray
    begins: np.ndarray
    ends: np.ndarray


class Packer:
    """Non-empty documents of token ids, stored compactly, cut into rows of ``seq_len`` tokens.

    Args:
      documents: token id arrays, each integer ``[T_i]`` with ids ``>= 0`` (empty ones skipped).
      seq_len: row length S in tokens, ``>= 2``.

    Raises:
      ValueError: ``seq_len < 2``; negative ids; no non-empty document.
    """

    def __init__(self, documents: Iterable[np.ndarray], seq_len: int):
        check_packing_args(seq_len)
        docs = [np.asarray(d).reshape(-1) for d in documents]
        docs = [d for d in docs if d.size]
        if not docs:
            raise ValueError("cannot pack an empty corpus: every document has 0 tokens")
        lo = min(int(d.min()) for d in docs)
        if lo < 0:
            raise ValueError(f"token ids must be >= 0, got {lo}")
        self.seq_len = int(seq_len)
        self.lengths = np.array([d.size for d in docs], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        dtype = _compact_dtype(max(int(d.max()) for d in docs))
        self.tokens = np.empty(int(self.lengths.sum()), dtype=dtype)  # all documents, back to back
        for d, s in zip(docs, self.starts):
            self.tokens[s : s + d.size] = d

    @property
    def num_docs(self) -> int:
        """Number of non-empty documents."""
        return int(self.lengths.size)

    @property
    def num_tokens(self) -> int:
        """Input tokens per epoch (all tokens of all documents)."""
        return int(self.tokens.size)

    @property
    def num_targets(self) -> int:
        """Loss-bearing tokens per epoch: every token but each document's last."""
        return self.num_tokens - self.num_docs

    @property
    def rows_per_epoch(self) -> int:
        """Rows per epoch: ``ceil(num_tokens / seq_len)`` (the last one padded)."""
        return -(-self.num_tokens // self.seq_len)

    def epoch_index(self, order: Sequence[int] | np.ndarray | None = None) -> EpochIndex:
        """Stream offsets of the documents in ``order`` (a permutation of ``range(num_docs)``).

        ``None`` is the stored order.
        """
        order = np.arange(self.num_docs) if order is None else np.asarray(order, dtype=np.int64)
        if order.shape != (self.num_docs,):
            raise ValueError(f"order must be a permutation of {self.num_docs} documents, got shape {order.shape}")
        ends = np.cumsum(self.lengths[order])
        return EpochIndex(order, ends - self.lengths[order], ends)

    def rows(self, index: EpochIndex, first_row: int, num_rows: int) -> dict[str, np.ndarray]:
        """Rows ``first_row .. first_row + num_rows - 1`` of the epoch described by ``index``
        (:meth:`rows_at` of those row numbers)."""
        return self.rows_at(index, np.arange(first_row, first_row + num_rows, dtype=np.int64))

    def rows_at(self, index: EpochIndex, row_ids: np.ndarray) -> dict[str, np.ndarray]:
        """The rows numbered ``row_ids`` (int ``[R]``, any order) of the epoch described by ``index``.

        Rows at or past :attr:`rows_per_epoch` are all padding (used to fill a last batch).

        Returns:
          dict with :data:`BATCH_KEYS`, each ``[R, S]``: ``tokens``, ``targets``,
          ``positions``, ``segment_ids`` int32 and ``loss_mask`` float32 (see module docstring).
        """
        S = self.seq_len
        total = self.num_tokens
        idx = np.asarray(row_ids, dtype=np.int64)[:, None] * S + np.arange(S, dtype=np.int64)
        row_start = idx[:, :1]
        valid = idx < total
        d = np.minimum(np.searchsorted(index.ends, idx, side="right"), self.num_docs - 1)
        doc_begin = index.begins[d]
        offset = idx - doc_begin  # token offset within its document
        src = self.starts[index.order[d]] + offset  # index into self.tokens
        last = total - 1
        tokens = np.where(valid, self.tokens[np.minimum(src, last)], 0)
        has_target = valid & (offset + 1 < self.lengths[index.order[d]])
        targets = np.where(has_target, self.tokens[np.minimum(src + 1, last)], 0)
        piece_begin = np.where(valid, np.maximum(doc_begin, row_start), np.maximum(total, row_start))
        positions = idx - piece_begin
        segment_ids = np.where(valid, d - d[:, :1] + 1, PAD_SEGMENT)
        return {
            "tokens": tokens.astype(np.int32),
            "targets": targets.astype(np.int32),
            "positions": positions.astype(np.int32),
            "segment_ids": segment_ids.astype(np.int32),
            "loss_mask": has_target.astype(np.float32),
        }

    def pack(self, order: Sequence[int] | np.ndarray | None = None) -> dict[str, np.ndarray]:
        """All :attr:`rows_per_epoch` rows of one epoch in ``order`` (``None``: stored order).

        Returns:
          dict with :data:`BATCH_KEYS`, each ``[rows_per_epoch, S]`` (see :meth:`rows`).
        """
        return self.rows(self.epoch_index(order), 0, self.rows_per_epoch)


def pack_documents(documents: Iterable[np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """Pack ``documents`` (integer ``[T_i]`` each) in the given order into rows of ``seq_len``.

    Returns:
      dict with :data:`BATCH_KEYS`, each ``[ceil(sum T_i / seq_len), seq_len]``; int32 except
      ``loss_mask`` float32. See the module docstring for the meaning of each array.
    """
    return Packer(documents, seq_len).pack()


def unigram_entropy(tokens, vocab_size: int | None = None) -> float:
    """Entropy of the unigram (token frequency) distribution, in nats per token.

    A language model that learned only token frequencies reaches this cross-entropy; a validation
    loss below it shows the model uses context.

    Args:
      tokens: integer ``[T]`` array of token ids, or an iterable of such arrays (documents).
      vocab_size: optional number of ids (only sizes the histogram).

    Returns:
      ``-sum_v p_v ln p_v`` over the empirical distribution ``p`` of the ids, in nats.

    Raises:
      ValueError: no tokens.
    """
    if isinstance(tokens, np.ndarray):
        parts = [tokens.reshape(-1)]
    else:
        parts = [np.asarray(t).reshape(-1) for t in tokens]
    counts = None
    for p in parts:
        if p.size == 0:
            continue
        c = np.bincount(p.astype(np.int64), minlength=vocab_size or 0)
        if counts is None:
            counts = c
        else:
            n = max(counts.size, c.size)
            counts = np.pad(counts, (0, n - counts.size)) + np.pad(c, (0, n - c.size))
    if counts is None or counts.sum() == 0:
        raise ValueError("unigram entropy of an empty token set is undefined")
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
