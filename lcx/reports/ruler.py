"""The report of ``python -m lcx.eval eval=ruler`` (and ``eval=niah``, ``eval=perplexity``):
long-context tasks scored by generation, their effective length, and the loss by position.

:func:`run_generation_eval` reads a checkpoint with its own model, plan and tokenizer, builds
every example first (a length too short for a task is refused before the model is loaded), scores
the grid (:mod:`lcx.evals`) and writes, in the output directory:

- ``<name>.csv``: one row per (task, length, depth): ``task, seq_len, depth, samples, score,
  max_new_tokens`` (depth empty for a task without one; score a fraction, 0-1);
- ``<name>_heatmap.png``: mean score by length (columns) and needle depth (rows, the depth
  tasks averaged), plus one row per task without a depth;
- ``<name>.json``: the settings, every cell with its predictions, the mean by length and by
  task, ``effective_length`` (tokens, or null) and its ``threshold``;
- with ``eval.perplexity_docs > 0``: ``perplexity_by_position.csv`` (``bin_start, bin_end,
  tokens, nll, perplexity``) and ``perplexity_by_position.png`` (the curve, the training length
  marked), from :func:`lcx.training.perplexity.nll_by_position`.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from lcx.evals.runner import GenerateFn, build_grid, mean_by_length, mean_by_task, resolve_generator, score_cells
from lcx.evals.scoring import effective_length
from lcx.reports.config import EvalQuery
from lcx.training.retrieval import pyplot, write_grid_png

CSV_FIELDS = ("task", "seq_len", "depth", "samples", "score", "max_new_tokens")


def write_csv(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> None:
    """``rows`` of :func:`lcx.evals.runner.score_cells` as a CSV of :data:`CSV_FIELDS` (depth
    empty where None)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            w.writerow(["" if r[k] is None else r[k] for k in CSV_FIELDS])


def heatmap_grid(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[int], np.ndarray]:
    """``(row labels, lengths, values [rows, lengths])``: the mean score of the depth tasks at
    each depth (``depth 0.25``), then each task without a depth by name; NaN where no cell."""
    lengths = sorted({int(r["seq_len"]) for r in rows})
    keys = sorted({r["depth"] for r in rows if r["depth"] is not None})
    keys += sorted({r["task"] for r in rows if r["depth"] is None})
    acc: dict[tuple[Any, int], list[float]] = {}
    for r in rows:
        k = r["depth"] if r["depth"] is not None else r["task"]
        acc.setdefault((k, int(r["seq_len"])), []).append(float(r["score"]))
    v = np.full((len(keys), len(lengths)), np.nan)
    for (k, s), xs in acc.items():
        v[keys.index(k), lengths.index(s)] = float(np.mean(xs))
    labels = [f"depth {k:g}" if isinstance(k, float) else str(k) for k in keys]
    return labels, lengths, v


def write_heatmap(rows: Sequence[dict[str, Any]], path: str | pathlib.Path, *, title: str) -> str:
    """The heat map of :func:`heatmap_grid` as a PNG (:func:`lcx.training.retrieval.write_grid_png`).

    Raises:
      ImportError: matplotlib is not installed (names the ``plots`` extra).
    """
    labels, lengths, v = heatmap_grid(rows)
    return write_grid_png(
        v, labels, lengths, path, title=title, label="score", ylabel="needle depth / task", what="the CSV"
    )


def write_perplexity(curve: dict[str, Any], out_dir: pathlib.Path, *, train_seq_len: int, title: str) -> None:
    """``perplexity_by_position.csv`` and ``.png`` of :func:`lcx.training.perplexity.nll_by_position`'s
    ``curve``; the PNG marks ``train_seq_len`` (tokens).

    Raises:
      ImportError: matplotlib is not installed (after the CSV is written).
    """
    with open(out_dir / "perplexity_by_position.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["bin_start", "bin_end", "tokens", "nll", "perplexity"])
        for a, b, n, x in zip(curve["bin_start"], curve["bin_end"], curve["tokens"], curve["nll"]):
            w.writerow([a, b, n, x, math.exp(x)])
    plt = pyplot(out_dir / "perplexity_by_position.png", "perplexity_by_position.csv")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    mid = [(a + b) / 2 for a, b in zip(curve["bin_start"], curve["bin_end"])]
    ax.plot(mid, curve["nll"], marker="o")
    ax.axvline(train_seq_len, color="gray", linestyle="--", label=f"training length {train_seq_len}")
    ax.set_xlabel("token position")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "perplexity_by_position.png", dpi=100)
    plt.close(fig)


