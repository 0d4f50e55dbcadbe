"""What happens around a training step, as hooks (Levanter's ``TrainerHooks.add_hook(fn, every=N)``).

The loop (:func:`lcx.training.stepping.run_steps`) runs one step, fills a
:class:`~lcx.training.stepping.StepInfo` and hands it to :class:`Hooks`; every cross-cutting
concern is one hook here, run in the order registered: :class:`EvalHook` (validation loss),
:class:`LongEvalHook` (long-context task scores by generation, :mod:`lcx.evals`),
:class:`MetricsHook` (``metrics.jsonl``), :class:`TensorBoardHook` (the same records as
TensorBoard scalars), :class:`ProgressHook` (the tqdm bar) and :class:`CheckpointHook` (saves,
their failures, and the graceful stop after SIGTERM/SIGINT). :func:`make_hooks` builds them
before the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pathlib
import signal
import sys
from collections.abc import Callable, Iterable
from typing import IO, Any

import numpy as np
from tqdm.auto import tqdm

from lcx.training.checkpoint import Checkpoints, CheckpointSaveError
from lcx.training.config import CheckpointConfig
from lcx.training.preflight import Run
from lcx.training.resume import Start
from lcx.training.rundir import multirun_job
from lcx.training.state import finite_or_none
from lcx.training.stepping import StepInfo, put_batch

log = logging.getLogger(__name__)


class Hooks:
    """Hooks run after every step, in the order added.

    Attributes:
      checkpoint: the run's :class:`CheckpointHook` (None: checkpointing off).
    """

    def __init__(self) -> None:
        self._hooks: list[tuple[Callable[[StepInfo], None], int, Callable[[StepInfo], bool] | None]] = []
        self.checkpoint: CheckpointHook | None = None

    @property
    def saved_step(self) -> int | None:
        """The newest checkpoint written (None: none, or checkpointing off)."""
        return self.checkpoint.saved_step if self.checkpoint is not None else None

    def add_hook(
        self, fn: Callable[[StepInfo], None], *, every: int = 1, also: Callable[[StepInfo], bool] | None = None
    ) -> None:
        """Run ``fn(info)`` after every ``every``-th step, after the last step, and after any step
        for which ``also(info)`` is true.

        Raises:
          ValueError: ``every < 1``.
        """
        if every < 1:
            raise ValueError(f"a hook runs every N >= 1 steps, got every={every}")
        self._hooks.append((fn, int(every), also))

    def run(self, info: StepInfo) -> None:
        for fn, every, also in self._hooks:
            if info.step % every == 0 or info.last or (also is not None and also(info)):
                fn(info)


def evaluate(steps: Any, params: Any, batches: Iterable[dict]) -> float:
    """Validation loss in nats/token: global sum over all batches / global valid-token count.

    Raises:
      ValueError: the batches hold no valid token (names ``data.val_fraction``).
    """
    total, count = 0.0, 0.0
    for b in batches:
        s, c = steps.evaluate(params, put_batch(b, steps.batch_sharding))
        total += float(s)
        count += float(c)
    if count == 0:
        raise ValueError("validation set has no valid tokens; raise data.val_fraction")
    return total / count


@dataclasses.dataclass
class EvalHook:
    """The validation loss over the first ``batches`` validation batches of ``data``."""

    steps: Any
    data: Any
    batches: int

    def __call__(self, info: StepInfo) -> None:
        info.val_loss = evaluate(self.steps, info.state.params, self.data.val_batches(self.batches))
        info.record["val_loss"] = info.val_loss


@dataclasses.dataclass
class MetricsHook:
    """One JSON line of ``metrics.jsonl`` per logged step, flushed at once (a crash keeps it)."""

    file: IO[str]

    def __call__(self, info: StepInfo) -> None:
        self.file.write(json.dumps(info.record) + "\n")
        self.file.flush()


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a ``metrics.jsonl`` key: ``val_loss`` -> ``val/loss``, a
    long-context score (``long_eval/vt``) as it is, any other key ``k`` -> ``train/k``
    (``tokens/<source>`` -> ``train/tokens/<source>``)."""
    if key == "val_loss":
        return "val/loss"
    return key if key.startswith("long_eval/") else f"train/{key}"


