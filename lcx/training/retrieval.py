"""Retrieval evaluation: passkey / needle-in-a-haystack accuracy across context lengths and depths.

The task is :mod:`lcx.data.passkey` (Mohtashami & Jaggi 2023, arXiv:2305.16300): a pass key
hidden at a depth in filler text, asked for at the end. The model reads each row once
(teacher forcing, as the answer digits follow the question in the row); a row counts as
retrieved when the argmax at every answer position is the right digit ("exact match").
Rows come from the evaluation stream of :class:`lcx.data.passkey.PasskeyEval`, independent of
every training seed.

``python -m lcx.eval checkpoint.dir=D`` (``lcx/eval.py``) runs :func:`passkey_grid` on a
checkpoint and writes ``eval.json`` and a heatmap PNG (:func:`write_heatmap`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import equinox as eqx
import numpy as np

from lcx.data.passkey import PasskeyEval, min_seq_len
from lcx.models import Llama
from lcx.sharding import MeshPlan
from lcx.sharding.layout import undo_layout
from lcx.training.loss import VocabTiles, token_nll, vocab_tiled_predictions
from lcx.training.stepping import put_batch


def passkey_grid(
    model: Llama,
    mp: MeshPlan,
    *,
    lengths: Sequence[int],
    depths: Sequence[float],
    per_depth: int,
    global_batch: int,
    digits: int = 5,
    seed: int = 1,
    vocab_tiling: int = 1,
) -> list[dict[str, Any]]:
    """Passkey retrieval of ``model`` at every (length, depth).

    Args:
      model: a :class:`lcx.models.Llama` placed on ``mp``.
      mp: bound plan; every length must suit it (checked with ``Plan.validate``).
      lengths: sequence lengths in tokens.
      depths: key depths in [0, 1] (0: right after the intro, 1: just before the question).
      per_depth: rows per (length, depth).
      global_batch: rows per forward pass (a multiple of the plan's batch sharding).
      digits: pass key length.
      seed: evaluation seed (rows are a pure function of it).
      vocab_tiling: tiles of the local sequence the output head runs in (the training run's
        ``memory.vocab_tiling``; :func:`lcx.training.loss.vocab_tiled_predictions`): 1 forms
        the whole logits ``[B, S, V]``.

    Returns:
      One dict per (length, depth), length-major: ``seq_len``, ``depth``, ``rows``,
      ``exact_match`` (fraction of rows with every digit right), ``digit_accuracy``,
      ``answer_nll`` (nats per answer digit), ``key_to_answer_tokens`` (mean distance).

    Raises:
      ValueError / PlanError: a length shorter than the task needs, or one the plan refuses, or
        a ``vocab_tiling`` that does not divide a length's local sequence.
    """
    out = []
    for S in lengths:
        S = int(S)
        if S < min_seq_len(digits):
            raise ValueError(f"eval length {S} is shorter than the passkey task needs ({min_seq_len(digits)} tokens)")
        check_length(model, mp, S, global_batch=global_batch, vocab_tiling=vocab_tiling)
        att = mp.plan.attention
        ev = PasskeyEval(
            seq_len=S,
            global_batch=global_batch,
            layout=att.layout,
            context_degree=mp.context_degree,
            layout_block=max(att.block_q, att.block_kv),
            digits=digits,
            depths=[float(d) for d in depths],
            per_depth=per_depth,
            seed=seed,
        )
        preds, nlls = predict_rows(model, mp, ev, vocab_tiling=vocab_tiling)
        by_depth: dict[float, list] = {}
        for ex, pred, nll in zip(ev.examples, preds, nlls):  # padding rows of the last batch drop out here
            ok = pred[ex.answer_pos] == ex.arrays["targets"][ex.answer_pos]
            by_depth.setdefault(ex.depth, []).append(
                (ok, float(nll[ex.answer_pos].mean()), int(ex.answer_pos[0] - ex.key_pos))
            )
        for depth, res in sorted(by_depth.items()):
            ok = np.array([r[0] for r in res])
            out.append(
                {
                    "seq_len": S,
                    "depth": depth,
                    "rows": len(res),
                    "exact_match": float(ok.all(axis=1).mean()),
                    "digit_accuracy": float(ok.mean()),
                    "answer_nll": float(np.mean([r[1] for r in res])),
                    "key_to_answer_tokens": int(np.mean([r[2] for r in res])),
                }
            )
    return out


def check_length(model: Llama, mp: MeshPlan, seq_len: int, *, global_batch: int, vocab_tiling: int = 1) -> None:
    """Refuse an evaluation length the plan cannot run (``Plan.validate``) or whose local
    sequence ``vocab_tiling`` does not divide (:func:`lcx.training.memory.check_tiling`).

    Raises:
      PlanError / ValueError: naming the length and the fix.
    """
    from lcx.training.config import MemoryOptions
    from lcx.training.memory import check_tiling

    degree = mp.context_degree
    mp.plan.validate(mp.n_devices, dims=model.config.dims(), seq_len=seq_len, global_batch=global_batch)
    check_tiling(MemoryOptions(vocab_tiling=vocab_tiling), seq_len // degree, seq_len=seq_len, context_degree=degree)


def predict_rows(
    model: Llama, mp: MeshPlan, batches: Iterable[Mapping[str, np.ndarray]], *, vocab_tiling: int = 1
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Teacher-forced argmax and target NLL of every row of ``batches``, in the original order.

    Args:
      model: placed on ``mp``; mp: the bound plan.
      batches: laid-out host batches (the five :data:`lcx.data.BATCH_KEYS` arrays ``[B, S]``, in
        the plan's layout).
      vocab_tiling: tiles of the local sequence the output head runs in (1: whole logits).

    Returns:
      ``(predictions, nll)``: one int32 ``[S]`` and one float32 ``[S]`` (nats) array per row,
      un-laid-out (position order).
    """
    layout, degree = mp.plan.attention.layout, mp.context_degree
    sharding = mp.activation_sharding(("batch", "seq"))

    @eqx.filter_jit
    def forward(m, batch):
        if vocab_tiling > 1:
            h = m.features(batch["tokens"], batch["positions"], batch["segment_ids"], plan=mp)
            tiles = VocabTiles(vocab_tiling, degree, mp.constrain)
            return vocab_tiled_predictions(h, m.output_head(), batch["targets"], tiles)
        logits = m(batch["tokens"], batch["positions"], batch["segment_ids"], plan=mp)
        return logits.argmax(-1), token_nll(logits, batch["targets"])

    preds: list[np.ndarray] = []
    nlls: list[np.ndarray] = []
    for batch in batches:
        p, n = forward(model, put_batch(batch, sharding))
        ids = {"positions": batch["positions"], "segment_ids": batch["segment_ids"]}  # balanced: per row
        preds.extend(np.asarray(undo_layout(np.asarray(p), layout, degree, axis=-1, **ids)))
        nlls.extend(np.asarray(undo_layout(np.asarray(n), layout, degree, axis=-1, **ids)))
    return preds, nlls


def grid(results: Sequence[dict[str, Any]], key: str = "exact_match") -> tuple[list[int], list[float], np.ndarray]:
    """``(lengths, depths, values [len(depths), len(lengths)])`` of one metric of :func:`passkey_grid`."""
    lengths = sorted({r["seq_len"] for r in results})
    depths = sorted({r["depth"] for r in results})
    v = np.full((len(depths), len(lengths)), np.nan)
    for r in results:
        v[depths.index(r["depth"]), lengths.index(r["seq_len"])] = r[key]
    return lengths, depths, v


def write_heatmap(results: Sequence[dict[str, Any]], path, *, title: str = "passkey retrieval") -> str:
    """Exact match by depth (rows, 0 at the top) and length (columns) as a labelled PNG at
    ``path`` (:func:`write_grid_png`).

    Returns:
      ``"matplotlib"``: the writer used (recorded in ``eval.json`` as ``heatmap_writer``).

    Raises:
      ImportError: matplotlib is not installed; names ``pip install 'lcx[plots]'``.
    """
    lengths, depths, v = grid(results)
    return write_grid_png(v, [f"{d:g}" for d in depths], lengths, path, title=title, label="exact match")


def pyplot(path, what: str = "eval.json"):
    """matplotlib's ``pyplot`` on the file-only Agg backend (the ``plots`` extra; imported only
    when a plot is written).

    Raises:
      ImportError: matplotlib is not installed; names ``pip install 'lcx[plots]'`` and ``what``
        (the file written without it).
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            f"writing {path} needs matplotlib: pip install 'lcx[plots]' ({what} is written without it)"
        ) from e
    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    return plt


def write_grid_png(
    v: np.ndarray,
    rows: Sequence[str],
    lengths: Sequence[int],
    path,
    *,
    title: str,
    label: str,
    ylabel: str = "key depth",
    what: str = "eval.json",
    vmax: float = 1.0,
) -> str:
    """A heat map of ``v`` (``[len(rows), len(lengths)]``, values in [0, vmax], NaN: empty cell)
    with its values written in the cells, as a PNG at ``path``.

    Args:
      rows: the row labels (top to bottom); lengths: the columns' context lengths in tokens.
      title, label, ylabel: the plot's title, colour-bar label and y-axis label.
      what: the file written without matplotlib, for the error.
      vmax: the top of the colour scale (1: fractions; 100: percentages).

    Returns:
      ``"matplotlib"``.

    Raises:
      ImportError: matplotlib is not installed (:func:`pyplot`).
    """
    plt = pyplot(path, what)
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.45 * len(rows)))
    im = ax.imshow(v, cmap="RdYlGn", vmin=0, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(s) for s in lengths])
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel(ylabel)
    for i in range(len(rows)):
        for j in range(len(lengths)):
            if np.isfinite(v[i, j]):
                ax.text(j, i, f"{v[i, j]:.2f}" if vmax <= 1 else f"{v[i, j]:.1f}", ha="center", va="center", fontsize=8)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label=label)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"


__all__ = [
    "check_length",
    "grid",
    "passkey_grid",
    "predict_rows",
    "pyplot",
    "write_grid_png",
    "write_heatmap",
]
