"""The one interface the trainer reads data through: a resumable stream of batches, and the
:class:`Data` triple (training stream, evaluation pass, tokenizer) every source builds.

A source is a function ``build(cfg_data, spec: BatchSpec) -> Data``; :data:`lcx.data.sources.SOURCES` names them, one line each. The
trainer never asks which source it reads: it iterates :class:`BatchStream` batches, saves
:meth:`BatchStream.state` in checkpoints and resumes with :meth:`BatchStream.resume`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from lcx.sharding.layout import BALANCED_BLOCK, PER_ROW, layout_permutation, row_permutations

Batch = dict[str, np.ndarray]


def lay_out(batch: Mapping[str, np.ndarray], layout: str, degree: int, block: int = BALANCED_BLOCK) -> Batch:
    """Apply the sequence layout to every array of ``batch`` along its last (sequence) axis.

    Args:
      batch: NumPy arrays ``[..., S]`` sharing the sequence axis (the five :data:`BATCH_KEYS`).
      layout: ``"contiguous"``, ``"zigzag"`` or ``"balanced"`` (per row, from the batch's own
        ``positions`` and ``segment_ids``).
      degree: context-parallel degree P.
      block: the kernels' tile in tokens (``balanced`` only).

    Returns:
      A new dict of the same keys, shapes and dtypes, each permuted by the same permutation per
      row (:func:`lcx.sharding.layout.apply_layout`'s NumPy path).
    """
    if layout in PER_ROW:
        perm = row_permutations(layout, batch["positions"], batch["segment_ids"], degree, block=block)
        return {k: np.take_along_axis(v, perm, axis=-1) for k, v in batch.items()}
    return {k: v.take(layout_permutation(layout, v.shape[-1], degree), axis=-1) for k, v in batch.items()}


@dataclasses.dataclass(eq=False)
class Rows:
    """What every batch source shares: rows of ``seq_len`` tokens, ``global_batch`` rows per
    batch, in a sequence layout applied once, on the host (:meth:`lay_out`). Sources extend it
    with their own (keyword-only) fields; the sizes are stored as ints.

    Attributes:
      seq_len: S, tokens per row.
      global_batch: B, rows per batch.
      layout: sequence layout, ``"contiguous"``, ``"zigzag"`` or ``"balanced"``
        (:mod:`lcx.sharding.layout`).
      context_degree: context-parallel degree P (the layout's chunk count is P or 2P).
      layout_block: the kernels' tile in tokens (the balanced layout's shortest chunk).
    """

    _: dataclasses.KW_ONLY
    seq_len: int
    global_batch: int
    layout: str = "contiguous"
    context_degree: int = 1
    layout_block: int = BALANCED_BLOCK

    def __post_init__(self) -> None:
        self.seq_len, self.global_batch = int(self.seq_len), int(self.global_batch)
        self.context_degree = int(self.context_degree)

    def lay_out(self, batch: Mapping[str, np.ndarray]) -> Batch:
        """``batch`` in this layout (:func:`lay_out`)."""
        return lay_out(batch, self.layout, self.context_degree, self.layout_block)

    def batch_index(self, i: int, n: int) -> int:
        """Evaluation batch ``i`` of ``n`` as an index in ``[0, n)`` (negative counts from the end).

        Raises:
          IndexError: ``i`` outside ``[-n, n)``.
        """
        if not -n <= i < n:
            raise IndexError(f"evaluation batch {i} out of range ({n} batches)")
        return i % n


def stack_rows(rows: Sequence[Mapping[str, np.ndarray]]) -> Batch:
    """The rows (dicts of the five batch arrays, each ``[S]``) as one batch ``[len(rows), S]`` of each key."""
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


@dataclasses.dataclass(eq=False)
class FixedRows(Rows, Sequence[Batch]):
    """A fixed evaluation pass over rows built once (:meth:`fixed_rows`), in laid-out batches of
    ``global_batch`` rows; the last batch is padded with copies of the last row whose loss mask
    is zeroed. Generated sources' validation sets share it."""

    @abc.abstractmethod
    def fixed_rows(self) -> Sequence[Mapping[str, np.ndarray]]:
        """The rows, in order, each a dict of the five batch arrays ``[seq_len]``."""

    def __len__(self) -> int:
        return -(-len(self.fixed_rows()) // self.global_batch)

    def __getitem__(self, i: int) -> Batch:  # type: ignore[override]
        i = self.batch_index(i, len(self))
        rows = list(self.fixed_rows()[i * self.global_batch : (i + 1) * self.global_batch])
        pad = self.global_batch - len(rows)
        batch = stack_rows(rows + [rows[-1]] * pad)
        if pad:
            batch["loss_mask"][-pad:] = 0.0
        return self.lay_out(batch)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


class BatchStream(Iterator[Batch], abc.ABC):
    """Infinite, deterministic training batches whose position is their whole state.

    Each batch is a dict of the five :data:`lcx.data.BATCH_KEYS` arrays ``[rows, seq_len]``
    (``rows``: this process's rows of the global batch, all ``global_batch`` of them on one
    process). :meth:`state` is a JSON-able dict (checkpointed in the orbax ``meta`` item) whose
    ``epoch`` and ``row`` locate the position in epochs of :attr:`rows_per_epoch` rows.
    """

    seq_len: int
    global_batch: int

    @property
    @abc.abstractmethod
    def rows_per_epoch(self) -> int:
        """Rows per epoch (nominal for a stream that never repeats): positions are stored as
        ``(epoch, row)``."""

    def __iter__(self) -> BatchStream:
        return self

    @abc.abstractmethod
    def __next__(self) -> Batch:
        """The next batch: a dict of the five batch arrays, each ``[rows, seq_len]``."""

    @abc.abstractmethod
    def state(self) -> dict[str, Any]:
        """The exact position (``epoch``, ``row``) plus the fields that identify the stream, as
        JSON-able values (checkpoint-friendly)."""

    @abc.abstractmethod
    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume exactly at ``state`` (from :meth:`state`) of this same stream.

        Raises:
          ValueError: ``state`` comes from a different stream (names the field).
        """

    @abc.abstractmethod
    def resume(self, state: Mapping[str, Any]) -> None:
        """:meth:`restore`, or, when ``state`` was written at another ``seq_len`` (the previous
        stage of a length-extension schedule, :mod:`lcx.training.schedule`), continue at the
        equivalent position of this stream."""

    @abc.abstractmethod
    def skip(self, n: int) -> None:
        """Advance by ``n >= 0`` batches without training on them.

        Raises:
          ValueError: ``n < 0``.
        """

    @abc.abstractmethod
    def state_before(self, n: int) -> dict[str, Any]:
        """:meth:`state` as it was ``n`` batches ago (the stream only moves forward): the
        position to checkpoint when ``n`` batches were prefetched but not yet trained on."""

    def close(self) -> None:
        """Release what the stream holds (worker processes); a no-op by default."""


class RowCursor(BatchStream):
    """A :class:`BatchStream` computed in-process whose position is the row counter ``_row`` (the
    next row to produce), each batch being the next ``global_batch`` rows: :meth:`skip` and
    :meth:`state_before` follow from it (its :meth:`state` holds ``epoch`` and ``row``)."""

    _row: int

    def skip(self, n: int) -> None:
        """Advance by ``n >= 0`` batches without building them (O(1)).

        Raises:
          ValueError: ``n < 0``.
        """
        if n < 0:
            raise ValueError(f"can only skip forward, got n={n}")
        self._row += int(n) * self.global_batch

    def state_before(self, n: int) -> dict[str, Any]:
        """:meth:`state` as it was ``n`` batches ago."""
        st = self.state()
        row = st["epoch"] * self.rows_per_epoch + st["row"] - n * self.global_batch
        return dict(st, epoch=row // self.rows_per_epoch, row=row % self.rows_per_epoch)


@dataclasses.dataclass(frozen=True)
class BatchSpec:
    """What every source builds to: the rows' length, the batches' sizes, layout and order.

    Attributes:
      seq_len: S, tokens per row.
      global_batch: B, rows per training batch.
      layout: sequence layout, ``"contiguous"``, ``"zigzag"`` or ``"balanced"``
        (:mod:`lcx.sharding.layout`).
      context_degree: context-parallel degree P.
      seed: the training stream's seed.
      val_global_batch: rows per evaluation batch.
      layout_block: the kernels' tile in tokens (the balanced layout's shortest chunk).
      process_shard: ``(index, count)``: the batch's rows fall into ``count`` equal parts held
        by different processes, and this process holds part ``index`` (``(0, 1)``: one process,
        or every process holds every row). A source that reads per-process shards
        (:func:`lcx.data.corpus_source.corpus_data`) builds only its part: ``global_batch / count``
        rows of its own documents.
    """

    seq_len: int
    global_batch: int
    layout: str
    context_degree: int
    seed: int
    val_global_batch: int
    layout_block: int = BALANCED_BLOCK
    process_shard: tuple[int, int] = (0, 1)

    def rows(self, *, val: bool = False) -> dict[str, Any]:
        """The :class:`Rows` keywords of the training batches (``val``: the evaluation batches)."""
        return {
            "seq_len": self.seq_len,
            "global_batch": self.val_global_batch if val else self.global_batch,
            "layout": self.layout,
            "context_degree": self.context_degree,
            "layout_block": self.layout_block,
        }


class Data(NamedTuple):
    """What a data source builds; unpacks as ``train, val, tokenizer = make_data(...)``.

    Attributes:
      train: the infinite resumable training stream.
      val: one fixed evaluation pass, a re-iterable sequence of batches with
        ``unigram_entropy()``.
      tokenizer: the tokenizer (``vocab_size`` sizes the model's embedding).
    """

    train: BatchStream
    val: Sequence[Batch]
    tokenizer: Any

    def val_batches(self, max_batches: int | None = None) -> Iterator[Batch]:
        """The first ``max_batches`` validation batches (all of them if ``None`` or too many).

        Always the same batches, from the start of the validation pass, so successive
        evaluations of one run are comparable.
        """
        n = len(self.val) if max_batches is None else min(int(max_batches), len(self.val))
        return (self.val[i] for i in range(n))

    def unigram_entropy(self) -> float:
        """Unigram entropy of the validation tokens, nats per token: a validation loss below it
        shows the model uses context."""
        return self.val.unigram_entropy()  # type: ignore[attr-defined]


__all__ = ["Batch", "BatchSpec", "BatchStream", "Data", "FixedRows", "RowCursor", "Rows", "lay_out", "stack_rows"]