LONG_EVAL_TASKS = ("niah_single", "niah_multikey", "vt")
"""The tasks :class:`LongEvalHook` scores (:data:`lcx.evals.TASKS`)."""

LONG_EVAL_DEPTHS = (0.25, 0.75)
"""Needle depths of :class:`LongEvalHook`; it scores 2 examples per (task, depth)."""


@dataclasses.dataclass
class LongEvalHook:
    """Scores :data:`LONG_EVAL_TASKS` at the training length by greedy generation
    (:func:`lcx.evals.runner.score_cells`) on the step's parameters, and puts the score of each
    task (RULER's percentage, 0-100: :func:`lcx.evals.runner.mean_by_task`) in the step's record
    as ``long_eval/<task>`` (and their mean as ``long_eval/mean``), so :class:`MetricsHook` and
    :class:`TensorBoardHook` log it. The examples are built once,
    when the hook is made (:func:`long_eval_hook`), and are the same at every evaluation.

    Attributes:
      static: the model's static part; mp: the run's bound plan; tokenizer: the run's.
      cells: the examples (:func:`lcx.evals.runner.build_grid`); generate: the generation function.
    """

    static: Any
    mp: Any
    tokenizer: Any
    cells: list
    generate: Any

    def __call__(self, info: StepInfo) -> None:
        import equinox as eqx

        from lcx.evals.runner import mean_by_task, score_cells

        model = eqx.combine(info.state.params, self.static)
        rows = score_cells(model, self.mp, self.tokenizer, self.cells, generate=self.generate)
        means = {t: float(np.mean(list(by.values()))) for t, by in mean_by_task(rows).items()}
        info.record.update({f"long_eval/{t}": v for t, v in means.items()})
        info.record["long_eval/mean"] = float(np.mean(list(means.values())))


def long_eval_hook(run: Run) -> LongEvalHook:
    """The run's :class:`LongEvalHook`, its examples built and its generation function
    (:data:`lcx.evals.DEFAULT_GENERATOR`) imported now, before anything compiles.

    Raises:
      ValueError: ``train.seq_len`` too short for a task (names both numbers), or no generation
        function can be imported.
    """
    from lcx.evals.runner import build_grid, resolve_generator

    tok = run.data.tokenizer
    seq = run.config.train.seq_len
    try:
        cells = build_grid(tok, tasks=LONG_EVAL_TASKS, lengths=[seq], depths=LONG_EVAL_DEPTHS, samples=2, seed=0)
        gen = resolve_generator(None)
    except ValueError as e:
        raise ValueError(f"train.long_eval_every={run.config.train.long_eval_every}: {e}") from e
    return LongEvalHook(run.static, run.mp, tok, cells, gen)


@dataclasses.dataclass
class TensorBoardHook:
    """Each ``metrics.jsonl`` record also as TensorBoard scalars, at the record's step.

    Every number of the record but ``step`` becomes one scalar, tagged by
    :func:`tensorboard_tag` (loss, lr, grad_norm, tokens_per_sec, mfu, step_time_s,
    temp_bytes_per_device, val/loss, ...). TensorBoard stores float32, so a scalar equals its
    JSON value rounded to float32; ``metrics.jsonl`` stays the source of truth. Run it on the
    same steps as :class:`MetricsHook`.

    Args:
      writer: a ``tensorboardX.SummaryWriter`` (:func:`open_tensorboard`).
    """

    writer: Any

    def __call__(self, info: StepInfo) -> None:
        for key, value in info.record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(tensorboard_tag(key), value, info.step)
        self.writer.flush()  # like metrics.jsonl: a crash keeps every logged step


