"""The training stream on ``grain`` (:class:`GrainBatches`): packed rows -> mixture -> batch ->
layout (:func:`lcx.data.grain_pipeline.batch_dataset`), built by worker processes ahead of the
step, with a checkpointable position.

With one source and one shard, batch ``k`` is exactly :class:`lcx.data.Batches`'s batch ``k``
(the stream of the published default run): same rows, same order, same layout, bit for bit.

The position is grain's own iterator state (``DatasetIterator.get_state()``, JSON) plus the row
``offset`` the pipeline starts at; :meth:`GrainBatches.state` holds both, and
:meth:`GrainBatches.state_before` gives the state of a batch already handed out (the trainer
prefetches one batch ahead of the step it checkpoints).
"""

from __future__ import annotations

import collections
import gc
import logging
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lcx.data.grain_pipeline import batch_dataset, close_iterator, iterate
from lcx.data.order import EndlessRows, row_position
from lcx.data.packing import BATCH_KEYS, Packer, unigram_entropy
from lcx.data.stream import Batch, BatchStream, Rows

log = logging.getLogger(__name__)

_SNAPSHOTS = 8  # states of the last batches handed out: the trainer asks for 1 back at most
_IDENTITY = ("seed", "shuffle", "seq_len", "num_docs", "num_tokens", "shards", "sources", "weights")


