"""The training loop, as a short sequence of named phases: :func:`prepare` (validate the plan;
build data, model, optimizer and steps), :func:`initial_state` (resumed from a checkpoint or
fresh), :func:`record_run` (claim the run directory), :func:`compile_step`, :func:`make_hooks`
(:mod:`lcx.training.hooks`: evaluation, metrics, progress, checkpoints), then
:func:`train_step` and the hooks once per step; it returns a
:class:`~lcx.training.state.TrainResult`.

Everything that can be wrong with the configuration (plan vs devices, model and batch; data
paths; sequence length; memory) is checked before anything compiles: :mod:`lcx.training.preflight`
(and its ``train.dry_run=true``) with :mod:`lcx.training.memcheck` (``train.check_memory``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import pathlib
import time
from typing import Any, cast

import equinox as eqx
import jax
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lcx.cost import hardware_from_config, training_flops
from lcx.data import Data, make_data
from lcx.models import init_model, model_shardings
from lcx.sharding import MeshPlan
from lcx.training.checkpoint import Checkpoints, Restored
from lcx.training.hooks import CheckpointHook, EvalHook, Hooks, ProgressHook, StepInfo, add_logging_hooks
from lcx.training.hooks import evaluate as evaluate
from lcx.training.optim import optimizer_from_config
from lcx.training.preflight import setup as setup
from lcx.training.resume import CheckpointConfig, check_resumable, checkpoint_config
from lcx.training.rundir import RunDirInUseError as RunDirInUseError
from lcx.training.rundir import claim_run_dir as claim_run_dir
from lcx.training.rundir import multirun_job, truncate_metrics, write_run_info
from lcx.training.runinfo import run_info
from lcx.training.signals import StopSignals
from lcx.training.state import (
    TrainResult,
    TrainState,
    abstract_train_state,
    finite_or_none,
    init_train_state,
    nonfinite_leaves,
)
from lcx.training.step import Steps, is_arraylike, make_steps, put_batch

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: str | pathlib.Path, devices=None) -> TrainResult:
    """Train as configured; write ``metrics.jsonl`` and ``run_info.json`` in ``run_dir``.

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
    run = prepare(cfg, devices)
    c = run.ckpt
    ckpts = Checkpoints(c.dir, keep=c.keep, async_save=c.async_save) if c.dir is not None else None
    state, restored = initial_state(run, ckpts)
    start = state.step
    record_run(run, run_dir, start, resumed=restored is not None)
    val_loss = restored.meta.get("val_loss") if restored is not None else None
    losses: list[float] = []
    compile_s = None
    with contextlib.ExitStack() as stack:
        if ckpts is not None:
            stack.callback(ckpts.close)  # an exception still lets an in-flight (good) save finish
        if start >= run.total_steps:
            # no step runs, so no loss is computed: the checkpoint's last loss is not this run's
            log.info("checkpoint at step %d already reached train.steps=%d; nothing to train", start, run.total_steps)
        else:
            batch = put_batch(next(run.data.train), run.steps.batch_sharding)
            train_c, first = compile_step(run, state, batch, resumed=restored is not None)
            compile_s = first["compile_s"]
            hooks, ckpt_hook = make_hooks(run, run_dir, stack, ckpts, start, resumed=restored is not None)
            for step in range(start + 1, run.total_steps + 1):
                assert batch is not None  # only the last step prefetches no next batch
                extra = first if step == start + 1 else {}
                state, batch, info = train_step(run, train_c, state, batch, step, extra, val_loss, ckpts, ckpt_hook)
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


@dataclasses.dataclass(frozen=True)
class Run:
    """What :func:`prepare` builds once per run: the checked configuration, its plan bound to
    the devices, the data, the model's structure, the optimizer and the (uncompiled) steps."""

    cfg: DictConfig
    resolved: dict[str, Any]
    ckpt: CheckpointConfig
    mp: MeshPlan
    model_cfg: Any
    devices: list
    data: Data
    hw: Any
    flops: Any
    key: jax.Array
    abstract_params: Any
    static: Any
    optimizer: Any
    schedule: Any
    steps: Steps
    t: DictConfig  # cfg.train
    total_steps: int  # train.steps