def open_tensorboard(log_dir: Any, start: int) -> Any:
    """A tensorboardX ``SummaryWriter`` writing event files into ``log_dir``.

    Args:
      log_dir: the directory (``<run dir>/tensorboard``).
      start: the step the run starts after (0 for a new run; the restored step on resume). On
        resume, events of steps ``> start`` that an interrupted run wrote are purged
        (``purge_step``), as :func:`lcx.training.rundir.truncate_metrics` drops their
        ``metrics.jsonl`` lines.
    """
    from tensorboardX import SummaryWriter  # imported here: only runs that log import it

    return SummaryWriter(logdir=str(log_dir), purge_step=start + 1 if start else None)


def add_logging_hooks(
    hooks: Hooks, run_dir: pathlib.Path, stack: contextlib.ExitStack, *, every: int, start: int, tensorboard: bool
) -> None:
    """Add the ``metrics.jsonl`` hook and, with ``tensorboard``, the TensorBoard one, both on
    every ``every``-th step (at least 1) and at each evaluation; ``stack`` closes their files.

    Args:
      hooks: the loop's hooks.
      run_dir: the run directory (``metrics.jsonl``, ``tensorboard/``).
      stack: closes the files when the loop ends.
      every: ``train.log_every``.
      start: the step the run starts after (:func:`open_tensorboard`).
      tensorboard: ``train.tensorboard``.
    """
    logged: dict[str, Any] = {"every": max(1, every), "also": lambda i: "val_loss" in i.record or _long_eval(i)}
    hooks.add_hook(MetricsHook(stack.enter_context((run_dir / "metrics.jsonl").open("a"))), **logged)
    if tensorboard:
        hooks.add_hook(TensorBoardHook(stack.enter_context(open_tensorboard(run_dir / "tensorboard", start))), **logged)


def _long_eval(info: StepInfo) -> bool:
    return "long_eval/mean" in info.record


@dataclasses.dataclass
class ProgressHook:
    """The progress bar: loss, throughput and the newest validation loss."""

    bar: Any

    def __call__(self, info: StepInfo) -> None:
        post = {"loss": f"{info.loss:.3f}", "tok/s": f"{info.record['tokens_per_sec']:.0f}"}
        if info.val_loss is not None:
            post["val"] = f"{info.val_loss:.3f}"
        self.bar.set_postfix(post)
        self.bar.update(1)


class CheckpointHook:
    """Saves every ``checkpoint.every`` steps, at the last step and after a stop signal
    (``StepInfo.stop``, then exits); checks each save's outcome at the next step (so a failure
    names its step) and, with ``checkpoint.on_save_error=retry``, saves the next step instead,
    once.

    Args:
      ckpts: the run's checkpoints.
      config: the ``checkpoint:`` section.
      meta: ``meta(loss, val_loss)``: the run's JSON for the checkpoint's ``meta`` item.
      saved_step: the newest checkpoint on disk when the loop starts (None: none).

    Raises (from ``__call__``):
      CheckpointSaveError: a save failed (``retry``: twice in a row).
      SystemExit: after a stop signal, once the checkpoint is on disk.
    """

    def __init__(
        self,
        ckpts: Checkpoints,
        config: CheckpointConfig,
        meta: Callable[[float, float | None], dict[str, Any]],
        saved_step: int | None,
    ):
        self.ckpts, self.config, self.meta = ckpts, config, meta
        self.saved_step = saved_step  # the newest checkpoint written (or being written)
        self._started: int | None = None  # the step whose save is in flight: checked at the next step
        self._retry, self._retried = False, False
        self._last_good = saved_step  # the newest checkpoint known to be on disk

    def __call__(self, info: StepInfo) -> None:
        step = info.step
        if self._started is not None:
            # the save of the previous step overlapped this step; a failure is raised now, naming
            # its step, not at some later save (or never)
            try:
                self.ckpts.check(wait=True)
                self._retried, self._last_good = False, self._started
            except CheckpointSaveError as e:
                self.saved_step = self._last_good
                if self.config.on_save_error != "retry" or self._retried:
                    raise
                log.warning("%s; checkpoint.on_save_error=retry: saving step %d instead", e, step)
                self._retry, self._retried = True, True
            self._started = None
        signum = info.stop.signum if info.stop is not None else None
        if self.config.due(step) or info.last or signum or self._retry:
            self.ckpts.save(info.state, self.meta(info.loss, info.val_loss))
            self.saved_step, self._started, self._retry = step, step, False
        if signum:
            self.exit_after_save(signum, step)

    def exit_after_save(self, signum: int, step: int) -> None:
        """Wait for the checkpoint of ``step`` to be on disk, say so, and exit.

        Raises:
          SystemExit: always, with code ``128 + signum``.
          CheckpointSaveError: the save failed (from ``ckpts.wait()``).
        """
        self.ckpts.wait()
        msg = f"{signal.Signals(signum).name}: checkpoint of step {step} saved in {self.ckpts.directory}; exiting"
        log.warning(msg)
        print(msg, file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)