def run_generation_eval(
    query: EvalQuery, out_dir: str | pathlib.Path, devices, generate: GenerateFn | None = None
) -> dict[str, Any]:
    """Evaluate the checkpoint ``query.checkpoint`` names on ``query.eval``'s tasks and curve;
    write the files of the module docstring.

    Args:
      query: ``eval.task == "generation"``.
      out_dir: the output directory (created).
      devices: the devices to bind the checkpoint's plan to.
      generate: the generation function (None: ``eval.generator``).

    Returns:
      the JSON report (also ``<name>.json``).

    Raises:
      FileNotFoundError: no checkpoint there. ValueError: a length too short for a task, an
        unknown task, a generator that cannot be imported (all before the model is loaded);
        PlanError: a curve length the plan refuses.
    """
    from lcx.data.tokenizers import get_tokenizer
    from lcx.evals.haystack import long_documents
    from lcx.sharding import bind
    from lcx.sharding.config import plan_from_dict
    from lcx.training.perplexity import nll_by_position
    from lcx.training.resume import checkpoint_run, load_model

    ckpt, e, hw = query.checkpoint.dir, query.eval, query.hardware
    step, run = checkpoint_run(ckpt, query.checkpoint.step)
    data = run.get("data") or {}
    tok = get_tokenizer(data.get("tokenizer", "byte"), add_bos=data.get("add_bos"), add_eos=data.get("add_eos"))
    S = int(run["train"]["seq_len"])
    lengths = [int(s) for s in e.lengths] if e.lengths is not None else [S // 2, S, 2 * S]
    samples = dict(samples=e.per_depth, seed=e.seed)
    cells = build_grid(tok, tasks=e.tasks, lengths=lengths, depths=e.depths, **samples) if e.tasks else []
    gen = resolve_generator(generate or e.generator) if cells else None
    docs = []
    if e.perplexity_docs:
        split = {k: data[k] for k in ("val_fraction", "split_seed") if k in data}
        docs = long_documents(tok, e.perplexity_docs, max(lengths) + 1, **split)
    plan = plan_from_dict(run["plan"], default_block=hw.attention_block, default_kernel=hw.attention_kernel)
    mp = bind(plan, devices)
    model, meta = load_model(ckpt, mp, step=step)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"{e.name}, {run['model']['name']} step {meta['step']}"
    rows = score_cells(model, mp, tok, cells, generate=gen) if gen is not None else []
    by_length = mean_by_length(rows) if rows else {}
    report: dict[str, Any] = {
        "eval": e.name,
        "checkpoint": str(ckpt),
        "step": int(meta["step"]),
        "model": run["model"],
        "plan": plan.name,
        "tokenizer": tok.name,
        "train_seq_len": S,
        "tasks": list(e.tasks),
        "lengths": lengths,
        "depths": [float(d) for d in e.depths],
        "per_depth": e.per_depth,
        "seed": e.seed,
        "threshold": e.threshold,
        "mean_by_length": {str(s): v for s, v in by_length.items()},
        "mean_by_task": {t: {str(s): v for s, v in by.items()} for t, by in mean_by_task(rows).items()},
        "effective_length": effective_length(by_length, e.threshold) if by_length else None,
        "results": rows,
    }
    if rows:
        write_csv(rows, out_dir / f"{e.name}.csv")
    if docs:
        batch = e.global_batch if e.global_batch is not None else int(run["train"]["global_batch"])
        tiling = int((run.get("memory") or {}).get("vocab_tiling", 1))
        report["perplexity"] = nll_by_position(
            model, mp, docs, bins=e.perplexity_bins, global_batch=batch, vocab_tiling=tiling
        )
    (out_dir / f"{e.name}.json").write_text(json.dumps(report, indent=2))
    if rows:
        write_heatmap(rows, out_dir / f"{e.name}_heatmap.png", title=title)
    if docs:
        write_perplexity(report["perplexity"], out_dir, train_seq_len=S, title=f"loss by position, {title}")
    return report


__all__ = ["CSV_FIELDS", "heatmap_grid", "run_generation_eval", "write_csv", "write_heatmap", "write_perplexity"]
