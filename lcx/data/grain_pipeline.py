"""The grain pipeline's pieces: packed rows -> mixture -> batch -> layout as a
``grain.MapDataset`` (:func:`batch_dataset`), its iterator with worker processes
(:func:`iterate`), and tokenizing through grain (:func:`tokenize`).

The pipeline is a ``grain.MapDataset`` (random access, so a pure function of the index):

    EndlessRows (one per source, :mod:`lcx.data.order`)   row r -> dict of [S] arrays
      -> MapDataset.mix(sources, weights)                  (a mixture only)
      -> [offset:] -> .batch(rows) -> .map(LayOut)          batch k -> dict of [rows, S] arrays
      -> .to_iter_dataset(ReadOptions)                      a prefetch thread (workers = 0)
      -> .mp_prefetch(MultiprocessingOptions(workers))      worker processes (workers > 0)

With one source and one shard, batch ``k`` is exactly :class:`lcx.data.Batches`'s batch ``k``
(the stream of the published default run): same rows, same order, same layout, bit for bit.
Tokenizing the documents before packing runs through grain as well (:func:`tokenize`).

The stream the trainer reads, with its checkpointable position, is
:class:`lcx.data.grain_stream.GrainBatches`.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from lcx.data.order import EndlessRows
from lcx.data.packing import BATCH_KEYS
from lcx.data.stream import Batch, lay_out


def _grain_ready() -> None:
    """grain reads absl flags in its worker machinery; outside an absl app nothing parses them,
    so mark them parsed (their defaults) before worker processes start."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def _worker_init(worker_index: int, worker_count: int) -> None:
    """In each grain worker process: ignore SIGINT and SIGTERM (a Ctrl-C or a scheduler's SIGTERM
    reaches the whole process group; the trainer finishes its step and saves, then closes the
    workers), and die with the trainer if it is killed (Linux ``PR_SET_PDEATHSIG``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:  # pragma: no cover - no glibc
            pass


def iterate(ds: Any, workers: int, prefetch: int) -> Any:
    """``ds`` (a MapDataset) as a grain iterator: one prefetch thread (``workers=0``), or
    ``workers`` processes each ``prefetch`` elements ahead."""
    read = grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch if workers == 0 else 1)
    it = ds.to_iter_dataset(read)
    if workers > 0:
        _grain_ready()
        options = grain.multiprocessing.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=prefetch)
        it = it.mp_prefetch(options, worker_init_fn=_worker_init)
    return iter(it)


def close_iterator(it: Any) -> None:
    """Stop a grain iterator's worker processes."""
    close = getattr(it, "close", None)  # grain >= 0.2.13; older iterators stop their workers when collected
    if close is not None:
        close()


class _Encode:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> np.ndarray:
        return self.tokenizer.encode_documents([text])[0]


def tokenize(texts: Sequence[str], tokenizer: Any, workers: int = 0) -> list[np.ndarray]:
    """Each text as one training document (:meth:`lcx.data.tokenizers.Tokenizer.encode_documents`:
    the tokenizer's ids with its BOS/EOS rule), in order: in this process as one batch
    (``workers=0``; a Hugging Face tokenizer encodes a batch on its own threads), else through
    grain in ``workers`` processes, one text per element.

    Returns:
      one int32 array ``[T_i]`` per text.
    """
    if workers == 0 or len(texts) < 2:
        return tokenizer.encode_documents(list(texts))
    ds = grain.MapDataset.source(list(texts)).map(_Encode(tokenizer))
    it = iterate(ds, workers, 16)
    try:
        return [np.array(x) for x in it]
    finally:
        close_iterator(it)


class LayOut:
    """The batch map of the pipeline: the sequence layout (:func:`lcx.data.stream.lay_out`) of the
    five batch arrays; the rows' ``source`` ids ``[rows]`` pass through."""

    def __init__(self, layout: str, degree: int, block: int):
        self.layout, self.degree, self.block = layout, degree, block

    def __call__(self, batch: Mapping[str, np.ndarray]) -> Batch:
        out = lay_out({k: batch[k] for k in BATCH_KEYS}, self.layout, self.degree, self.block)
        out["source"] = np.asarray(batch["source"], dtype=np.int32)
        return out


class _Concat:
    """Batch ``k`` of several shards' pipelines, rows concatenated in shard order."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = list(parts)

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: int) -> Batch:
        got = [p[index] for p in self.parts]
        return {key: np.concatenate([g[key] for g in got]) for key in got[0]}


def batch_dataset(
    shards: Sequence[Sequence[EndlessRows]],
    weights: Sequence[float],
    rows: int,
    *,
    offset: int = 0,
    layout: str = "contiguous",
    degree: int = 1,
    block: int = 512,
) -> Any:
    """The pipeline as a ``grain.MapDataset``: element ``k`` is batch ``k``.

    Args:
      shards: per shard held, its sources' rows (``shards[s][j]``: source ``j`` of shard ``s``;
        each row carries its ``source`` id).
      weights: the sources' mixing weights (``MapDataset.mix``; ignored for one source).
      rows: rows per batch per shard.
      offset: the shard's (mixed) row the first batch starts at.
      layout: the sequence layout's name (:func:`lcx.data.stream.lay_out`).
      degree: context-parallel degree P.
      block: the kernels' tile in tokens (``balanced`` only).

    Returns:
      a MapDataset of dicts: the five :data:`BATCH_KEYS` arrays ``[len(shards) * rows, S]`` and
      ``source`` int32 ``[len(shards) * rows]``.
    """
    parts = []
    for sources in shards:
        ds = [grain.MapDataset.source(s) for s in sources]
        mixed = ds[0] if len(ds) == 1 else grain.MapDataset.mix(ds, list(weights))
        parts.append(mixed[int(offset) :].batch(int(rows), drop_remainder=True).map(LayOut(layout, degree, block)))
    return parts[0] if len(parts) == 1 else grain.MapDataset.source(_Concat(parts))


__all__ = ["LayOut", "batch_dataset", "close_iterator", "iterate", "tokenize"]