def make_hooks(
    run: Run, run_dir: pathlib.Path, stack: contextlib.ExitStack, start: Start, long_eval: LongEvalHook | None = None
) -> Hooks:
    """The hooks of a run, in the order they run after a step: evaluation (every
    ``train.eval_every``), long-context task scores (every ``train.long_eval_every``), the ``metrics.jsonl`` line (every ``train.log_every`` and at each
    evaluation) and, with ``train.tensorboard``, the same record as TensorBoard scalars in
    ``run_dir/tensorboard``, the progress bar, checkpoints (with ``checkpoint.dir``; saved before
    exiting after SIGTERM/SIGINT). What they open is closed by ``stack``; a run with no step left
    to train (``start.done``) gets none, and opens nothing. ``long_eval``: the run's
    :func:`long_eval_hook`, built before the model is (None: built here when
    ``train.long_eval_every`` asks for it)."""
    t = run.config.train
    hooks = Hooks()
    if start.done:
        return hooks
    if t.eval_every > 0:
        hooks.add_hook(EvalHook(run.steps, run.data, t.eval_batches), every=t.eval_every)
    if t.long_eval_every:
        hooks.add_hook(long_eval or long_eval_hook(run), every=t.long_eval_every)
    add_logging_hooks(hooks, run_dir, stack, every=t.log_every, start=start.step, tensorboard=t.tensorboard)
    bar = stack.enter_context(tqdm(total=t.steps, initial=start.step, desc=f"train[{run.mp.plan.name}]", unit="step"))
    hooks.add_hook(ProgressHook(bar))
    if start.ckpts is None:
        return hooks
    hooks.checkpoint = CheckpointHook(
        start.ckpts,
        run.config.checkpoint,
        lambda loss, val: checkpoint_meta(run, loss, val),
        saved_step=start.step if start.resumed else None,
    )
    hooks.add_hook(hooks.checkpoint)
    return hooks


def checkpoint_meta(run: Run, loss: float | None, val: float | None) -> dict[str, Any]:
    """The run's part of a checkpoint's ``meta`` (the state adds step, data position, RNG)."""
    return {
        "loss": finite_or_none(loss),
        "val_loss": finite_or_none(val),
        "plan": repr(run.mp.plan),
        "mesh": {k: int(v) for k, v in run.mp.mesh.shape.items()},
        "config": run.config.resolved,
        "sweep": multirun_job(),  # which job of which sweep wrote it (None: not a multirun)
    }


__all__ = [
    "CheckpointHook",
    "LONG_EVAL_DEPTHS",
    "LONG_EVAL_TASKS",
    "EvalHook",
    "Hooks",
    "LongEvalHook",
    "MetricsHook",
    "ProgressHook",
    "TensorBoardHook",
    "add_logging_hooks",
    "checkpoint_meta",
    "evaluate",
    "long_eval_hook",
    "make_hooks",
    "open_tensorboard",
    "tensorboard_tag",
]
