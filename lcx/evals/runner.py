"""A grid of long-context tasks run through a generation function and scored.

:func:`run_tasks` builds every example of the grid (task x length x depth x sample) first, so a
length too short for a task is refused before anything compiles (:func:`build_grid`; the
evaluation report instead marks such a (task, length) as not run: :func:`fit_grid`), then
generates each cell's answers greedily with a :class:`GenerateFn` (by default
``lcx.generate.generate``, resolved when first needed: :func:`resolve_generator`) and scores them
by the task's RULER rule (:mod:`lcx.evals.scoring`): per sample a fraction, per cell and per task
RULER's percentage with 2 decimals.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lcx.data.tokenizers import Tokenizer
from lcx.evals.prompt import Example, LengthTooShort
from lcx.evals.scoring import ruler_score, score
from lcx.evals.tasks import Task, get_task

DEFAULT_GENERATOR = "lcx.generate:generate"
"""``module:function`` of the generation function used when none is given (``eval.generator``)."""


@runtime_checkable
class GenerateFn(Protocol):
    """The signature of ``lcx.generate.generate``: continue each prompt by ``max_new_tokens``
    tokens under the plan (:meth:`__call__`)."""

    def __call__(
        self,
        model: Any,
        prompts: Sequence[np.ndarray],
        *,
        plan: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        key: Any = None,
    ) -> Any:
        """Generate.

        Args:
          model: the model, placed on ``plan``.
          prompts: one int ``[T_i]`` token array per row (lengths may differ).
          plan: the bound plan (:class:`lcx.sharding.MeshPlan`).
          max_new_tokens: N, tokens to generate per row.
          temperature: 0.0: greedy (argmax); top_p: nucleus mass; key: PRNG key when sampling.

        Returns:
          int32 ``[len(prompts), N]`` generated token ids.
        """


def resolve_generator(spec: str | GenerateFn | None = None) -> GenerateFn:
    """The generation function ``spec`` names: a callable as given, else ``module:function``
    imported now (None: :data:`DEFAULT_GENERATOR`).

    Raises:
      ValueError: ``spec`` not ``module:function``, the module cannot be imported (names it and
        the fix), or the attribute is not callable.
    """
    if callable(spec):
        return spec
    spec = spec or DEFAULT_GENERATOR
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"eval.generator={spec!r}: write module:function, e.g. {DEFAULT_GENERATOR}")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(
            f"eval.generator={spec!r}: cannot import {module} ({e}); generation-scored tasks need a "
            f"generation function: install an lcx with lcx.generate, or name your own module:function "
            f"with the signature of lcx.evals.GenerateFn"
        ) from e
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ValueError(f"eval.generator={spec!r}: {module} has no function {attr!r}")
    return fn


def decode_answer(tokenizer: Tokenizer, ids: np.ndarray) -> str:
    """The text of generated ``ids`` (int ``[N]``), cut at the first EOS when the tokenizer has
    one: the only stop; the rest of the continuation is scored whole, as RULER's (no stop word).

    An id the tokenizer does not have (a model's vocabulary is often padded past its
    tokenizer's: ids in ``[tokenizer.vocab_size, model vocab)``) has no text and is left out,
    as Hugging Face ``tokenizers``' decode (which RULER's HF wrapper calls) leaves it out;
    :func:`out_of_vocab` counts them, and :func:`score_cells` reports the count.
    """
    ids = _before_eos(tokenizer, np.asarray(ids))
    return tokenizer.decode(ids[(ids >= 0) & (ids < tokenizer.vocab_size)])


def out_of_vocab(tokenizer: Tokenizer, ids: np.ndarray) -> int:
    """How many of generated ``ids`` (int ``[N]``) before the first EOS the tokenizer does not
    have (:func:`decode_answer` leaves them out)."""
    ids = _before_eos(tokenizer, np.asarray(ids))
    return int(((ids < 0) | (ids >= tokenizer.vocab_size)).sum())


def _before_eos(tokenizer: Tokenizer, ids: np.ndarray) -> np.ndarray:
    if tokenizer.eos_id is not None:
        stop = np.flatnonzero(ids == tokenizer.eos_id)
        ids = ids[: stop[0]] if stop.size else ids
    return ids


def _check_grid(tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float], samples: int) -> None:
    if not tasks or not lengths or not depths:
        raise ValueError(
            f"eval needs at least one task, length and depth, got tasks={list(tasks)}, "
            f"lengths={list(lengths)}, depths={list(depths)}"
        )
    if samples < 1:
        raise ValueError(f"eval.per_depth={samples}: must be >= 1 (samples per task, length and depth)")


def _task_cells(
    tokenizer: Tokenizer, task: Task, length: int, depths: Sequence[float], samples: int, seed: int
) -> list[list[Example]]:
    """The cells of one task at one length, one per depth (one, depth None, for a task without
    one); raises :class:`LengthTooShort` from the first example the length cannot hold."""
    return [
        [task.example(tokenizer, seed=seed, length=int(length), depth=float(d), index=i) for i in range(samples)]
        for d in (depths if task.uses_depth else [0.5])
    ]


def build_grid(tokenizer: Tokenizer, **grid: Any) -> list[list[Example]]:
    """The examples of the grid, one list per (task, length, depth) cell, task-major; a task that
    uses no depth has one cell per length (depth None). Every cell must fit (:func:`fit_grid`,
    whose keywords ``tasks``, ``lengths``, ``depths``, ``samples`` and ``seed`` it takes, skips
    those that do not).

    Raises:
      ValueError: an unknown task, no task / length / depth, ``samples < 1``, a depth outside
        [0, 1]; :class:`LengthTooShort` (a ``ValueError``): a length too short for a task
        (names both numbers).
    """
    return fit_grid(tokenizer, strict=True, **grid)[0]


def fit_grid(
    tokenizer: Tokenizer,
    *,
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    samples: int,
    seed: int,
    strict: bool = False,
) -> tuple[list[list[Example]], list[dict[str, Any]]]:
    """:func:`build_grid`, where a task that does not fit a length is not run there: none of its
    cells at that length is built (one example too short drops the whole (task, length), every
    depth), and each of them becomes a row that says why.

    Returns:
      ``(cells, skipped)``: the cells that fit, as :func:`build_grid`'s; one row per cell not
      run, with :func:`score_cells`'s keys ``task``, ``seq_len``, ``depth``, ``max_new_tokens``,
      ``samples`` (0), ``score`` (None) and ``reason`` (the refusal's message), plus ``need``
      (the least length that held the refused example, tokens, or None), in grid order.

    Args:
      strict: raise :class:`LengthTooShort` for a length too short for a task instead
        (:func:`build_grid`).

    Raises:
      ValueError: as :func:`build_grid`, except a length too short for a task (unless ``strict``).
    """
    _check_grid(tasks, lengths, depths, samples)
    cells: list[list[Example]] = []
    skipped: list[dict[str, Any]] = []
    for name in tasks:
        task = get_task(name)
        for length in lengths:
            try:
                cells += _task_cells(tokenizer, task, length, depths, samples, seed)
            except LengthTooShort as e:
                if strict:
                    raise
                skipped += [
                    {
                        "task": task.name,
                        "seq_len": int(length),
                        "depth": float(d) if task.uses_depth else None,
                        "samples": 0,
                        "score": None,
                        "max_new_tokens": task.max_new_tokens,
                        "reason": str(e),
                        "need": e.need,
                    }
                    for d in (depths if task.uses_depth else [0.5])
                ]
    return cells, skipped


def score_cells(
    model: Any,
    mp: Any,
    tokenizer: Tokenizer,
    cells: Sequence[Sequence[Example]],
    *,
    generate: GenerateFn,
    batch: int | None = None,
) -> list[dict[str, Any]]:
    """Generate greedily the answers of every cell of :func:`build_grid` and score them.

    Args:
      model: the model, placed on ``mp``; mp: the bound plan, handed to ``generate``.
      tokenizer: the run's tokenizer (decoding, EOS).
      cells: lists of examples of one (task, length, depth) each.
      generate: the generation function (:func:`resolve_generator`).
      batch: prompts per ``generate`` call (None: a whole cell at once).

    Returns:
      One dict per cell: ``task``, ``seq_len`` (tokens), ``depth`` (None for a task without
      one), ``samples``, ``score`` (RULER's: :func:`lcx.evals.scoring.ruler_score` of the
      samples, a percentage with 2 decimals), ``sample_scores`` (each sample's, 0-1),
      ``max_new_tokens``, ``reason`` (None: it ran), ``out_of_vocab`` (generated ids before EOS
      that the tokenizer does not have, left out of the text: :func:`decode_answer`),
      ``predictions`` (the decoded answers, in order) and ``answers`` (each example's references).

    Raises:
      ValueError: the generation function returns another shape than ``[rows, max_new_tokens]``.
    """
    out = []
    for cell in cells:
        n, step = cell[0].max_new_tokens, batch or len(cell)
        preds: list[str] = []
        unknown = 0
        for i in range(0, len(cell), step):
            rows = cell[i : i + step]
            ids = np.asarray(generate(model, [e.prompt for e in rows], plan=mp, max_new_tokens=n, temperature=0.0))
            if ids.shape != (len(rows), n):
                raise ValueError(f"the generation function returned shape {ids.shape}, expected {(len(rows), n)}")
            preds += [decode_answer(tokenizer, r) for r in ids]
            unknown += sum(out_of_vocab(tokenizer, r) for r in ids)
        e = cell[0]
        per = [score(p, x.answers, x.metric) for p, x in zip(preds, cell)]
        out.append(
            {
                "task": e.task,
                "seq_len": e.length,
                "depth": e.depth,
                "samples": len(cell),
                "score": ruler_score(per),
                "sample_scores": per,
                "max_new_tokens": n,
                "reason": None,
                "out_of_vocab": unknown,
                "predictions": preds,
                "answers": [list(x.answers) for x in cell],
            }
        )
    return out


def run_tasks(
    model: Any,
    mp: Any,
    tokenizer: Tokenizer,
    *,
    generate: GenerateFn | str | None = None,
    batch: int | None = None,
    **grid: Any,
) -> list[dict[str, Any]]:
    """Score ``model`` on every (task, length, depth) cell by greedy generation:
    :func:`build_grid`, :func:`resolve_generator` (both refuse before anything is generated),
    then :func:`score_cells`.

    Args:
      grid: :func:`fit_grid`'s keywords: ``tasks`` (names in :data:`lcx.evals.TASKS`),
        ``lengths`` (context lengths in tokens, prompt plus answer budget), ``depths`` (needle
        depths in [0, 1]), ``samples`` (examples per cell) and ``seed`` (the examples' seed).
      generate: a :class:`GenerateFn` or ``module:function`` (None: :data:`DEFAULT_GENERATOR`).
        The rest as :func:`score_cells`.

    Returns:
      :func:`score_cells`'s rows.

    Raises:
      ValueError: as :func:`build_grid`, :func:`resolve_generator` and :func:`score_cells`.
    """
    cells = build_grid(tokenizer, **grid)
    gen = resolve_generator(generate)
    return score_cells(model, mp, tokenizer, cells, generate=gen, batch=batch)


def _ran(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("score") is not None]


def mean_by_task(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """``{task: {length: score}}``: RULER's score of each task at each length, over all its
    samples there (every depth pooled, in row order; :func:`lcx.evals.scoring.ruler_score`), a
    percentage with 2 decimals. Rows not run (``score`` None) are left out.

    Raises:
      KeyError: a row that ran without ``sample_scores`` (:func:`score_cells`'s rows have them).
    """
    acc: dict[str, dict[int, list[float]]] = {}
    for r in _ran(rows):
        acc.setdefault(r["task"], {}).setdefault(int(r["seq_len"]), []).extend(r["sample_scores"])
    return {t: {s: ruler_score(v) for s, v in by.items()} for t, by in acc.items()}


def tasks_by_length(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[str]]:
    """``{length: the tasks that ran there, in row order}`` (a length where none ran: [])."""
    out: dict[int, list[str]] = {int(r["seq_len"]): [] for r in rows}
    for r in _ran(rows):
        if r["task"] not in out[int(r["seq_len"])]:
            out[int(r["seq_len"])].append(r["task"])
    return dict(sorted(out.items()))


def mean_by_length(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """``{length: mean over the tasks that ran there of their scores}`` (:func:`mean_by_task`),
    a percentage rounded to 2 decimals as RULER rounds each task's (RULER's per-length number is
    the mean of its tasks, README table). A length where no task ran is left out; one where only
    some ran averages those (:func:`tasks_by_length` says which)."""
    by: dict[int, list[float]] = {}
    for t in mean_by_task(rows).values():
        for s, v in t.items():
            by.setdefault(s, []).append(v)
    return {s: round(sum(v) / len(v), 2) for s, v in sorted(by.items())}


def complete_lengths(rows: Sequence[Mapping[str, Any]], tasks: Sequence[str]) -> list[int]:
    """The lengths of ``rows`` at which every one of ``tasks`` ran: those the effective length
    is computed over (a mean that leaves a task out is not comparable)."""
    return [s for s, ran in tasks_by_length(rows).items() if set(tasks) <= set(ran)]


__all__ = [
    "DEFAULT_GENERATOR",
    "GenerateFn",
    "build_grid",
    "complete_lengths",
    "decode_answer",
    "fit_grid",
    "mean_by_length",
    "mean_by_task",
    "out_of_vocab",
    "resolve_generator",
    "run_tasks",
    "score_cells",
    "tasks_by_length",
]
