"""The report of ``python -m lcx.eval eval=ruler`` (and ``eval=niah``, ``eval=perplexity``):
long-context tasks scored by generation, their effective length, and the loss by position.

:func:`run_generation_eval` reads a checkpoint with its own model, plan and tokenizer, builds
every example first (before the model is loaded; a task that does not fit a length is not run
there, :func:`lcx.evals.runner.fit_grid`, and a length the user asked for that fits no task is
refused), scores the grid (:mod:`lcx.evals`) and writes, in the output directory:

- ``<name>.csv``: one row per (task, length, depth): ``task, seq_len, depth, samples, score,
  max_new_tokens, reason`` (depth empty for a task without one; score RULER's percentage,
  0-100 with 2 decimals; a cell not run has samples 0, score empty and its reason);
- ``<name>_heatmap.png``: mean score by length (columns) and needle depth (rows, the depth
  tasks averaged), plus one row per task without a depth; a cell not run is empty;
- ``<name>.json``: the settings, every cell with its predictions (and the cells not run with
  their reasons, also under ``skipped``), the score by length and by task, ``tasks_by_length``
  (which tasks each length's mean covers), ``complete_lengths`` (where every task ran),
  ``effective_length`` (tokens, or null; over the complete lengths only) and its ``threshold``;
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

from lcx.evals.runner import (
    GenerateFn,
    complete_lengths,
    fit_grid,
    mean_by_length,
    mean_by_task,
    resolve_generator,
    score_cells,
    tasks_by_length,
)
from lcx.evals.scoring import effective_length
from lcx.reports.config import EvalQuery
from lcx.training.retrieval import pyplot, write_grid_png

CSV_FIELDS = ("task", "seq_len", "depth", "samples", "score", "max_new_tokens", "reason")


def write_csv(rows: Sequence[dict[str, Any]], path: str | pathlib.Path) -> None:
    """``rows`` of :func:`lcx.evals.runner.score_cells` (and :func:`lcx.evals.runner.fit_grid`'s
    cells not run) as a CSV of :data:`CSV_FIELDS`: empty where None (a depth-less task's depth, a
    skipped cell's score) or absent (``reason`` of a row that ran)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            w.writerow(["" if r.get(k) is None else r[k] for k in CSV_FIELDS])


def heatmap_grid(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[int], np.ndarray]:
    """``(row labels, lengths, values [rows, lengths])``: the mean score of the depth tasks that
    ran at each depth (``depth 0.25``), then each task without a depth by name; NaN where no cell
    ran (a row with ``score`` None keeps its length and label, empty)."""
    lengths = sorted({int(r["seq_len"]) for r in rows})
    keys = sorted({r["depth"] for r in rows if r["depth"] is not None})
    keys += sorted({r["task"] for r in rows if r["depth"] is None})
    acc: dict[tuple[Any, int], list[float]] = {}
    for r in rows:
        if r["score"] is None:
            continue
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
        v,
        labels,
        lengths,
        path,
        title=title,
        label="score (RULER's, 0-100)",
        ylabel="needle depth / task",
        what="the CSV",
        vmax=100.0,
    )


def summarize(rows: Sequence[dict[str, Any]], tasks: Sequence[str], threshold: float) -> dict[str, Any]:
    """The summary keys of ``<name>.json`` from the cells (those not run included).

    Args:
      rows: :func:`lcx.evals.runner.score_cells`'s rows and :func:`lcx.evals.runner.fit_grid`'s
        rows not run; tasks: the tasks asked for; threshold: the effective length's, percent.

    Returns:
      ``mean_by_length`` (``{"length": percent}``, over the tasks that ran there),
      ``mean_by_task`` (``{task: {"length": percent}}``), ``tasks_by_length`` (``{"length":
      [tasks that ran]}``), ``complete_lengths`` (the lengths where every task ran, ints) and
      ``effective_length`` (:func:`lcx.evals.scoring.effective_length` over the complete lengths
      only; None when no length is complete or none exceeds ``threshold``).
    """
    by_length = mean_by_length(rows)
    complete = complete_lengths(rows, tasks) if tasks else []
    return {
        "mean_by_length": {str(s): v for s, v in by_length.items()},
        "mean_by_task": {t: {str(s): v for s, v in by.items()} for t, by in mean_by_task(rows).items()},
        "tasks_by_length": {str(s): ts for s, ts in tasks_by_length(rows).items()},
        "complete_lengths": complete,
        "effective_length": effective_length({s: by_length[s] for s in complete}, threshold) if complete else None,
    }


