"""The ``data=stdlib`` / ``data=text`` source (and their presets) (:func:`corpus_data`): each source's corpus read,
split by document into training and validation, the training documents split into per-process
shards and tokenized (through grain), then packed into the grain training stream
(:class:`lcx.data.grain_stream.GrainBatches`) and a fixed evaluation pass
(:class:`lcx.data.EvalBatches`, in memory: every process holds all of it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lcx.data.config import StdlibData, TextData, mixture_sources
from lcx.data.grain_pipeline import tokenize
from lcx.data.grain_stream import GrainBatches
from lcx.data.order import EndlessRows
from lcx.data.packing import Packer
from lcx.data.pipeline import EvalBatches, check_batch_args, load_corpus, split_documents
from lcx.data.stream import BatchSpec, Data
from lcx.data.tokenizers import data_tokenizer

MIXTURE_SALT = 1 << 31
"""Added to a mixture source's index in its seed words, so that no source's order coincides with
another stream's (the single-source stream's words are ``(seed, epoch)``)."""
SHARD_SALT = 1 << 32
"""Likewise for a shard's index."""


def shard_plan(shards: int | None, process_shard: tuple[int, int]) -> tuple[int, list[int]]:
    """``(N, held)``: the run's data shards and those this process reads.

    Args:
      shards: ``data.shards`` (None: one per part of the batch the processes hold).
      process_shard: ``(index, count)`` of this process's part of the batch rows
        (:attr:`lcx.data.BatchSpec.process_shard`).

    Raises:
      ValueError: processes that hold different rows and a ``data.shards`` other than their
        count (names both).
    """
    index, count = process_shard
    if count > 1:
        if shards not in (None, count):
            raise ValueError(
                f"data.shards={shards}: the processes hold {count} different parts of each batch, and each reads its "
                f"own shard; set data.shards=null (or {count})"
            )
        return count, [index]
    n = shards or 1
    return n, list(range(n))


def keys(seed: int, source: int | None, shard: int | None) -> tuple[int, ...]:
    """The seed words of a source's row order (:class:`lcx.data.order.EndlessRows`): ``(seed,)``
    for one source and one shard (the default run's stream), with the salted source and/or
    shard index appended otherwise."""
    out = [int(seed)]
    if source is not None:
        out.append(MIXTURE_SALT + source)
    if shard is not None:
        out.append(SHARD_SALT + shard)
    return tuple(out)


def corpus_data(data: StdlibData | TextData, spec: BatchSpec) -> Data:
    """The ``data=stdlib`` / ``data=text`` source: grain training batches and an evaluation pass.

    Each source (one, or the entries of ``data.mixture``, :func:`lcx.data.config.mixture_sources`)
    is read (:func:`lcx.data.pipeline.load_corpus`); its non-empty documents are split into
    training and validation (:func:`lcx.data.pipeline.split_documents`, ``val_fraction`` and
    ``split_seed`` of the source); the training documents are dealt into ``N`` shards
    (``train[s::N]``), and only the shards this process reads (:func:`shard_plan`) and the
    validation documents are tokenized. One source and one shard: the batches of
    :class:`lcx.data.Batches` over the same documents, bit for bit.

    Args:
      data: the ``data`` config (:class:`lcx.data.config.StdlibData` / ``TextData``): sources
        (``paths``, ``format``, ``text_field``, ``document``: :func:`lcx.data.pipeline.load_corpus`),
        ``tokenizer`` with ``add_bos`` / ``add_eos`` (:func:`lcx.data.tokenizers.data_tokenizer`), the split, and the pipeline's ``workers``, ``prefetch``, ``shards``.
      spec: sizes, layout and seed of the batches, and this process's part of the batch rows.

    Returns:
      :class:`lcx.data.Data`: ``train`` a :class:`lcx.data.grain_stream.GrainBatches` of
      ``global_batch * held / N`` rows per batch; ``val`` an :class:`lcx.data.EvalBatches` of
      every source's validation documents (in source order).

    Raises:
      ValueError, FileNotFoundError: bad sizes or layout, unknown tokenizer, missing or
        unreadable paths, an empty corpus, fewer than 2 non-empty documents in a source, a shard
        without a document, a ``global_batch`` not divisible by the shards, a bad
        ``data.shards``.
    """
    check_batch_args(spec.seq_len, spec.global_batch, spec.layout, spec.context_degree)
    check_batch_args(spec.seq_len, spec.val_global_batch, spec.layout, spec.context_degree)
    tokenizer = data_tokenizer(data)
    total, held = shard_plan(data.shards, spec.process_shard)
    sources = mixture_sources(data)
    mixed = len(sources) > 1
    shards: list[list[EndlessRows]] = [[] for _ in held]
    val_docs: list[np.ndarray] = []
    num_docs = 0
    for j, (name, _, cfg) in enumerate(sources):
        texts = [t for t in load_corpus(cfg).documents if t]  # empty documents hold no token
        train_idx, val_idx = split_documents(len(texts), cfg.val_fraction, cfg.split_seed)
        if len(train_idx) < total:
            raise ValueError(
                f"source {name!r} has {len(train_idx)} training documents for {total} data shards (each process "
                f"reads its own documents); add documents or lower data.shards"
            )
        num_docs += len(train_idx)
        mine = [np.asarray(train_idx[s::total]) for s in held]
        wanted = [int(i) for i in (*np.concatenate(mine), *val_idx)]
        tokens = dict(zip(wanted, tokenize([texts[i] for i in wanted], tokenizer, data.workers)))
        for pos, (s, idx) in enumerate(zip(held, mine)):
            packer = Packer(_docs(tokens, idx), spec.seq_len)
            shards[pos].append(
                EndlessRows(packer, keys(spec.seed, j if mixed else None, s if total > 1 else None), source=j)
            )
        val_docs += _docs(tokens, val_idx)
    train = GrainBatches(
        shards,
        names=[name for name, _, _ in sources],
        weights=[w for _, w, _ in sources],
        total_shards=total,
        identity={"seed": spec.seed, "shuffle": 1, "num_docs": num_docs},
        workers=data.workers,
        prefetch=data.prefetch,
        **spec.rows(),
    )
    val = EvalBatches(val_docs, **spec.rows(val=True))
    return Data(train, val, tokenizer)


def _docs(tokens: dict[int, np.ndarray], idx: Sequence[int] | np.ndarray) -> list[np.ndarray]:
    return [tokens[int(i)] for i in idx]


__all__ = ["MIXTURE_SALT", "SHARD_SALT", "corpus_data", "keys", "shard_plan"]
