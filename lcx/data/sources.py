"""The registry of data sources and the trainer's single entry, :func:`make_data`.

A source is a function ``build(data, spec: BatchSpec) -> Data`` (:mod:`lcx.data.stream`) of its
typed config (:mod:`lcx.data.config`); a new one is a module plus one line in :data:`SOURCES`,
its config class in :data:`lcx.data.config.DATA_CONFIGS` and its ``conf/data/<name>.yaml``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from lcx.data.config import DataConfig
from lcx.data.corpus_source import corpus_data
from lcx.data.passkey import passkey_data
from lcx.data.stream import BatchSpec, Data
from lcx.sharding.layout import BALANCED_BLOCK


def tasks_data(data: Any, spec: BatchSpec) -> Data:
    """``data=tasks``: :func:`lcx.evals.training_rows.tasks_data`, looked up when called. The rows
    are built by the evaluation tasks themselves (their ``train`` split), and :mod:`lcx.evals`
    sits above :mod:`lcx.data` (it reads the tokenizers and the corpus): the one source reached
    through importlib, as a plan reaches the strategy registry."""
    return importlib.import_module("lcx.evals.training_rows").tasks_data(data, spec)


SOURCES: dict[str, Callable[[Any, BatchSpec], Data]] = {
    "stdlib": corpus_data,  # the embedded Python standard library sources
    "stdlib_bpe": corpus_data,  # the same, in the embedded BPE's tokens (lcx.data.tokenizers.STDLIB_BPE)
    "text": corpus_data,  # files, globs or directories in data.paths, any format (by suffix)
    "jsonl": corpus_data,  # data=text with data.format=jsonl
    "parquet": corpus_data,  # data=text with data.format=parquet
    "arrayrecord": corpus_data,  # data=text with data.format=arrayrecord
    "passkey": passkey_data,  # the synthetic retrieval task (lcx.data.passkey)
    "tasks": tasks_data,  # the long-context tasks' formats mixed with the corpus (lcx.evals.training_rows)
}


def make_data(
    data: DataConfig,
    *,
    seq_len: int,
    global_batch: int,
    layout: str = "contiguous",
    context_degree: int = 1,
    seed: int = 0,
    val_global_batch: int | None = None,
    layout_block: int = BALANCED_BLOCK,
    process_shard: tuple[int, int] = (0, 1),
) -> Data:
    """Build training and validation batches from a data config (the trainer's single entry).

    Every check runs here, before anything compiles.

    Args:
      data: the typed ``data`` config (:mod:`lcx.data.config`); its ``name`` picks the source in
        :data:`SOURCES` (``stdlib`` | ``stdlib_bpe`` | ``text`` | ``jsonl`` | ``parquet`` |
        ``arrayrecord`` | ``passkey``), the other fields are the source's
        (:func:`lcx.data.corpus_source.corpus_data`, :func:`lcx.data.passkey.passkey_data`).
      seq_len: S, tokens per row.
      global_batch: B, rows per training batch.
      layout: ``"contiguous"``, ``"zigzag"`` or ``"balanced"``.
      context_degree: context-parallel degree P.
      seed: training shuffle seed.
      val_global_batch: rows per validation batch; defaults to ``global_batch``.
      layout_block: the kernels' tile in tokens (the balanced layout's shortest chunk).
      process_shard: ``(index, count)``: this process holds part ``index`` of ``count`` equal
        parts of each batch's rows (:attr:`lcx.data.BatchSpec.process_shard`); ``(0, 1)``: all.

    Returns:
      :class:`lcx.data.stream.Data` ``(train, val, tokenizer)``.

    Raises:
      ValueError, FileNotFoundError: an unknown ``data.name`` (names the known ones), and every
        error of the source (bad sizes or layout, missing paths, ...).
    """
    if data.name not in SOURCES:
        raise ValueError(f"unknown data.name {data.name!r}; use data={', data='.join(SOURCES)}")
    spec = BatchSpec(
        seq_len=int(seq_len),
        global_batch=int(global_batch),
        layout=layout,
        context_degree=int(context_degree),
        seed=int(seed),
        val_global_batch=int(global_batch if val_global_batch is None else val_global_batch),
        layout_block=int(layout_block),
        process_shard=(int(process_shard[0]), int(process_shard[1])),
    )
    return SOURCES[data.name](data, spec)


__all__ = ["SOURCES", "make_data"]
