"""Phases 3 and 4 of :func:`lcx.training.loop.train`: the step loop, then the result
(:func:`run_steps`), and the per-step work it does. Each step (:func:`train_step`) runs the
compiled step, puts the next batch on the devices while they work (:func:`next_batch`,
:func:`put_batch`: each process's own rows into global arrays), refuses a
non-finite loss (:func:`lcx.training.state.nonfinite_report`) and hands a :class:`StepInfo` to
the hooks (built before the loop, :func:`lcx.training.hooks.make_hooks`). While it runs,
SIGTERM and SIGINT are held (:class:`StopSignals`): the step finishes and the hooks save it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from lcx.data.packing import BATCH_KEYS
from lcx.training.preflight import Run
from lcx.training.resume import Start
from lcx.training.state import TrainResult, TrainState, nonfinite_report

log = logging.getLogger("lcx.training.loop")


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
      stop: the loop's signal watcher (None: none); once it has seen a signal
        (``stop.signum``), the step is saved and the process exits.
    """

    state: TrainState
    last: bool
    loss: float
    record: dict[str, Any]
    val_loss: float | None
    stop: StopSignals | None = None

    @property
    def step(self) -> int:
        return self.state.step


@runtime_checkable
class StepHooks(Protocol):
    """What the loop needs of its hooks (:class:`lcx.training.hooks.Hooks`)."""

    def run(self, info: StepInfo) -> None:
        """Run the hooks due after the step of ``info``."""

    @property
    def saved_step(self) -> int | None:
        """The newest checkpoint written (None: none), for a non-finite step's message."""


class StopSignals:
    """While active, SIGTERM and SIGINT only set ``signum``; the step finishes, the hooks save
    it and exit (:class:`lcx.training.hooks.CheckpointHook`). A second signal restores the
    previous action and re-raises it, so a stuck save can still be interrupted. With
    ``enabled=False`` (no checkpointing) or outside the main thread (where Python forbids signal
    handlers) this does nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        print(
            f"{signal.Signals(signum).name} received: saving a checkpoint after this step "
            "(send it again to exit without saving)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def put_batch(
    batch: Mapping[str, np.ndarray], sharding: jax.sharding.NamedSharding, global_rows: int | None = None
) -> dict[str, jax.Array]:
    """Host numpy batch ``{key: [rows, S]}`` -> global arrays ``[B, S]`` with ``sharding``.

    Args:
      batch: the five :data:`BATCH_KEYS` arrays of this process: its own part of the global batch
        (:func:`process_shard`; every row on one process), or the whole batch (evaluation).
      sharding: the batch's sharding.
      global_rows: B, rows of the global batch; None: ``batch`` is the whole batch (every
        process holds the same one).

    Returns:
      the five global ``jax.Array`` ``[B, S]``, same dtypes.
    """
    out = {}
    for k in BATCH_KEYS:
        x = np.asarray(batch[k])
        shape = (x.shape[0] if global_rows is None else int(global_rows), *x.shape[1:])
        out[k] = jax.make_array_from_process_local_data(sharding, x, shape)
    return out


def next_batch(run: Run) -> tuple[dict[str, jax.Array], float]:
    """The stream's next batch as global arrays (:func:`put_batch`), and
    the seconds spent waiting for it (``data_wait_s``: the host blocked in the data stream; the
    batch itself is built ahead, by grain's prefetch thread or worker processes)."""
    t0 = time.perf_counter()
    host = next(run.data.train)
    wait = time.perf_counter() - t0
    return put_batch(host, run.steps.batch_sharding, run.config.train.global_batch), wait


def run_steps(
    run: Run,
    run_dir: pathlib.Path,
    stack: contextlib.ExitStack,
    start: Start,
    hooks: StepHooks,
) -> TrainResult:
    """Phase 3, the loop, and 4, finish: the step compiled for the first batch, the
    SIGTERM/SIGINT watcher (with checkpoints; ``stack`` restores the signals' actions), then the
    steps from ``start`` to ``train.steps``, each followed by the ``hooks``.

    Args:
      run: what phase 1 built (:func:`lcx.training.preflight.setup`).
      start: what phase 2 built (:func:`lcx.training.resume.restore`).
      run_dir: the run directory (for the result).
      stack: closes what the loop opens.
      hooks: run after each step (:func:`lcx.training.hooks.make_hooks`).

    Returns:
      The :class:`TrainResult` (``final_loss`` None when no step ran: a checkpoint that already
      reached ``train.steps``; its last loss is not this run's).

    Raises:
      FloatingPointError: a non-finite loss or gradient norm (:func:`train_step`).
    """
    state, total, val_loss = start.state, run.config.train.steps, start.val_loss
    losses: list[float] = []
    compile_s = None
    if start.done:
        log.info("checkpoint at step %d already reached train.steps=%d; nothing to train", start.step, total)
    else:
        batch, wait = next_batch(run)
        compiled, first = compile_step(run, state, batch, resumed=start.resumed)
        compile_s = first["compile_s"]
        stop = stack.enter_context(StopSignals(enabled=start.ckpts is not None))
        for step in range(start.step + 1, total + 1):
            assert batch is not None  # only the last step prefetches no next batch
            extra = first if step == start.step + 1 else {}
            state, (batch, wait), info = train_step(
                run, compiled, state, (batch, wait), step, extra, val_loss, start, hooks, stop
            )
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
        start_step=start.step,
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
    fed: tuple[dict[str, jax.Array], float],
    step: int,
    extra: dict[str, Any],
    val_loss: float | None,
    start: Start,
    hooks: StepHooks,
    stop: StopSignals,
) -> tuple[TrainState, tuple[dict[str, jax.Array] | None, float], StepInfo]:
    """Once per step: run step ``step`` on the batch ``fed`` (its arrays, and the seconds the
    host waited for them), prefetch the next batch while the devices work, and build the step's
    :class:`StepInfo` (its metrics record plus ``extra``). The record holds ``data_wait_s`` and,
    for a stream that counts them, the tokens drawn from each source so far (``tokens/<name>``,
    all processes together).

    Returns:
      ``(state, (next batch, its wait), info)``; no next batch after the last step.

    Raises:
      FloatingPointError: a non-finite loss or gradient norm (:func:`nonfinite_report`).
    """
    batch, data_wait = fed
    ts = time.perf_counter()
    params, opt_state, m = compiled(state.params, state.opt_state, batch)  # dispatched asynchronously
    # Host work overlaps the step on the devices: fetch the next batch while it runs.
    last = step == run.config.train.steps
    upcoming = (None, 0.0) if last else next_batch(run)
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
        where, saved = (start.ckpts.directory if start.ckpts is not None else None), hooks.saved_step
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
        "data_wait_s": data_wait,
        **{f"tokens/{name}": n for name, n in ((state.data or {}).get("tokens") or {}).items()},
        **extra,
    }
    return state, upcoming, StepInfo(state=state, last=last, loss=loss, record=record, val_loss=val_loss, stop=stop)


__all__ = ["StepHooks", "StepInfo", "StopSignals", "next_batch", "put_batch", "run_steps", "train_step"]
