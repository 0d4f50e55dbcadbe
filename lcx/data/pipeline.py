"""Batches of a text corpus for training and evaluation, the train/validation split, and the
corpus a ``data=stdlib`` / ``data=text`` config (and its presets) names (:func:`load_corpus`; the
source itself is :func:`lcx.data.corpus_source.corpus_data`).

A batch is a dict of five arrays ``[global_batch, seq_len]`` (see :mod:`lcx.data.packing`), with
the sequence layout (contiguous, zigzag or balanced, :mod:`lcx.sharding.layout`) applied ONCE, to all five
together, here on the host. Nothing downstream un-permutes it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lcx.data.config import StdlibData, TextData
from lcx.data.corpora import Corpus, stdlib_corpus, text_corpus
from lcx.data.order import EndlessRows, row_position
from lcx.data.packing import Packer, check_packing_args, unigram_entropy
from lcx.data.stream import Batch, RowCursor, Rows
from lcx.sharding.layout import BALANCED_BLOCK, check_layout

log = logging.getLogger(__name__)


def check_batch_args(seq_len: int, global_batch: int, layout: str, context_degree: int) -> None:
    """Raise ``ValueError`` for a bad row length, batch size, layout or layout degree."""
    check_packing_args(seq_len, global_batch)
    check_layout(layout, seq_len, context_degree)


class Batches(Rows, RowCursor):
    """Infinite, deterministic, resumable training batches.

    Epoch ``e`` packs the documents in the order ``np.random.default_rng([seed, e]).permutation``
    into ``rows_per_epoch`` rows, then visits those rows in the order
    ``np.random.default_rng([seed, e, 1]).permutation`` (with ``shuffle=False``: the stored
    documents, rows in order). Epochs follow one another as one endless stream of rows, and each
    batch is the next ``global_batch`` rows (a batch may hold the last rows of one epoch and the
    first of the next). Within an epoch every token is an input exactly once; only the last
    packed row of each epoch is padded.

    Rows are shuffled, not only documents: a document spans ``len / seq_len`` consecutive packed
    rows (the longest file of the default corpus, about 180 rows of 4,096 tokens), so visiting
    them in order feeds a small batch the same document for many steps in a row. Such runs of
    alike batches (dozens of character-map tables of ``encodings/``, say) made the default run's
    loss spike (docs/training_stability.md).

    The position in the stream is the whole state: :meth:`state` returns a small dict of Python
    ints, :meth:`restore` (or the ``state`` argument) resumes exactly there.

    Args:
      documents: token id arrays, integer ``[T_i]`` each (empty ones are skipped).
      seq_len: S, tokens per row, ``>= 2``.
      global_batch: B, rows per batch, ``>= 1``.
      layout: sequence layout, ``"contiguous"``, ``"zigzag"`` or ``"balanced"``.
      context_degree: context-parallel degree P (the layout's chunk count is P or 2P).
      seed: shuffling seed.
      shuffle: shuffle documents each epoch; if False every epoch uses the stored order.
      state: optional :meth:`state` dict to resume from (the balanced layout is a function of
        each row, so it resumes with the position).
      layout_block: the kernels' tile in tokens (the balanced layout's shortest chunk).

    Yields:
      dicts with :data:`BATCH_KEYS`, each ``[B, S]``: ``tokens``, ``targets``, ``positions``,
      ``segment_ids`` int32 and ``loss_mask`` float32, already in ``layout``.

    Raises:
      ValueError: ``seq_len < 2``; ``global_batch < 1``; a layout or degree that does not divide
        ``seq_len``; no non-empty document; a state from a different stream.
    """

    def __init__(
        self,
        documents: Sequence[np.ndarray],
        *,
        seq_len: int,
        global_batch: int,
        layout: str = "contiguous",
        context_degree: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        state: Mapping[str, int] | None = None,
        layout_block: int = BALANCED_BLOCK,
    ):
        check_batch_args(seq_len, global_batch, layout, context_degree)
        super().__init__(
            seq_len=seq_len,
            global_batch=global_batch,
            layout=layout,
            context_degree=context_degree,
            layout_block=layout_block,
        )
        self.packer = Packer(documents, self.seq_len)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.order = EndlessRows(self.packer, (self.seed,), shuffle=self.shuffle)
        self._row = 0  # global row counter over the endless stream of epochs
        if state is not None:
            self.restore(state)

    # -- order --------------------------------------------------------------------------------

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Document order of ``epoch``: int64 ``[num_docs]`` permutation of packer indices."""
        return self.order.epoch_order(epoch)

    def row_order(self, epoch: int) -> np.ndarray:
        """Order in which ``epoch``'s packed rows are visited: int64 ``[rows_per_epoch]``."""
        return self.order.row_order(epoch)

    # -- sizes --------------------------------------------------------------------------------

    @property
    def rows_per_epoch(self) -> int:
        """Rows (of ``seq_len`` tokens) per epoch."""
        return self.packer.rows_per_epoch

    @property
    def batches_per_epoch(self) -> float:
        """Batches per epoch (``rows_per_epoch / global_batch``; need not be an integer)."""
        return self.rows_per_epoch / self.global_batch

    @property
    def num_tokens(self) -> int:
        """Input tokens per epoch."""
        return self.packer.num_tokens

    def unigram_entropy(self) -> float:
        """Unigram entropy of this corpus's tokens, nats per token (see :func:`unigram_entropy`)."""
        return unigram_entropy(self.packer.tokens)

    # -- iteration and state ------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """Epoch of the next row to be produced (0-based)."""
        return self._row // self.rows_per_epoch

    def __next__(self) -> Batch:
        batch = self.order.rows(self._row, self.global_batch)
        self._row += self.global_batch
        return self.lay_out(batch)

    def state(self) -> dict[str, int]:
        """The exact stream position, as a dict of Python ints (JSON- and checkpoint-friendly).

        Keys: ``epoch`` and ``row`` (next row within that epoch) locate the position; ``seed``,
        ``shuffle``, ``row_shuffle`` (1: rows are shuffled too; streams saved before lcx
        shuffled rows lack it and are refused mid-epoch), ``seq_len``, ``num_docs``,
        ``num_tokens`` identify the stream and are checked by :meth:`restore`. The position is in
        rows, so it survives a change of global batch.
        """
        epoch, row = divmod(self._row, self.rows_per_epoch)
        return {
            "epoch": int(epoch),
            "row": int(row),
            "seed": self.seed,
            "shuffle": int(self.shuffle),
            "row_shuffle": int(self.shuffle),
            "seq_len": self.seq_len,
            "num_docs": self.packer.num_docs,
            "num_tokens": self.packer.num_tokens,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume at the position of ``state`` (from :meth:`state`).

        Raises:
          ValueError: ``state`` comes from a different stream (seed, shuffle, sequence length or
            corpus differ) or is out of range; the message names the field.
        """
        self._row = row_position(state, self.state(), self.rows_per_epoch)

    def resume(self, state: Mapping[str, Any]) -> None:
        """:meth:`restore`, or, for a ``state`` written at another ``seq_len``, continue in the same
        epoch at the same fraction of its tokens (to within one row)."""
        old_len = state.get("seq_len")
        if old_len is None or int(old_len) == self.seq_len:
            self.restore(state)
            return
        fraction = min(1.0, int(state["row"]) * int(old_len) / max(1, int(state["num_tokens"])))
        row = min(self.rows_per_epoch - 1, int(fraction * self.rows_per_epoch))
        log.info(
            "sequence length %s -> %d: data continues at row %d of epoch %s", old_len, self.seq_len, row, state["epoch"]
        )
        self.restore({**state, "seq_len": self.seq_len, "num_tokens": self.num_tokens, "row": row})


@dataclasses.dataclass(eq=False)
class EvalBatches(Rows, Sequence[Batch]):
    """One fixed pass over evaluation documents, as a re-iterable sequence of batches.

    Documents are packed in their stored order (no shuffling); the last row is padded, and the
    last batch is filled with all-padding rows (loss mask 0), so the pass covers every token once.
    ``len(ev)`` batches; ``ev[i]`` is batch ``i``; iterating always starts from batch 0.

    ``documents``, ``seq_len``, ``global_batch``, ``layout`` and ``context_degree`` are as for
    :class:`Batches`.

    Raises:
      ValueError: as for :class:`Batches`.
    """

    documents: dataclasses.InitVar[Sequence[np.ndarray]]

    def __post_init__(self, documents: Sequence[np.ndarray]) -> None:
        check_batch_args(self.seq_len, self.global_batch, self.layout, self.context_degree)
        super().__post_init__()
        self.packer = Packer(documents, self.seq_len)
        self._index = self.packer.epoch_index()

    def __len__(self) -> int:
        return -(-self.packer.rows_per_epoch // self.global_batch)

    def __getitem__(self, i: int) -> Batch:  # type: ignore[override]
        i = self.batch_index(i, len(self))
        return self.lay_out(self.packer.rows(self._index, i * self.global_batch, self.global_batch))

    def __iter__(self) -> Iterator[Batch]:
        return (self[i] for i in range(len(self)))

    @property
    def num_tokens(self) -> int:
        """Input tokens in the pass."""
        return self.packer.num_tokens

    @property
    def num_targets(self) -> int:
        """Loss-bearing tokens in the pass (sum of the loss masks)."""
        return self.packer.num_targets

    def unigram_entropy(self) -> float:
        """Unigram entropy of these tokens, nats per token: the loss a context-free model gets."""
        return unigram_entropy(self.packer.tokens)


def split_documents(num_docs: int, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split document indices into disjoint train and validation sets.

    ``max(1, round(val_fraction * num_docs))`` documents, chosen by
    ``np.random.default_rng(seed)``, go to validation; at least one stays for training.

    Args:
      num_docs: number of documents N.
      val_fraction: fraction of documents for validation, in (0, 1).
      seed: split seed (``data.split_seed``; independent of the training seed so runs with
        different seeds are evaluated on the same documents).

    Returns:
      ``(train, val)``: sorted int64 index arrays, disjoint, together ``range(N)``.

    Raises:
      ValueError: ``val_fraction`` outside (0, 1) or fewer than 2 documents.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must lie in (0, 1), got {val_fraction}")
    if num_docs < 2:
        raise ValueError(
            f"a validation split by document needs at least 2 non-empty documents, the corpus has "
            f"{num_docs}; add files to data.paths (or split one file into several)"
        )
    n_val = min(num_docs - 1, max(1, round(val_fraction * num_docs)))
    perm = np.random.default_rng(seed).permutation(num_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def _abs_paths(paths: Sequence[str]) -> list[str]:
    """Resolve relative paths against the launch directory when Hydra changed the cwd."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.utils import to_absolute_path

        if HydraConfig.initialized():
            return [to_absolute_path(str(p)) for p in paths]
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return [str(p) for p in paths]


def load_corpus(data: StdlibData | TextData) -> Corpus:
    """The corpus a data config names: ``data=stdlib``, or ``data=text`` and its presets
    (``jsonl``, ``parquet``, ``arrayrecord``): its ``paths`` read by
    :func:`lcx.data.corpora.text_corpus` with its ``format``, ``text_field``, ``document`` and
    ``document_separator``.

    Raises:
      ValueError, FileNotFoundError: no paths, and every error of :func:`stdlib_corpus` /
        :func:`text_corpus`.
    """
    if isinstance(data, StdlibData):
        return stdlib_corpus()
    paths = [data.paths] if isinstance(data.paths, str) else list(data.paths)
    if not paths:
        raise ValueError(f"data={data.name} needs data.paths, e.g. data.paths=[a.txt,'docs/*.md']")
    return text_corpus(
        _abs_paths(paths),
        text_field=data.text_field,
        format=data.format,
        document=data.document,
        document_separator=data.document_separator,
    )