def refuse_unfit_lengths(
    skipped: Sequence[dict[str, Any]], ran: Sequence[Any], asked: Sequence[int], tokenizer: str
) -> None:
    """Refuse the lengths the user asked for (``eval.lengths``) at which no task fits.

    Args:
      skipped: :func:`lcx.evals.runner.fit_grid`'s rows not run; ran: its cells (examples with
        ``length``); asked: the lengths asked for, tokens; tokenizer: its name, for the message.

    Raises:
      ValueError: a length asked for that fits none of the tasks: names it, each task's least
        length (as measured on the refused example) and the shortest length any task needs.
    """
    fit = {int(c[0].length) for c in ran}
    bad = [int(s) for s in asked if int(s) not in fit]
    if not bad:
        return
    needs: dict[str, int | None] = {}
    for r in skipped:
        if int(r["seq_len"]) == bad[0]:
            needs.setdefault(r["task"], r["need"])
    said = ", ".join(
        f"{t} at least {n}" if n is not None else f"{t} more (no untied ranking)" for t, n in needs.items()
    )
    known = [n for n in needs.values() if n is not None]
    fix = f"use lengths >= {min(known)}" if known else "use longer lengths"
    raise ValueError(
        f"eval.lengths={list(asked)}: {', '.join(map(str, bad))} tokens fit none of eval.tasks "
        f"(at {bad[0]}, tokenizer {tokenizer}: {said}); drop {'them' if len(bad) > 1 else 'it'} or {fix}"
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
      FileNotFoundError: no checkpoint there. ValueError: a length asked for in ``eval.lengths``
        that fits none of the tasks (:func:`refuse_unfit_lengths`; a length that fits some runs
        those, and the preset's default lengths are never refused), an unknown task, a generator
        that cannot be imported (all before the model is loaded); PlanError: a curve length the
        plan refuses.
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
    cells, skipped = (
        fit_grid(tok, tasks=e.tasks, lengths=lengths, depths=e.depths, samples=e.per_depth, seed=e.seed)
        if e.tasks
        else ([], [])
    )
    if e.lengths is not None and e.tasks:  # the preset's own defaults are never refused
        refuse_unfit_lengths(skipped, cells, lengths, tok.name)
    gen = resolve_generator(generate or e.generator) if cells else None
    docs = []
    if e.perplexity_docs:
        split = {k: data[k] for k in ("val_fraction", "split_seed") if k in data}
        docs = long_documents(tok, e.perplexity_docs, max(lengths) + 1, **split)
    plan = plan_from_dict(run["plan"], default_block=hw.attention_block, default_kernel=hw.attention_kernel)
    mp = bind(plan, devices)
    model, meta = load_model(ckpt, mp, step=step, rope=e.rope)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"{e.name}, {run['model']['name']} step {meta['step']}"
    order = {t: i for i, t in enumerate(e.tasks)}
    rows = score_cells(model, mp, tok, cells, generate=gen) if gen is not None else []
    rows = sorted(
        [*rows, *skipped],
        key=lambda r: (order[r["task"]], lengths.index(r["seq_len"]), -1 if r["depth"] is None else r["depth"]),
    )
    report: dict[str, Any] = {
        "eval": e.name,
        "checkpoint": str(ckpt),
        "step": int(meta["step"]),
        "model": meta["config"]["model"],
        "rope": e.rope,
        "plan": plan.name,
        "tokenizer": tok.name,
        "train_seq_len": S,
        "tasks": list(e.tasks),
        "lengths": lengths,
        "depths": [float(d) for d in e.depths],
        "per_depth": e.per_depth,
        "seed": e.seed,
        "score_unit": "percent (RULER's 0-100, rounded to 2 decimals per task)",
        "threshold": e.threshold,
        **summarize(rows, e.tasks, e.threshold),
        "skipped": _skipped_summary(skipped),
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


def _skipped_summary(skipped: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``{task, seq_len, reason}`` per (task, length) not run, in grid order."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for r in skipped:
        out.setdefault((r["task"], r["seq_len"]), {k: r[k] for k in ("task", "seq_len", "reason")})
    return list(out.values())


__all__ = [
    "CSV_FIELDS",
    "heatmap_grid",
    "refuse_unfit_lengths",
    "run_generation_eval",
    "summarize",
    "write_csv",
    "write_heatmap",
    "write_perplexity",
]
