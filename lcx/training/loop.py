"""The training loop: :func:`train` reads as its phases.

1. set up (:func:`lcx.training.preflight.setup`): the run validated before anything compiles
   (plan vs devices, model and batch; sequence length; memory, :mod:`lcx.training.memory`),
   then its data, model structure, optimizer and sharded steps, as one frozen
   :class:`~lcx.training.preflight.Run`;
2. restore (:func:`lcx.training.resume.restore`): the newest readable checkpoint, or a fresh
   state, as one :class:`~lcx.training.resume.Start`; the run directory claimed
   (:func:`lcx.training.rundir.record_run`);
3. loop with hooks: the hooks built (:func:`lcx.training.hooks.make_hooks`: evaluation,
   long-context scores, metrics, progress, checkpoints), then the step compiled and run once
   per step, the hooks after each (:func:`lcx.training.stepping.run_steps`);
4. finish: the :class:`~lcx.training.state.TrainResult`.

Each phase reads what the one before built. The configuration arrives typed
(:class:`lcx.training.config.RunConfig`, built once by the entry point,
:func:`lcx.config.run_config`); ``train.dry_run=true`` is :func:`lcx.training.preflight.dry_run`.
"""

from __future__ import annotations

import contextlib
import pathlib

from lcx.training.config import RunConfig
from lcx.training.hooks import evaluate as evaluate
from lcx.training.hooks import long_eval_hook, make_hooks
from lcx.training.preflight import setup
from lcx.training.resume import restore
from lcx.training.rundir import RunDirInUseError as RunDirInUseError
from lcx.training.rundir import claim_run_dir as claim_run_dir
from lcx.training.rundir import record_run
from lcx.training.state import TrainResult, TrainState
from lcx.training.stepping import run_steps


def train(config: RunConfig, run_dir: str | pathlib.Path, devices=None) -> TrainResult:
    """Train the run ``config``; write ``metrics.jsonl`` and ``run_info.json`` in ``run_dir``.

    With ``checkpoint.dir`` set, resumes from the newest readable checkpoint there (if any),
    saves every ``checkpoint.every`` steps and at the end, and on SIGTERM/SIGINT saves the
    current step before exiting. A resumed run continues ``metrics.jsonl`` (lines of steps
    after the restored one, written before a crash, are dropped) and reproduces the losses of
    an uninterrupted run exactly: the whole :class:`TrainState` (parameters, optimizer state,
    hence the learning-rate schedule, data position, RNG key, step) comes from the checkpoint.

    Returns:
      :class:`TrainResult`: ``losses`` (per step run by this call), ``final_loss`` (None when
      this call trained no step), ``val_loss``, ``state`` (and ``params``), ``static``,
      ``run_dir``, ``compile_s``, ``start_step``.

    Raises:
      PlanError / ValueError: an invalid configuration, before anything compiles.
      CheckpointMismatchError: the checkpoint was written for another model config (names the
        field).
      NoUsableCheckpointError: checkpoints exist but none can be read.
      CheckpointSaveError: a checkpoint save failed (names the step and the cause), raised at
        the step after it (``checkpoint.on_save_error=retry``: after a second failure in a row).
      CheckpointConfigChangedError: the checkpoint's training config differs (names the keys;
        ``checkpoint.allow_config_change=true`` resumes anyway).
      RunDirInUseError: ``run_dir`` holds another run's ``metrics.jsonl``
        (:func:`lcx.training.rundir.claim_run_dir`; ``train.reuse_run_dir=true`` keeps it).
      FloatingPointError: a non-finite loss (names the step and the non-finite tensors); no
        checkpoint of that state is written.
      SystemExit: after SIGTERM/SIGINT, with code 128 + signal number, once the final
        checkpoint is on disk.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = setup(config, devices)
    # its examples and generation function first: a refusal comes before the state is compiled
    long_eval = long_eval_hook(run) if config.train.long_eval_every else None
    start = restore(run)
    with contextlib.ExitStack() as stack:
        stack.callback(run.data.train.close)  # the data pipeline's worker processes
        if start.ckpts is not None:
            stack.callback(start.ckpts.close)  # an exception still lets an in-flight (good) save finish
        record_run(run, run_dir, start.step, resumed=start.resumed)
        hooks = make_hooks(run, run_dir, stack, start, long_eval)
        return run_steps(run, run_dir, stack, start, hooks)


__all__ = ["TrainResult", "TrainState", "train"]
