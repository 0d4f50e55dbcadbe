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
from collections.abc import Sequence

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


__all__ = ["EndlessRows"]