def prepare(cfg: DictConfig, devices=None) -> Run:
    """Phase 1: validate (:func:`lcx.training.preflight.setup`), then build the data, the model's
    abstract structure and shardings, the optimizer and the sharded steps. Nothing compiles.

    Raises:
      PlanError / ValueError: what :func:`train` raises before anything compiles.
    """
    t = cfg.train
    ckpt = checkpoint_config(cfg.get("checkpoint"))
    ctx = setup(cfg, devices)
    mp, model_cfg, devices = ctx.plan, ctx.model_cfg, ctx.devices
    # the root of a composed config converts to a dict (OmegaConf types the result loosely)
    resolved = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    data = make_data(
        cfg.data,
        seq_len=int(t.seq_len),
        global_batch=int(t.global_batch),
        layout=mp.plan.attention.layout,
        context_degree=mp.context_degree,
        seed=int(t.seed),
        layout_block=max(mp.plan.attention.block_q, mp.plan.attention.block_kv),
    )
    hw = hardware_from_config(cfg.hardware, len(devices))
    flops = training_flops(model_cfg, int(t.seq_len), int(t.global_batch), window=model_cfg.sliding_window)
    key = jax.random.key(int(t.seed))
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=key)
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    optimizer, schedule = optimizer_from_config(t)
    # where parameters and optimizer state live between steps: pinned_host when offloaded
    steps = make_steps(abstract, optimizer, mp, model_shardings(abstract, mp), ctx.memory)
    return Run(
        cfg=cfg,
        resolved=resolved,
        ckpt=ckpt,
        mp=mp,
        model_cfg=model_cfg,
        devices=devices,
        data=data,
        hw=hw,
        flops=flops,
        key=key,
        abstract_params=abstract_params,
        static=static,
        optimizer=optimizer,
        schedule=schedule,
        steps=steps,
        t=t,
        total_steps=int(t.steps),
    )


def initial_state(run: Run, ckpts: Checkpoints | None) -> tuple[TrainState, Restored | None]:
    """Phase 2: the newest readable checkpoint's :class:`TrainState` (checked resumable, the
    data stream moved to its position), or a fresh one at step 0.

    The training RNG stream is ``fold_in(key, 1)``. The step draws no randomness today (no
    dropout); the key is carried through checkpoints so that a stochastic step would resume
    exactly too.
    """
    if ckpts is not None:
        restored = ckpts.restore_latest(
            lambda: abstract_train_state(
                run.abstract_params,
                run.steps.param_shardings,
                run.optimizer,
                run.mp.replicated(),
                opt_shardings=run.steps.opt_shardings,
            ),
            check=lambda meta, where: check_resumable(
                meta, run.resolved, where=where, allow=run.ckpt.allow_config_change, job=multirun_job()
            ),
        )
        if restored is not None:
            run.data.train.resume(restored.meta["data"])
            log.info("resumed from %s at step %d", ckpts.directory / str(restored.step), restored.step)
            return restored.state.replace(data=run.data.train.state()), restored
    state = init_train_state(
        run.model_cfg,
        run.key,
        run.optimizer,
        run.steps,
        rng=jax.random.fold_in(run.key, 1),
        data=run.data.train.state(),
    )
    return state, None


def record_run(run: Run, run_dir: pathlib.Path, start: int, *, resumed: bool) -> None:
    """Phase 3: claim ``run_dir``, write ``run_info.json`` and drop ``metrics.jsonl`` lines of
    steps after ``start`` (a crashed attempt's, redone now).

    Raises:
      RunDirInUseError: ``run_dir`` holds another run's metrics.
    """
    claim_run_dir(run_dir, ckpt_dir=run.ckpt.dir, reuse=bool(run.t.reuse_run_dir))
    info = run_info(run.devices)
    info["config"] = run.resolved
    info["plan"] = repr(run.mp.plan)
    info["mesh"] = dict(run.mp.mesh.shape)
    info["peak_flops_per_device"] = run.hw.peak_flops_per_device
    info["model_flops_per_step"] = run.flops.total
    info["checkpoint_dir"] = str(run.ckpt.dir) if run.ckpt.enabled else None
    info["resumed_from_step"] = start if resumed else None
    write_run_info(run_dir, info)
    truncate_metrics(run_dir / "metrics.jsonl", start)