class GrainBatches(Rows, BatchStream):
    """Infinite, deterministic, resumable training batches from a grain pipeline
    (:func:`batch_dataset`), built ``prefetch`` batches ahead by ``workers`` processes.

    The documents are split into ``total_shards`` disjoint shards, each its own stream of the same
    mixture; this process holds the shards in ``shards`` and hands out their rows of each global
    batch, concatenated: ``global_batch * len(shards) / total_shards`` rows. One source and one
    shard: exactly the batches of :class:`lcx.data.Batches`.

    Tokens per source (``tokens/<name>`` in :meth:`state`'s ``tokens``, and the trainer's
    metrics) count the rows drawn from each source by all shards together, times ``seq_len``
    (the last row of an epoch counts its padding).

    Args:
      shards: per shard held, its sources' rows (``shards[s][j]``).
      names: the sources' names (one per source).
      weights: the sources' mixing weights.
      total_shards: N, shards of the run (all processes together).
      identity: ``seed``, ``shuffle`` and ``num_docs`` (training documents, all shards) of the
        stream, checked on :meth:`restore`.
      workers: grain worker processes (0: a prefetch thread in this process).
      prefetch: batches buffered ahead (per worker).
      rows: ``seq_len``, ``global_batch``, ``layout``, ``context_degree``, ``layout_block``: as
        :class:`lcx.data.Rows` (:meth:`lcx.data.BatchSpec.rows`).

    Yields:
      dicts with :data:`BATCH_KEYS`, each ``[rows, S]``: ``tokens``, ``targets``, ``positions``,
      ``segment_ids`` int32 and ``loss_mask`` float32, already in ``layout``.

    Raises:
      ValueError: ``global_batch`` not divisible by ``total_shards``; a state from another
        stream (:meth:`restore`, names the field).
    """

    def __init__(
        self,
        shards: Sequence[Sequence[EndlessRows]],
        *,
        names: Sequence[str],
        weights: Sequence[float],
        total_shards: int,
        identity: Mapping[str, Any],
        workers: int = 0,
        prefetch: int = 2,
        **rows: Any,
    ):
        super().__init__(**rows)
        global_batch = self.global_batch
        if global_batch % total_shards:
            raise ValueError(
                f"train.global_batch={global_batch} rows do not split into {total_shards} data shards "
                f"(data.shards, or one per process holding its own rows); use a multiple of {total_shards}"
            )
        self.shards = [list(s) for s in shards]
        self.names, self.weights = [str(n) for n in names], [float(w) for w in weights]
        self.total_shards, self.workers, self.prefetch = int(total_shards), int(workers), int(prefetch)
        self.shard_rows = global_batch // total_shards  # rows per batch per shard
        self.identity = {
            **{k: identity[k] for k in ("seed", "shuffle", "num_docs")},
            "seq_len": self.seq_len,
            "shards": self.total_shards,
            "sources": self.names,
            "weights": self.weights,
        }
        if self.total_shards == 1:
            self.identity["num_tokens"] = self.num_tokens
        self._it: Any = None
        self._closer: Any = None
        self._start(0, None, 0, dict.fromkeys(self.names, 0))

    # -- sizes --------------------------------------------------------------------------------

    @property
    def packers(self) -> list[Packer]:
        """The packers of the sources of the shards held (shard-major)."""
        return [r.packer for s in self.shards for r in s]

    @property
    def packer(self) -> Packer:
        """The one packer of a single-source, single-shard stream.

        Raises:
          AttributeError: a mixture, or several shards (see :attr:`packers`).
        """
        if len(self.packers) != 1:
            raise AttributeError("a mixture or sharded stream has one packer per source and shard: use .packers")
        return self.packers[0]

    @property
    def rows_per_epoch(self) -> int:
        """Rows per epoch of one shard: the sum over its sources (exact for one source; nominal
        for a mixture, whose sources' epochs end at different rows)."""
        return sum(r.rows_per_epoch for r in self.shards[0])

    @property
    def num_tokens(self) -> int:
        """Input tokens per epoch of the shards held (all sources)."""
        return sum(p.num_tokens for p in self.packers)

    @property
    def batches_per_epoch(self) -> float:
        """Batches per (nominal) epoch."""
        return self.rows_per_epoch / self.shard_rows

    def unigram_entropy(self) -> float:
        """Unigram entropy of the held shards' tokens, nats per token."""
        return unigram_entropy([p.tokens for p in self.packers])

    # -- iteration ----------------------------------------------------------------------------

    def _start(self, offset: int, grain_state: Any, batches: int, tokens: Mapping[str, int]) -> None:
        """Position the stream: the pipeline starts at row ``offset`` (of each shard), grain's
        iterator at ``grain_state`` (None: its start), ``batches`` batches after ``offset``."""
        self.close()
        self._offset, self._grain_state, self._k = int(offset), grain_state, int(batches)
        self._tokens = {n: int(tokens.get(n, 0)) for n in self.names}
        self._snapshots: collections.deque = collections.deque(maxlen=_SNAPSHOTS)
        self._snapshots.append(self._snapshot(grain_state))

    def _snapshot(self, grain_state: Any) -> dict[str, Any]:
        return {"offset": self._offset, "batches": self._k, "grain": grain_state, "tokens": dict(self._tokens)}

    def _iterator(self) -> Any:
        if self._it is None:
            ds = batch_dataset(
                self.shards,
                self.weights,
                self.shard_rows,
                offset=self._offset,
                layout=self.layout,
                degree=self.context_degree,
                block=self.layout_block,
            )
            self._it = iterate(ds, self.workers, self.prefetch)
            if self._grain_state is not None:
                self._it.set_state(self._grain_state)
            self._closer = weakref.finalize(self, close_iterator, self._it)
        return self._it

    def __next__(self) -> Batch:
        it = self._iterator()
        batch = dict(next(it))
        source = np.asarray(batch.pop("source"))
        rows = np.bincount(source, minlength=len(self.names))
        scale = self.seq_len * self.total_shards // len(self.shards)  # tokens of all shards per local row
        for name, n in zip(self.names, rows):
            self._tokens[name] += int(n) * scale
        self._k += 1
        self._grain_state = it.get_state()
        self._snapshots.append(self._snapshot(self._grain_state))
        return {k: np.asarray(batch[k]) for k in BATCH_KEYS}

    def close(self) -> None:
        """Stop the grain iterator and its worker processes (a later batch starts them again)."""
        if self._closer is None:
            return
        self._closer()
        self._it = self._closer = None
        if self.workers:
            # free the closed iterator's locks and queues now, not in a garbage collection that
            # may fall inside multiprocessing's resource tracker (which then warns of leaks)
            gc.collect()

    # -- state --------------------------------------------------------------------------------

    def _state(self, snap: Mapping[str, Any]) -> dict[str, Any]:
        position = snap["offset"] + snap["batches"] * self.shard_rows  # rows of each shard
        epoch, row = divmod(position, self.rows_per_epoch)
        return {
            "epoch": int(epoch),
            "row": int(row),
            **self.identity,
            "row_shuffle": int(self.identity["shuffle"]),
            "offset": snap["offset"],
            "batches": snap["batches"],
            "grain": snap["grain"],
            "shard_rows": self.shard_rows,
            "workers": self.workers,
            "tokens": dict(snap["tokens"]),
        }

    def state(self) -> dict[str, Any]:
        """The exact position, JSON-able: ``grain`` (grain's iterator state), ``offset`` (the row
        its pipeline starts at) and ``batches`` (handed out since, of ``shard_rows`` rows of each
        shard), ``epoch`` and ``row`` (the
        same position in epochs of :attr:`rows_per_epoch` rows, as :class:`lcx.data.Batches`
        stores it), ``tokens`` (per source, all shards), ``workers``, and the fields that
        identify the stream (checked by :meth:`restore`)."""
        return self._state(self._snapshots[-1])

    def state_before(self, n: int) -> dict[str, Any]:
        """:meth:`state` as it was ``n`` batches ago (at most 7, and not before the stream's
        start or last restore).

        Raises:
          ValueError: ``n`` out of that range.
        """
        if not 0 <= n < len(self._snapshots):
            raise ValueError(
                f"state_before({n}): the stream keeps the states of its last {len(self._snapshots) - 1} batches"
            )
        return self._state(self._snapshots[-1 - n])

    def skip(self, n: int) -> None:
        """Advance by ``n >= 0`` batches (they are built: grain's state moves with them).

        Raises:
          ValueError: ``n < 0``.
        """
        if n < 0:
            raise ValueError(f"can only skip forward, got n={n}")
        for _ in range(n):
            next(self)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume exactly at ``state``: from :meth:`state` (grain's iterator state is set; with
        another ``workers`` or batch size, the pipeline restarts at the same row instead), or the
        ``{epoch, row, ...}`` state of :class:`lcx.data.Batches` (checkpoints written before the
        grain pipeline; one source and one shard only).

        Raises:
          ValueError: ``state`` comes from another stream (seed, shuffle, sequence length,
            corpus, shards, sources or weights differ; names the field) or is out of range; an
            old state for a mixture or a sharded stream.
        """
        if "offset" not in state:
            self._restore_position(state)
            return
        for key in _IDENTITY:
            if key in state and key in self.identity and state[key] != self.identity[key]:
                raise ValueError(
                    f"data state mismatch: checkpoint has {key}={state[key]!r}, this run has {key}={self.identity[key]!r}; "
                    f"resume with the same data config, seed and seq_len"
                )
        offset, batches, grain_state = int(state["offset"]), int(state["batches"]), state.get("grain")
        rows = int(state.get("shard_rows", self.shard_rows))
        if rows != self.shard_rows or int(state.get("workers", -1)) != self.workers or grain_state is None:
            # grain's state counts batches of the old size and records its worker processes:
            # with another batch size or worker count, restart at the same row instead
            offset, batches, grain_state = offset + batches * rows, 0, None
        self._start(offset, grain_state, batches, state.get("tokens") or {})

    def _restore_position(self, state: Mapping[str, Any]) -> None:
        """A :class:`lcx.data.Batches` state: same checks, then the pipeline starts at its row."""
        if len(self.names) != 1 or self.total_shards != 1:
            raise ValueError(
                "data state from before lcx's grain pipeline (epoch and row of one stream): this run reads "
                f"{len(self.names)} sources in {self.total_shards} shards; resume with one source and data.shards=1, "
                "or start a new run (a new checkpoint.dir)"
            )
        position = row_position(state, self.state(), self.rows_per_epoch)
        self._start(position, None, 0, {self.names[0]: position * self.seq_len})

    def resume(self, state: Mapping[str, Any]) -> None:
        """:meth:`restore`, or, for a ``state`` written at another ``seq_len`` (a length-extension
        stage), continue at the same tokens: one source and shard, in the same epoch at the
        same fraction of its tokens (to within one row, as :meth:`lcx.data.Batches.resume`); a
        mixture or sharded stream, at the row holding as many tokens as the old position."""
        old_len = state.get("seq_len")
        if old_len is None or int(old_len) == self.seq_len:
            self.restore(state)
            return
        old_len, tokens = int(old_len), state.get("tokens") or {}
        if "offset" in state and (len(self.names) > 1 or self.total_shards > 1):
            rows = (int(state["offset"]) + int(state["batches"]) * self.shard_rows) * old_len // self.seq_len
        else:
            fraction = min(1.0, int(state["row"]) * old_len / max(1, int(state["num_tokens"])))
            R = self.rows_per_epoch
            rows = int(state["epoch"]) * R + min(R - 1, int(fraction * R))
            tokens = tokens or {
                self.names[0]: int(state["epoch"]) * int(state["num_tokens"]) + int(state["row"]) * old_len
            }
        log.info("sequence length %d -> %d: data continues at row %d", old_len, self.seq_len, rows)
        self._start(rows, None, 0, tokens)


__all__ = ["GrainBatches"]
