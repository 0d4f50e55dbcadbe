"""Long-context tasks scored by generation (RULER-style), their scoring and the effective length.

- :mod:`lcx.evals.tasks`: the task registry :data:`TASKS` (needle-in-a-haystack single /
  multi-key / multi-value / multi-query, variable tracking, common- and frequent-words
  extraction, pass key), each example a pure function of its seed, length, depth and tokenizer;
- :mod:`lcx.evals.prompt`: prompts of an exact number of tokens in lcx's embedded real text
  (:mod:`lcx.evals.haystack`);
- :mod:`lcx.evals.scoring`: RULER's ``string_match_all`` / ``string_match_part`` (per sample a
  fraction, per task a percentage with 2 decimals) and the effective context length;
- :mod:`lcx.evals.runner`: a grid of (task, length, depth) run through a generation function
  (:class:`GenerateFn`, by default ``lcx.generate.generate``) and scored; a task that does not
  fit a length is not run there (:func:`fit_grid`).

The CSV, heat map and JSON of ``python -m lcx.eval eval=ruler`` are rendered by
:mod:`lcx.reports.ruler`; the training hook (``train.long_eval_every``) is
:class:`lcx.training.hooks.LongEvalHook`.
"""

from lcx.evals.prompt import Example, LengthTooShort
from lcx.evals.runner import DEFAULT_GENERATOR, GenerateFn, fit_grid, mean_by_length, resolve_generator, run_tasks
from lcx.evals.scoring import (
    RULER_THRESHOLD,
    effective_length,
    match_all,
    match_part,
    ruler_score,
    score,
    string_match_all,
    string_match_part,
)
from lcx.evals.tasks import TASKS, Task, get_task

__all__ = [
    "DEFAULT_GENERATOR",
    "RULER_THRESHOLD",
    "TASKS",
    "Example",
    "GenerateFn",
    "LengthTooShort",
    "Task",
    "effective_length",
    "fit_grid",
    "get_task",
    "match_all",
    "match_part",
    "mean_by_length",
    "resolve_generator",
    "ruler_score",
    "run_tasks",
    "score",
    "string_match_all",
    "string_match_part",
]