def compile_step(
    run: Run, state: TrainState, batch: dict[str, jax.Array], *, resumed: bool
) -> tuple[jax.stages.Compiled, dict[str, Any]]:
    """Phase 4: compile the train step for ``batch``'s shapes.

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


def make_hooks(
    run: Run,
    run_dir: pathlib.Path,
    stack: contextlib.ExitStack,
    ckpts: Checkpoints | None,
    start: int,
    *,
    resumed: bool,
) -> tuple[Hooks, CheckpointHook | None]:
    """Phase 5: the hooks, in the order they run after a step: evaluation (every
    ``train.eval_every``), the ``metrics.jsonl`` line (every ``train.log_every`` and at each
    evaluation) and, with ``train.tensorboard``, the same record as TensorBoard scalars in
    ``run_dir/tensorboard``, the progress bar, checkpoints (with the SIGTERM/SIGINT watcher).
    What they open is closed by ``stack``."""
    stop = stack.enter_context(StopSignals(enabled=ckpts is not None))
    hooks = Hooks()
    if int(run.t.eval_every) > 0:
        hooks.add_hook(EvalHook(run.steps, run.data, int(run.t.eval_batches)), every=int(run.t.eval_every))
    add_logging_hooks(
        hooks, run_dir, stack, every=int(run.t.log_every), start=start, tensorboard=bool(run.t.tensorboard)
    )
    bar = stack.enter_context(
        tqdm(total=run.total_steps, initial=start, desc=f"train[{run.mp.plan.name}]", unit="step")
    )
    hooks.add_hook(ProgressHook(bar))
    if ckpts is None:
        return hooks, None
    ckpt_hook = CheckpointHook(
        ckpts, run.ckpt, stop, lambda loss, val: checkpoint_meta(run, loss, val), saved_step=start if resumed else None
    )
    hooks.add_hook(ckpt_hook)
    return hooks, ckpt_hook


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
    """Phase 6, once per step: run step ``step`` on ``batch``, prefetch the next batch while the
    devices work, and build the step's :class:`StepInfo` (its metrics record plus ``extra``).

    Raises:
      FloatingPointError: a non-finite loss or gradient norm (:func:`nonfinite_report`).
    """
    ts = time.perf_counter()
    params, opt_state, m = compiled(state.params, state.opt_state, batch)  # dispatched asynchronously
    # Host work overlaps the step on the devices: fetch the next batch while it runs.
    last = step == run.total_steps
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
        raise FloatingPointError(
            nonfinite_report(state, loss, grad_norm, ckpts, ckpt_hook.saved_step if ckpt_hook is not None else None)
        )
    record = {
        "step": step,
        "loss": loss,
        "tokens_per_sec": int(run.t.seq_len) * int(run.t.global_batch) / dt,
        "mfu": run.flops.total / dt / (run.hw.peak_flops_per_device * len(run.devices)),
        "step_time_s": dt,
        "lr": float(run.schedule(step - 1)),
        "grad_norm": grad_norm,
        "valid_tokens": float(m["tokens"]),
        **extra,
    }
    return state, next_batch, StepInfo(state=state, last=last, loss=loss, record=record, val_loss=val_loss)


def checkpoint_meta(run: Run, loss: float | None, val: float | None) -> dict[str, Any]:
    """The run's part of a checkpoint's ``meta`` (the state adds step, data position, RNG)."""
    return {
        "loss": finite_or_none(loss),
        "val_loss": finite_or_none(val),
        "plan": repr(run.mp.plan),
        "mesh": {k: int(v) for k, v in run.mp.mesh.shape.items()},
        "config": run.resolved,
        "sweep": multirun_job(),  # which job of which sweep wrote it (None: not a multirun)
    }


def nonfinite_report(
    state: TrainState, loss: float, grad_norm: float, ckpts: Checkpoints | None, saved_step: int | None
) -> str:
    """The diagnostic of a non-finite step: which scalars, which tensors, what was kept."""
    step = state.step
    bad = nonfinite_leaves(state.arrays())
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    msg = f"non-finite {what} at step {step} (loss={loss}, grad_norm={grad_norm}); "
    if bad:
        msg += f"non-finite tensors after the update: {', '.join(bad[:8])}"
        msg += f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    else:
        msg += "parameters and optimizer state are still finite (the forward pass overflowed)"
    if ckpts is not None:
        msg += (
            f". Step {step} was not checkpointed; the last checkpoint is step {saved_step} in {ckpts.directory}"
            if saved_step is not None
            else f". Nothing was checkpointed in {ckpts.directory}"
        )
    return msg + ". Lower train.lr, lengthen train.warmup_steps or check the data"


__all__ = ["Run", "TrainResult", "TrainState", "train"]
