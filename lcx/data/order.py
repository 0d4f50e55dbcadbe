"""The endless, deterministic order of one corpus's packed rows: which row of which epoch is
global row ``r`` (:class:`EndlessRows`).

Epoch ``e`` packs the documents in the order ``np.random.default_rng([*key, e]).permutation``
into ``rows_per_epoch`` rows, then visits those rows in the order
``np.random.default_rng([*key, e, 1]).permutation`` (``shuffle=False``: the stored documents,
rows in order). Epochs follow one another as one endless stream of rows. With ``key=(seed,)``
this is exactly the stream the default run's published results were trained on
(:class:`lcx.data.Batches`, ``experiments/results/default_run.csv``).

The rows are random access, so the stream is a pure function of the row number: the grain
pipeline (:mod:`lcx.data.grain_stream`) reads it as a ``grain.MapDataset`` source, and a position
in it is one integer.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcx.data.packing import BATCH_KEYS, EpochIndex, Packer

_CACHED_EPOCHS = 4  # epochs whose order is kept: a batch spans at most two, threads may read a third


class EndlessRows:
    """Global row ``r`` of the endless stream of one corpus's packed rows.

    A ``grain`` random-access source: ``len()`` is ``sys.maxsize`` (the stream never ends) and
    ``rows[r]`` is row ``r`` as a dict of :data:`BATCH_KEYS` arrays ``[S]``. Picklable (worker
    processes get a copy); the per-epoch orders are cached, safely under threads.

    Args:
      packer: the corpus's documents (:class:`lcx.data.packing.Packer`).
      key: the seed words of the order: ``(seed,)`` for a single corpus (the default run's
        stream), ``(seed, ..., j)`` for source ``j`` of a mixture.
      shuffle: shuffle documents and rows each epoch; if False every epoch uses the stored order.
      source: the id this source's rows carry (``"source"``: an int32 scalar), or None for none.
    """

    def __init__(self, packer: Packer, key: Sequence[int], *, shuffle: bool = True, source: int | None = None):
        self.packer = packer
        self.key = tuple(int(k) for k in key)
        self.shuffle = bool(shuffle)
        self.source = source
        self._cache: dict[int, tuple[EpochIndex, np.ndarray]] = {}

    @property
    def rows_per_epoch(self) -> int:
        """R, rows (of ``seq_len`` tokens) per epoch."""
        return self.packer.rows_per_epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Document order of ``epoch``: int64 ``[num_docs]`` permutation of packer indices."""
        if not self.shuffle:
            return np.arange(self.packer.num_docs)
        return np.random.default_rng([*self.key, int(epoch)]).permutation(self.packer.num_docs)

    def row_order(self, epoch: int) -> np.ndarray:
        """Order in which ``epoch``'s packed rows are visited: int64 ``[rows_per_epoch]``."""
        if not self.shuffle:
            return np.arange(self.rows_per_epoch)
        return np.random.default_rng([*self.key, int(epoch), 1]).permutation(self.rows_per_epoch)

    def index(self, epoch: int) -> tuple[EpochIndex, np.ndarray]:
        """``(epoch index, row order)`` of ``epoch`` (cached)."""
        hit = self._cache.get(epoch)
        if hit is None:
            hit = (self.packer.epoch_index(self.epoch_order(epoch)), self.row_order(epoch))
            for old in sorted(self._cache)[: max(0, len(self._cache) + 1 - _CACHED_EPOCHS)]:
                self._cache.pop(old, None)  # pop(.., None): another thread may have evicted it
            self._cache[epoch] = hit
        return hit

    def rows(self, first: int, n: int) -> dict[str, np.ndarray]:
        """Global rows ``first .. first + n - 1`` (they may span epochs).

        Returns:
          dict with :data:`BATCH_KEYS`, each ``[n, S]`` (int32; ``loss_mask`` float32).
        """
        R, parts, row, left = self.rows_per_epoch, [], int(first), int(n)
        while left:
            epoch, r = divmod(row, R)
            k = min(left, R - r)
            index, order = self.index(epoch)
            parts.append(self.packer.rows_at(index, order[r : r + k]))
            row += k
            left -= k
        return {k: np.concatenate([p[k] for p in parts]) for k in BATCH_KEYS} if len(parts) > 1 else parts[0]

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Global row ``index``: dict of :data:`BATCH_KEYS` arrays ``[S]`` (plus ``source``, an int32
        scalar, when :attr:`source` is set)."""
        row = {k: v[0] for k, v in self.rows(int(index), 1).items()}
        if self.source is not None:
            row["source"] = np.int32(self.source)
        return row

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_cache": {}}  # a worker rebuilds the orders it needs


def row_position(state: Mapping[str, Any], mine: Mapping[str, Any], rows_per_epoch: int) -> int:
    """The global row of an ``{epoch, row, ...}`` stream state (:meth:`lcx.data.Batches.state`),
    after checking that it comes from the stream whose state is ``mine``.

    Raises:
      ValueError: ``seed``, ``shuffle``, ``seq_len``, ``num_docs`` or ``num_tokens`` differ (names
        the field); a mid-epoch state of a stream that did not shuffle rows; ``epoch``/``row`` out
        of range.
    """
    if state.get("row", 0) and int(state.get("row_shuffle", 0)) != int(mine["row_shuffle"]):
        raise ValueError(
            f"data state mismatch: the checkpoint's stream visits rows {'shuffled' if state.get('row_shuffle') else 'in order'}"
            f", this run's {'shuffled' if mine['row_shuffle'] else 'in order'} (lcx shuffles rows since its data "
            f"format changed), so resuming mid-epoch would not see the batches the run would have; start a new run, "
            f"or resume with the lcx version that wrote the checkpoint"
        )
    for key in ("seed", "shuffle", "seq_len", "num_docs", "num_tokens"):
        if key in state and int(state[key]) != int(mine[key]):
            raise ValueError(
                f"data state mismatch: checkpoint has {key}={int(state[key])}, this run has "
                f"{key}={mine[key]}; resume with the same data config, seed and seq_len"
            )
    epoch, row = int(state["epoch"]), int(state["row"])
    if epoch < 0 or not 0 <= row < rows_per_epoch:
        raise ValueError(f"data state out of range: epoch={epoch}, row={row} (rows per epoch {rows_per_epoch})")
    return epoch * rows_per_epoch + row


__all__ = ["EndlessRows", "row_position"]
