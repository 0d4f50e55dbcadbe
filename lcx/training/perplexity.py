"""Perplexity by position: the loss of long documents binned by token position.

The curve a length extension is judged by without any task (e.g. YaRN, arXiv:2309.00071,
figure 1; LongRoPE): each document is read once, teacher-forced, as one row of ``seq_len``
tokens under the run's plan (its layout, strategy and vocabulary tiling;
:func:`lcx.training.retrieval.predict_rows`), and the target NLL of every position is averaged
over the documents within equal bins of positions. A model that uses its context has a loss
that falls, or stays flat, with position; past the length it handles the loss rises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lcx.data.packing import BATCH_KEYS
from lcx.data.stream import lay_out
from lcx.models import Llama
from lcx.sharding import MeshPlan
from lcx.training.retrieval import check_length, predict_rows


def document_rows(documents: Sequence[np.ndarray], global_batch: int) -> list[dict[str, np.ndarray]]:
    """Host batches of ``global_batch`` rows, one document per row: ``tokens = doc[:-1]``,
    ``targets = doc[1:]``, positions ``0..S-1``, one segment, every token in the loss; the last
    batch is padded with copies of its last row whose loss mask is zero. In position order.

    Args:
      documents: int ``[S + 1]`` arrays, all of one length.

    Raises:
      ValueError: no document, or documents of different lengths.
    """
    sizes = {int(d.size) for d in documents}
    if len(sizes) != 1:
        raise ValueError(f"perplexity rows need documents of one length, got lengths {sorted(sizes)}")
    S = sizes.pop() - 1
    rows = [
        {
            "tokens": d[:-1].astype(np.int32),
            "targets": d[1:].astype(np.int32),
            "positions": np.arange(S, dtype=np.int32),
            "segment_ids": np.ones(S, np.int32),
            "loss_mask": np.ones(S, np.float32),
        }
        for d in documents
    ]
    out = []
    for i in range(0, len(rows), global_batch):
        chunk = rows[i : i + global_batch]
        pad = global_batch - len(chunk)
        batch = {k: np.stack([r[k] for r in chunk + [chunk[-1]] * pad]) for k in BATCH_KEYS}
        if pad:
            batch["loss_mask"][-pad:] = 0.0
        out.append(batch)
    return out


def nll_by_position(
    model: Llama,
    mp: MeshPlan,
    documents: Sequence[np.ndarray],
    *,
    bins: int,
    global_batch: int,
    vocab_tiling: int = 1,
) -> dict[str, Any]:
    """Mean target NLL (nats/token) of ``documents`` in ``bins`` equal bins of position.

    Args:
      model: placed on ``mp``; mp: the bound plan (the length is checked against it first).
      documents: int ``[S + 1]`` token arrays of one length (S inputs, S targets each).
      bins: position bins, ``1 <= bins <= S``; bin ``j`` holds positions
        ``[j S / bins, (j + 1) S / bins)`` (rounded down).
      global_batch: rows per forward pass (a multiple of the plan's batch sharding).
      vocab_tiling: the run's ``memory.vocab_tiling``.

    Returns:
      ``seq_len`` (S), ``documents``, ``bin_start`` / ``bin_end`` (positions, end exclusive),
      ``nll`` (mean nats per token in each bin), ``tokens`` (tokens per bin, all documents).

    Raises:
      ValueError / PlanError: a bad ``bins``, documents of different lengths, or a length the
        plan or the tiling refuses.
    """
    batches = document_rows(documents, global_batch)
    S = batches[0]["tokens"].shape[1]
    if not 1 <= bins <= S:
        raise ValueError(f"eval.perplexity_bins={bins}: must lie in [1, {S}] (positions of a row)")
    check_length(model, mp, S, global_batch=global_batch, vocab_tiling=vocab_tiling)
    att = mp.plan.attention
    laid = [lay_out(b, att.layout, mp.context_degree, max(att.block_q, att.block_kv)) for b in batches]
    _, nlls = predict_rows(model, mp, laid, vocab_tiling=vocab_tiling)
    nll = np.stack(nlls[: len(documents)])  # [documents, S]; padding rows dropped
    edges = (np.arange(bins + 1) * S) // bins
    return {
        "seq_len": int(S),
        "documents": len(documents),
        "bin_start": [int(a) for a in edges[:-1]],
        "bin_end": [int(b) for b in edges[1:]],
        "nll": [float(nll[:, a:b].mean()) for a, b in zip(edges[:-1], edges[1:])],
        "tokens": [int(nll[:, a:b].size) for a, b in zip(edges[:-1], edges[1:])],
    }


__all__ = ["document_rows", "nll_by_position"]
