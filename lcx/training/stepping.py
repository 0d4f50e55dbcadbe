"""Phases 3 and 4 of :func:`lcx.training.loop.train`: the step loop with its hooks, then the
result (:func:`run_steps`). Each step (:func:`train_step`) runs the compiled step, prefetches the
next batch while the devices work, refuses a non-finite loss (:func:`lcx.training.state.nonfinite_report`) and
hands a :class:`~lcx.training.hooks.StepInfo` to the hooks.
"""

from __future__ import annotations

import contextlib
import logging
import math
import pathlib
import time
from typing import Any

import jax

from lcx.training.checkpoint import Checkpoints, Restored
from lcx.training.hooks import CheckpointHook, StepInfo, make_hooks
from lcx.training.preflight import Run
from lcx.training.signals import StopSignals
from lcx.training.state import TrainResult, TrainState, nonfinite_report
from lcx.training.step import put_batch

log = logging.getLogger("lcx.training.loop")


def run_steps(
    run: Run,
    run_dir: pathlib.Path,
    stack: contextlib.ExitStack,
    ckpts: Checkpoints | None,
    state: TrainState,
    restored: Restored | None,
) -> TrainResult:
    """Phase 3, the loop with hooks, and 4, finish: the step compiled for the first batch, the
    SIGTERM/SIGINT watcher (with checkpoints) and the hooks (:func:`lcx.training.hooks.make_hooks`),
    then the steps from ``state`` to ``train.steps``, the hooks after each; what the hooks open is
    closed by ``stack``.

    Returns:
      The :class:`TrainResult` (``final_loss`` None when no step ran: a checkpoint that already
      reached ``train.steps``; its last loss is not this run's).
    """
    start, total = state.step, run.config.train.steps
    val_loss = restored.meta.get("val_loss") if restored is not None else None
    losses: list[float] = []
    compile_s = None
    if start >= total:
        log.info("checkpoint at step %d already reached train.steps=%d; nothing to train", start, total)
    else:
        batch = put_batch(next(run.data.train), run.steps.batch_sharding)
        compiled, first = compile_step(run, state, batch, resumed=restored is not None)
        compile_s = first["compile_s"]
        stop = stack.enter_context(StopSignals(enabled=ckpts is not None))
        hooks, ckpt_hook = make_hooks(run, run_dir, stack, ckpts, stop, start, resumed=restored is not None)
        for step in range(start + 1, total + 1):
            assert batch is not None  # only the last step prefetches no next batch
            extra = first if step == start + 1 else {}
            state, batch, info = train_step(run, compiled, state, batch, step, extra, val_loss, ckpts, ckpt_hook)
            losses.append(info.loss)
            hooks.run(info)
            val_loss = info.val_loss
    return TrainResult(
        losses=losses,
        final_loss=losses[-1] if losses else None,
        val_loss=val_loss,
        state=state,
        static=run.static,
        run_dir=str(run_dir),
        compile_s=compile_s,
        start_step=start,
    )


def compile_step(
    run: Run, state: TrainState, batch: dict[str, jax.Array], *, resumed: bool
) -> tuple[jax.stages.Compiled, dict[str, Any]]:
    """Compile the train step for ``batch``'s shapes.

    Returns:
      ``(compiled, first)``: the compiled step and the extra fields of the first step's
      ``metrics.jsonl`` record (``compile_s``, ``temp_bytes_per_device``, ``resumed_from``).
    """
    t0 = time.perf_counter()
    compiled = run.steps.train.lower(state.params, state.opt_state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    first = {
        "compile_s": compile_s,
        "temp_bytes_per_device": getattr(mem, "temp_size_in_bytes", None) if mem is not None else None,
    }
    if resumed:
        first["resumed_from"] = state.step
    return compiled, first


def train_step(
    run: Run,
    compiled: jax.stages.Compiled,
    state: TrainState,
    batch: dict[str, jax.Array],
    step: int,
    extra: dict[str, Any],
    val_loss: float | None,
    ckpts: Checkpoints | None,
    ckpt_hook: CheckpointHook | None,
) -> tuple[TrainState, dict[str, jax.Array] | None, StepInfo]:
    """Once per step: run step ``step`` on ``batch``, prefetch the next batch while the
    devices work, and build the step's :class:`StepInfo` (its metrics record plus ``extra``).

    Raises:
      FloatingPointError: a non-finite loss or gradient norm (:func:`nonfinite_report`).
    """
    ts = time.perf_counter()
    params, opt_state, m = compiled(state.params, state.opt_state, batch)  # dispatched asynchronously
    # Host work overlaps the step on the devices: fetch the next batch while it runs.
    last = step == run.config.train.steps
    next_batch = None if last else put_batch(next(run.data.train), run.steps.batch_sharding)
    loss = float(m["loss"])  # blocks: the step time below is the whole step
    dt = time.perf_counter() - ts
    grad_norm = float(m["grad_norm"])
    # the data position is the one after this step's batch, not the prefetched one's
    state = state.replace(
        params=params, opt_state=opt_state, step=step, data=run.data.train.state_before(0 if last else 1)
    )
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        # A non-finite gradient poisons the update even when the loss is still finite; both
        # scalars are on the host already, so this check costs nothing per step.
        saved = ckpt_hook.saved_step if ckpt_hook is not None else None
        where = ckpts.directory if ckpts is not None else None
        raise FloatingPointError(nonfinite_report(state, loss, grad_norm, checkpoint_dir=where, saved_step=saved))
    record = {
        "step": step,
        "loss": loss,
        "tokens_per_sec": run.config.train.tokens_per_step / dt,
        "mfu": run.flops.total / dt / (run.hw.peak_flops_per_device * len(run.devices)),
        "step_time_s": dt,
        "lr": float(run.schedule(step - 1)),
        "grad_norm": grad_norm,
        "valid_tokens": float(m["tokens"]),
        **extra,
    }
    return state, next_batch, StepInfo(state=state, last=last, loss=loss, record=record, val_loss=val_loss)


__all__ = ["run_steps", "train_step"]
