"""What happens around a training step, as hooks (Levanter's ``TrainerHooks.add_hook(fn, every=N)``).

The loop (:func:`lcx.training.loop.train`) runs one step, fills a :class:`StepInfo` and hands it
to :class:`Hooks`; every cross-cutting concern is one hook here, run in the order registered:
:class:`EvalHook` (validation loss), :class:`MetricsHook` (``metrics.jsonl``),
:class:`TensorBoardHook` (the same records as TensorBoard scalars), :class:`ProgressHook` (the
tqdm bar) and :class:`CheckpointHook` (saves, their failures, and the graceful stop after
SIGTERM/SIGINT).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pathlib
from collections.abc import Callable, Iterable
from typing import IO, Any

from tqdm.auto import tqdm

from lcx.training.checkpoint import Checkpoints, CheckpointSaveError
from lcx.training.config import CheckpointConfig
from lcx.training.preflight import Run
from lcx.training.rundir import multirun_job
from lcx.training.signals import StopSignals, exit_after_save
from lcx.training.state import TrainState, finite_or_none
from lcx.training.step import put_batch

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepInfo:
    """One finished step, as the hooks see it (they may add to ``record`` and set ``val_loss``).

    Attributes:
      state: the state after the step (``state.step`` is the 1-based step; ``state.data`` the
        stream position after its batch).
      last: whether this is the run's last step (``train.steps``).
      loss: the step's training loss, nats/token.
      record: the step's ``metrics.jsonl`` record.
      val_loss: the newest validation loss (nats/token; None before the first evaluation).
    """

    state: TrainState
    last: bool
    loss: float
    record: dict[str, Any]
    val_loss: float | None

    @property
    def step(self) -> int:
        return self.state.step


class Hooks:
    """Hooks run after every step, in the order added."""

    def __init__(self) -> None:
        self._hooks: list[tuple[Callable[[StepInfo], None], int, Callable[[StepInfo], bool] | None]] = []

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
    """The TensorBoard tag of a ``metrics.jsonl`` key: ``val_loss`` -> ``val/loss``, any other
    key ``k`` -> ``train/k``."""
    return "val/loss" if key == "val_loss" else f"train/{key}"


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
    logged: dict[str, Any] = {"every": max(1, every), "also": lambda i: "val_loss" in i.record}
    hooks.add_hook(MetricsHook(stack.enter_context((run_dir / "metrics.jsonl").open("a"))), **logged)
    if tensorboard:
        hooks.add_hook(TensorBoardHook(stack.enter_context(open_tensorboard(run_dir / "tensorboard", start))), **logged)


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
    """Saves every ``checkpoint.every`` steps, at the last step and after a stop signal; checks
    each save's outcome at the next step (so a failure names its step) and, with
    ``checkpoint.on_save_error=retry``, saves the next step instead, once.

    Args:
      ckpts: the run's checkpoints.
      config: the ``checkpoint:`` section.
      stop: the signal watcher; after a signal the step is saved and the process exits.
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
        stop: StopSignals,
        meta: Callable[[float, float | None], dict[str, Any]],
        saved_step: int | None,
    ):
        self.ckpts, self.config, self.stop, self.meta = ckpts, config, stop, meta
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
        if self.config.due(step) or info.last or self.stop.signum or self._retry:
            self.ckpts.save(info.state, self.meta(info.loss, info.val_loss))
            self.saved_step, self._started, self._retry = step, step, False
        if self.stop.signum:
            exit_after_save(self.stop.signum, self.ckpts, step)


def make_hooks(
    run: Run,
    run_dir: pathlib.Path,
    stack: contextlib.ExitStack,
    ckpts: Checkpoints | None,
    stop: StopSignals,
    start: int,
    *,
    resumed: bool,
) -> tuple[Hooks, CheckpointHook | None]:
    """The hooks of a run, in the order they run after a step: evaluation (every
    ``train.eval_every``), the ``metrics.jsonl`` line (every ``train.log_every`` and at each
    evaluation) and, with ``train.tensorboard``, the same record as TensorBoard scalars in
    ``run_dir/tensorboard``, the progress bar, checkpoints (saved before exiting once ``stop``,
    the SIGTERM/SIGINT watcher, has seen a signal). What they open is closed by ``stack``."""
    t = run.config.train
    hooks = Hooks()
    if t.eval_every > 0:
        hooks.add_hook(EvalHook(run.steps, run.data, t.eval_batches), every=t.eval_every)
    add_logging_hooks(hooks, run_dir, stack, every=t.log_every, start=start, tensorboard=t.tensorboard)
    bar = stack.enter_context(tqdm(total=t.steps, initial=start, desc=f"train[{run.mp.plan.name}]", unit="step"))
    hooks.add_hook(ProgressHook(bar))
    if ckpts is None:
        return hooks, None
    ckpt_hook = CheckpointHook(
        ckpts,
        run.config.checkpoint,
        stop,
        lambda loss, val: checkpoint_meta(run, loss, val),
        saved_step=start if resumed else None,
    )
    hooks.add_hook(ckpt_hook)
    return hooks, ckpt_hook


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
    "EvalHook",
    "Hooks",
    "MetricsHook",
    "ProgressHook",
    "StepInfo",
    "TensorBoardHook",
    "add_logging_hooks",
    "checkpoint_meta",
    "evaluate",
    "make_hooks",
    "open_tensorboard",
    "tensorboard_tag",
]
