"""The training loop: validate the plan, build data, model and optimizer, train, log, evaluate,
checkpoint (:mod:`lcx.training.checkpoint`) and resume.

Everything that can be wrong with the configuration (plan vs devices, model and batch; data
paths; sequence length; memory) is checked before anything compiles: :mod:`lcx.training.preflight`
(and its ``train.dry_run=true``) with :mod:`lcx.training.memcheck` (``train.check_memory``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any

import equinox as eqx
import jax
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lcx.cost import hardware_from_config, training_flops
from lcx.data import make_data
from lcx.models import init_model, model_shardings
from lcx.sharding import MeshPlan
from lcx.training.checkpoint import (
    CheckpointSaveError,
    Checkpoints,
    abstract_train_state,
    check_resumable,
    checkpoint_config,
    multirun_job,
    is_arraylike,
    finite_or_none,
    key_from_json,
    key_to_json,
    nonfinite_leaves,
)
from lcx.training.memory import MemoryOptions
from lcx.training.preflight import setup
from lcx.training.optim import optimizer_from_config
from lcx.training.runinfo import run_info
from lcx.training.step import init_opt_state, make_steps, put_batch

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: str | pathlib.Path, devices=None) -> dict[str, Any]:
    """Train as configured; write ``metrics.jsonl`` and ``run_info.json`` in ``run_dir``.

    With ``checkpoint.dir`` set, resumes from the newest readable checkpoint there (if any),
    saves every ``checkpoint.every`` steps and at the end, and on SIGTERM/SIGINT saves the
    current step before exiting. A resumed run continues ``metrics.jsonl`` (lines of steps
    after the restored one, written before a crash, are dropped) and reproduces the losses of
    an uninterrupted run exactly: parameters, optimizer state (hence the learning-rate
    schedule), data position, RNG key and step counter all come from the checkpoint.

    Returns:
      Summary dict: ``losses`` (per step run by this call), ``final_loss`` (the last step's loss;
      None when this call trained no step: the checkpoint already reached ``train.steps``),
      ``val_loss`` (last; the checkpoint's when no step was trained), ``params`` (final
      parameters, for tests), ``static``, ``run_dir``, ``compile_s``, ``start_step`` (steps
      already done when this call began: 0, or the restored step).

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
        (:func:`claim_run_dir`; ``train.reuse_run_dir=true`` keeps it and goes on).
      FloatingPointError: a non-finite loss (names the step and the non-finite tensors); no
        checkpoint of that state is written.
      SystemExit: after SIGTERM/SIGINT, with code 128 + signal number, once the final
        checkpoint is on disk.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = cfg.train
    total_steps = int(t.steps)
    ckpt_cfg = checkpoint_config(cfg.get("checkpoint"))
    ctx = setup(cfg, devices)
    mp: MeshPlan = ctx["plan"]
    model_cfg = ctx["model_cfg"]
    devices = ctx["devices"]
    memory: MemoryOptions = ctx["memory"]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    data = make_data(
        cfg.data,
        seq_len=int(t.seq_len),
        global_batch=int(t.global_batch),
        layout=mp.plan.attention.layout,
        context_degree=mp.context_degree,
        seed=int(t.seed),
    )
    hw = hardware_from_config(cfg.hardware, len(devices))
    flops = training_flops(model_cfg, int(t.seq_len), int(t.global_batch), window=model_cfg.sliding_window)

    key = jax.random.key(int(t.seed))
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=key)
    p_shard = model_shardings(abstract, mp)
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    optimizer, schedule = optimizer_from_config(t)
    # where parameters and optimizer state live between steps: pinned_host when offloaded
    steps = make_steps(abstract, optimizer, mp, p_shard, memory)

    # The training RNG stream. The step draws no randomness today (no dropout); the key is
    # carried through checkpoints so that a stochastic step would resume exactly too.
    rng = jax.random.fold_in(key, 1)
    start = 0
    ckpts = Checkpoints(ckpt_cfg.dir, keep=ckpt_cfg.keep, async_save=ckpt_cfg.async_save) if ckpt_cfg.enabled else None
    restored = None
    if ckpts is not None:
        restored = ckpts.restore_latest(
            lambda: abstract_train_state(abstract_params, steps.param_shardings, optimizer, mp.replicated(),
                                         opt_shardings=steps.opt_shardings),
            check=lambda meta, where: check_resumable(meta, resolved, where=where,
                                                      allow=ckpt_cfg.allow_config_change, job=multirun_job()),
        )
    if restored is not None:
        params, opt_state = restored.state["params"], restored.state["opt_state"]
        _restore_data(data.train, restored.meta["data"])
        rng = key_from_json(restored.meta["rng"])
        start = int(restored.meta["step"])
        log.info("resumed from %s at step %d", ckpts.directory / str(start), start)
    else:
        params = jax.jit(lambda k: eqx.filter(init_model(model_cfg, key=k), eqx.is_array),
                         out_shardings=steps.param_shardings)(key)
        opt_state = None
    if opt_state is None:
        opt_state = init_opt_state(optimizer, params, steps.opt_shardings)

    metrics_path = run_dir / "metrics.jsonl"
    claim_run_dir(run_dir, ckpt_dir=ckpt_cfg.dir, reuse=bool(t.reuse_run_dir))
    info = run_info(devices)
    info["config"] = resolved
    info["plan"] = repr(mp.plan)
    info["mesh"] = dict(mp.mesh.shape)
    info["peak_flops_per_device"] = hw.peak_flops_per_device
    info["model_flops_per_step"] = flops.total
    info["checkpoint_dir"] = str(ckpt_cfg.dir) if ckpt_cfg.enabled else None
    info["resumed_from_step"] = start if restored is not None else None
    _keep_aside(run_dir / "run_info.json")  # a resumed run's earlier attempts keep their record
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))
    _truncate_metrics(metrics_path, start)

    def meta(step: int, loss: float | None, val: float | None) -> dict[str, Any]:
        return {
            "step": step,
            "data": data.train.state(),
            "rng": key_to_json(rng),
            "loss": finite_or_none(loss),
            "val_loss": finite_or_none(val),
            "plan": repr(mp.plan),
            "mesh": {k: int(v) for k, v in mp.mesh.shape.items()},
            "config": resolved,
            "sweep": multirun_job(),  # which job of which sweep wrote it (None: not a multirun)
        }

    losses: list[float] = []
    val_loss = restored.meta.get("val_loss") if restored is not None else None
    compile_s = None
    if start >= total_steps:
        # no step runs, so no loss is computed: the checkpoint's last loss is not this run's
        log.info("checkpoint at step %d already reached train.steps=%d; nothing to train", start, total_steps)
        if ckpts is not None:
            ckpts.close()
        return {
            "losses": losses,
            "final_loss": None,
            "val_loss": val_loss,
            "params": params,
            "static": static,
            "run_dir": str(run_dir),
            "compile_s": compile_s,
            "start_step": start,
        }

    batch = put_batch(next(data.train), steps.batch_sharding)
    t0 = time.perf_counter()
    train_c = steps.train.lower(params, opt_state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = train_c.memory_analysis()
    temp_bytes = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None

    tokens_per_step = int(t.seq_len) * int(t.global_batch)
    peak_total = hw.peak_flops_per_device * len(devices)
    log_every = max(1, int(t.log_every))
    eval_every = int(t.eval_every)
    saved_step = start if restored is not None else None
    save_started = None  # the step whose save is in flight: its outcome is checked at the next step
    retry_save, retried = False, False
    last_good = saved_step  # the newest checkpoint known to be on disk
    with contextlib.ExitStack() as stack:
        if ckpts is not None:
            stack.callback(ckpts.close)  # an exception still lets an in-flight (good) save finish
        stop = stack.enter_context(_StopSignals(enabled=ckpts is not None))
        mf = stack.enter_context(metrics_path.open("a"))
        bar = stack.enter_context(
            tqdm(total=total_steps, initial=start, desc=f"train[{mp.plan.name}]", unit="step")
        )
        for step in range(start + 1, total_steps + 1):
            ts = time.perf_counter()
            params, opt_state, m = train_c(params, opt_state, batch)  # dispatched asynchronously
            # Host work overlaps the step on the devices: fetch the next batch while it runs.
            if step < total_steps:
                batch = put_batch(next(data.train), steps.batch_sharding)
            loss = float(m["loss"])  # blocks: the step time below is the whole step
            dt = time.perf_counter() - ts
            grad_norm = float(m["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                # A non-finite gradient poisons the update even when the loss is still finite;
                # both scalars are on the host already, so this check costs nothing per step.
                raise FloatingPointError(_nonfinite_report(step, loss, grad_norm, params, opt_state, ckpts, saved_step))
            losses.append(loss)
            rec = {
                "step": step,
                "loss": loss,
                "tokens_per_sec": tokens_per_step / dt,
                "mfu": flops.total / dt / peak_total,
                "step_time_s": dt,
                "lr": float(schedule(step - 1)),
                "grad_norm": grad_norm,
                "valid_tokens": float(m["tokens"]),
            }
            if step == start + 1:
                rec["compile_s"] = compile_s
                rec["temp_bytes_per_device"] = temp_bytes
                if restored is not None:
                    rec["resumed_from"] = start
            if eval_every > 0 and (step % eval_every == 0 or step == total_steps):
                val_loss = evaluate(steps, params, data.val_batches(int(t.eval_batches)))
                rec["val_loss"] = val_loss
            if step % log_every == 0 or "val_loss" in rec or step == total_steps:
                mf.write(json.dumps(rec) + "\n")
                mf.flush()
            post = {"loss": f"{loss:.3f}", "tok/s": f"{rec['tokens_per_sec']:.0f}"}
            if val_loss is not None:
                post["val"] = f"{val_loss:.3f}"
            bar.set_postfix(post)
            bar.update(1)
            if ckpts is not None and save_started is not None:
                # the save of the previous step overlapped this step; a failure is raised now, naming
                # its step, not at some later save (or never)
                try:
                    ckpts.check(wait=True)
                    retried, last_good = False, save_started
                except CheckpointSaveError as e:
                    saved_step = last_good
                    if ckpt_cfg.on_save_error != "retry" or retried:
                        raise
                    log.warning("%s; checkpoint.on_save_error=retry: saving step %d instead", e, step)
                    retry_save, retried = True, True
                save_started = None
            if ckpts is not None and (ckpt_cfg.due(step) or step == total_steps or stop.signum or retry_save):
                # the data position must be the one after this step's batch, not the prefetched one
                state = meta(step, loss, val_loss)
                state["data"] = _rewind(data.train, 1 if step < total_steps else 0)
                ckpts.save(step, params, opt_state, state)
                saved_step, save_started, retry_save = step, step, False
            if stop.signum:
                ckpts.wait()
                name = signal.Signals(stop.signum).name
                msg = f"{name}: checkpoint of step {step} saved in {ckpts.directory}; exiting"
                log.warning(msg)
                print(msg, file=sys.stderr, flush=True)
                raise SystemExit(128 + stop.signum)
    return {
        "losses": losses,
        "final_loss": losses[-1],
        "val_loss": val_loss,
        "params": params,
        "static": static,
        "run_dir": str(run_dir),
        "compile_s": compile_s,
        "start_step": start,
    }


def _nonfinite_report(step, loss, grad_norm, params, opt_state, ckpts, saved_step) -> str:
    """The diagnostic of a non-finite step: which scalars, which tensors, what was kept."""
    bad = nonfinite_leaves({"params": params, "opt_state": opt_state})
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


def _restore_data(batches, state: dict[str, Any]) -> None:
    """``batches.restore(state)``, or, when the checkpoint was written at another sequence length
    (the previous stage of a length-extension schedule, :mod:`lcx.training.schedule`), continue
    in the same epoch at the same fraction of its tokens (to within one row)."""
    old_len = state.get("seq_len")
    if old_len is None or int(old_len) == batches.seq_len:
        batches.restore(state)
        return
    if "num_tokens" not in state:
        # a generated stream (data=passkey): rows are drawn from (seed, row index) at whatever
        # length the stage asks for, so it simply continues at the next row
        log.info("sequence length %s -> %d: generated data continues at row %s", old_len, batches.seq_len,
                 state.get("row"))
        batches.restore({**state, "seq_len": batches.seq_len})
        return
    fraction = min(1.0, int(state["row"]) * int(old_len) / max(1, int(state["num_tokens"])))
    row = min(batches.rows_per_epoch - 1, int(fraction * batches.rows_per_epoch))
    log.info("sequence length %s -> %d: data continues at row %d of epoch %s", old_len, batches.seq_len, row,
             state["epoch"])
    batches.restore({**state, "seq_len": batches.seq_len, "num_tokens": batches.num_tokens, "row": row})


def _rewind(batches, n: int) -> dict[str, int]:
    """``batches.state()`` as it was ``n`` batches ago (the iterator only moves forward)."""
    st = batches.state()
    row = st["epoch"] * batches.rows_per_epoch + st["row"] - n * batches.global_batch
    return dict(st, epoch=row // batches.rows_per_epoch, row=row % batches.rows_per_epoch)


class RunDirInUseError(ValueError):
    """The run directory holds another run's ``metrics.jsonl``."""


def claim_run_dir(run_dir: pathlib.Path, *, ckpt_dir: pathlib.Path | None, reuse: bool) -> None:
    """Make ``run_dir`` this run's, or refuse: nothing another run wrote is ever overwritten.

    - No ``metrics.jsonl`` there: it is created empty with ``O_EXCL``, so of two processes that
      race for one directory exactly one wins; the other is refused.
    - One there, written by a run with this run's ``checkpoint.dir`` (its ``run_info.json`` says
      so): the checkpoint-resume path; :func:`_truncate_metrics` keeps the lines up to the
      restored step.
    - One there from another run: refused, unless ``reuse`` (``train.reuse_run_dir=true``), which
      renames that run's ``metrics.jsonl`` and ``run_info.json`` with a time stamp (kept, never
      deleted) and starts a new ``metrics.jsonl``.

    Raises:
      RunDirInUseError: another run's metrics are there and ``reuse`` is off; names the fix.
    """
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        if ckpt_dir is not None and _run_info_checkpoint_dir(run_dir) == str(ckpt_dir):
            return  # this run's own directory, resumed from its checkpoint
        if reuse:
            for p in (metrics, run_dir / "run_info.json"):
                kept = _keep_aside(p)
                if kept is not None:
                    log.warning("train.reuse_run_dir=true: the previous run's %s is kept as %s", p.name, kept.name)
        else:
            raise RunDirInUseError(_in_use_message(run_dir))
    try:
        os.close(os.open(metrics, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:  # another process claimed it between the check and here
        raise RunDirInUseError(_in_use_message(run_dir)) from None


def _in_use_message(run_dir: pathlib.Path) -> str:
    return (f"run directory {run_dir} already holds another run's metrics.jsonl; refusing to overwrite it. Use a "
            f"new directory (the default hydra.run.dir is unique per launch; drop the hydra.run.dir override), resume "
            f"that run with its own checkpoint.dir, or set train.reuse_run_dir=true to keep its files (renamed) and "
            f"write this run there")


def _run_info_checkpoint_dir(run_dir: pathlib.Path) -> str | None:
    try:
        return json.loads((run_dir / "run_info.json").read_text()).get("checkpoint_dir")
    except (OSError, ValueError, AttributeError):
        return None


def _keep_aside(path: pathlib.Path) -> pathlib.Path | None:
    """Rename ``path`` to ``<stem>.<UTC time>.<suffix>`` if it exists; return the new path."""
    if not path.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:]
    dst = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
    os.replace(path, dst)
    return dst


def _truncate_metrics(path: pathlib.Path, step: int) -> None:
    """Keep the lines of ``metrics.jsonl`` for steps ``<= step`` (a resumed run re-does the steps
    after its checkpoint; their first, lost attempt must not appear twice). Atomic rename, so a
    crash here leaves the old file or the new one, never half of one."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by a crash: everything after it is untrustworthy
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


class _StopSignals:
    """While active, SIGTERM and SIGINT only set ``signum``; the loop saves and exits at the end
    of the current step. A second signal restores the previous action and re-raises it, so a
    stuck save can still be interrupted. With ``enabled=False`` (no checkpointing) or outside
    the main thread (where Python forbids signal handlers) this does nothing."""

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


def evaluate(steps, params, batches) -> float:
    """Validation loss in nats/token: global sum over all batches / global valid-token count."""
    total, count = 0.0, 0.0
    for b in batches:
        s, c = steps.evaluate(params, put_batch(b, steps.batch_sharding))
        total += float(s)
        count += float(c)
    if count == 0:
        raise ValueError("validation set has no valid tokens; raise data.val_fraction")
    return total / count

