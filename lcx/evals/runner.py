"""A grid of long-context tasks run through a generation function and scored.

:func:`run_tasks` builds every example of the grid (task x length x depth x sample) first, so a
length too short for a task is refused before anything compiles, then generates each cell's
answers greedily with a :class:`GenerateFn` (by default ``lcx.generate.generate``, resolved when
first needed: :func:`resolve_generator`) and scores them by the task's RULER rule
(:mod:`lcx.evals.scoring`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lcx.data.tokenizers import Tokenizer
from lcx.evals.prompt import Example
from lcx.evals.scoring import score
from lcx.evals.tasks import get_task

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
    """The text of generated ``ids`` (int ``[N]``), cut at the first EOS when the tokenizer has one."""
    ids = np.asarray(ids)
    if tokenizer.eos_id is not None:
        stop = np.flatnonzero(ids == tokenizer.eos_id)
        ids = ids[: stop[0]] if stop.size else ids
    return tokenizer.decode(ids)


def build_grid(
    tokenizer: Tokenizer,
    *,
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    samples: int,
    seed: int,
) -> list[list[Example]]:
    """The examples of the grid, one list per (task, length, depth) cell, task-major; a task that
    uses no depth has one cell per length (depth None).

    Raises:
      ValueError: an unknown task, no task / length / depth, ``samples < 1``, a depth outside
        [0, 1] or a length too short for a task (names both numbers).
    """
    if not tasks or not lengths or not depths:
        raise ValueError(
            f"eval needs at least one task, length and depth, got tasks={list(tasks)}, "
            f"lengths={list(lengths)}, depths={list(depths)}"
        )
    if samples < 1:
        raise ValueError(f"eval.per_depth={samples}: must be >= 1 (samples per task, length and depth)")
    cells = []
    for name in tasks:
        task = get_task(name)
        for length in lengths:
            for depth in depths if task.uses_depth else [0.5]:
                cells.append(
                    [
                        task.example(tokenizer, seed=seed, length=int(length), depth=float(depth), index=i)
                        for i in range(samples)
                    ]
                )
    return cells


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
      one), ``samples``, ``score`` (mean, 0-1), ``max_new_tokens``, ``predictions`` (the
      decoded answers, in order) and ``answers`` (each example's references).

    Raises:
      ValueError: the generation function returns another shape than ``[rows, max_new_tokens]``.
    """
    out = []
    for cell in cells:
        n, step = cell[0].max_new_tokens, batch or len(cell)
        preds: list[str] = []
        for i in range(0, len(cell), step):
            rows = cell[i : i + step]
            ids = np.asarray(generate(model, [e.prompt for e in rows], plan=mp, max_new_tokens=n, temperature=0.0))
            if ids.shape != (len(rows), n):
                raise ValueError(f"the generation function returned shape {ids.shape}, expected {(len(rows), n)}")
            preds += [decode_answer(tokenizer, r) for r in ids]
        e = cell[0]
        out.append(
            {
                "task": e.task,
                "seq_len": e.length,
                "depth": e.depth,
                "samples": len(cell),
                "score": float(np.mean([score(p, x.answers, x.metric) for p, x in zip(preds, cell)])),
                "max_new_tokens": n,
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
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    samples: int,
    seed: int,
    generate: GenerateFn | str | None = None,
    batch: int | None = None,
) -> list[dict[str, Any]]:
    """Score ``model`` on every (task, length, depth) cell by greedy generation:
    :func:`build_grid`, :func:`resolve_generator` (both refuse before anything is generated),
    then :func:`score_cells`.

    Args:
      tasks: names in :data:`lcx.evals.TASKS`; lengths: context lengths in tokens (prompt plus
        answer budget); depths: needle depths in [0, 1]; samples: examples per cell; seed: the
        examples' seed. generate: a :class:`GenerateFn` or ``module:function`` (None:
        :data:`DEFAULT_GENERATOR`). The rest as :func:`score_cells`.

    Returns:
      :func:`score_cells`'s rows.

    Raises:
      ValueError: as :func:`build_grid`, :func:`resolve_generator` and :func:`score_cells`.
    """
    cells = build_grid(tokenizer, tasks=tasks, lengths=lengths, depths=depths, samples=samples, seed=seed)
    gen = resolve_generator(generate)
    return score_cells(model, mp, tokenizer, cells, generate=gen, batch=batch)


def mean_by_task(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """``{task: {length: mean score over the task's cells at that length}}``."""
    acc: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        acc.setdefault(r["task"], {}).setdefault(int(r["seq_len"]), []).append(float(r["score"]))
    return {t: {s: float(np.mean(v)) for s, v in by.items()} for t, by in acc.items()}


def mean_by_length(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """``{length: mean over tasks of each task's mean score at that length}`` (RULER averages
    the tasks, each over its depths and samples); a length some task lacks averages the others."""
    by_task = mean_by_task(rows)
    lengths = sorted({s for by in by_task.values() for s in by})
    return {s: float(np.mean([by[s] for by in by_task.values() if s in by])) for s in lengths}


__all__ = [
    "DEFAULT_GENERATOR",
    "GenerateFn",
    "build_grid",
    "decode_answer",
    "mean_by_length",
    "mean_by_task",
    "resolve_generator",
    "run_tasks",
    "score_cells",
]
