"""Checkpoints that survive faults and change plans (orbax).

A checkpoint is one orbax step directory ``<checkpoint.dir>/<step>/`` with two items:

- ``state`` (``StandardSave``): ``{"params": ..., "opt_state": ...}``, every array written by
  the devices that hold it, with its logical shape; nothing about the writer's mesh is needed
  to read it back.
- ``meta`` (``JsonSave``): the step, the data iterator position (:meth:`lcx.data.Batches.state`),
  the RNG key data, the last loss, and the resolved configuration of the run.

Saves are asynchronous: :meth:`Checkpoints.save` returns once the arrays are copied to host
memory, and a background thread writes them into a temporary directory that orbax renames to
``<step>`` only when every file is written. A process killed at any moment (mid-save
included) therefore leaves only complete step directories plus, at worst, a temporary one,
which the next :class:`Checkpoints` deletes.

Restoring builds its targets from abstract arrays (``jax.ShapeDtypeStruct``) that carry the
*new* run's shardings, so a checkpoint written under one plan (ring over 8 devices) is read
directly into another (USP 2x4, FSDP, one device): each device reads only its own shard.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import pathlib
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from lcx.training.step import is_arraylike, opt_state_shardings

log = logging.getLogger(__name__)

# Sub-directory of checkpoint.dir that unreadable checkpoints are moved into. Its name is not a
# step number, so orbax never mistakes it (or anything inside it) for a checkpoint.
CORRUPT_DIR = "corrupt"
# What orbax appends to a step directory's name while the step is being written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointMismatchError(ValueError):
    """A checkpoint cannot serve this run: it was written for a different model configuration."""


class NoUsableCheckpointError(RuntimeError):
    """Checkpoints exist but none of them can be read."""


class CheckpointSaveError(RuntimeError):
    """A save failed (disk full, permissions, ...): names the step, the cause and what was kept."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """The ``checkpoint:`` section of the training config.

    Attributes:
      dir: absolute checkpoint directory, or None (checkpointing off).
      every: steps between periodic saves; 0 saves only at the end and on SIGTERM/SIGINT.
      keep: number of most recent checkpoints kept (older ones are deleted), ``>= 1``.
      async_save: write in a background thread while training continues.
      allow_config_change: resume from a checkpoint whose training config differs
        (:func:`config_changes`); off: such a resume is refused.
      on_save_error: ``stop``: a failed save stops training (:class:`CheckpointSaveError`);
        ``retry``: the loop logs it and saves the next step's state instead (a second failure in
        a row stops).
    """

    dir: pathlib.Path | None
    every: int
    keep: int
    async_save: bool
    allow_config_change: bool
    on_save_error: str

    def __post_init__(self):
        if self.on_save_error not in ("stop", "retry"):
            raise ValueError(f"checkpoint.on_save_error={self.on_save_error!r}: use stop (a failed save stops "
                             "training) or retry (save the next step instead, once)")
        if self.every < 0:
            raise ValueError(f"checkpoint.every must be >= 0 (0: only at the end), got {self.every}")
        if self.keep < 1:
            raise ValueError(f"checkpoint.keep must be >= 1, got {self.keep}")

    @property
    def enabled(self) -> bool:
        return self.dir is not None

    def due(self, step: int) -> bool:
        """Whether ``step`` (1-based count of completed steps) is a periodic save step."""
        return self.every > 0 and step % self.every == 0


def launch_dir() -> pathlib.Path:
    """The directory the run was launched from: Hydra's ``runtime.cwd`` when Hydra runs the job
    (it may have changed the working directory), else the current directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return pathlib.Path(HydraConfig.get().runtime.cwd)
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return pathlib.Path.cwd()


def multirun_job() -> dict[str, Any] | None:
    """``{"sweep_dir", "job", "output_dir"}`` of the Hydra multirun job this process runs, or None
    outside a multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized():
            hc = HydraConfig.get()
            if hc.mode == RunMode.MULTIRUN:
                return {"sweep_dir": str(pathlib.Path(hc.sweep.dir).absolute()), "job": int(hc.job.num),
                        "output_dir": str(hc.runtime.output_dir)}
    except ImportError:  # pragma: no cover - hydra is a dependency
        pass
    return None


def resolve_dir(d: Any, *, per_job: bool = False) -> pathlib.Path | None:
    """A configured directory as an absolute path (None or "": None). Relative paths resolve
    against :func:`launch_dir`, so ``checkpoint.dir=ckpt`` means the same place whatever Hydra
    does with the working directory; with ``per_job`` under a Hydra multirun, against the job's
    own directory (``<sweep dir>/<job subdir>/ckpt``), so the jobs of a sweep never share one."""
    if d in (None, ""):
        return None
    path = pathlib.Path(os.path.expanduser(str(d)))
    if path.is_absolute():
        return path
    job = multirun_job() if per_job else None
    return (pathlib.Path(job["output_dir"]) if job else launch_dir()) / path


def checkpoint_config(node: Any) -> CheckpointConfig:
    """:class:`CheckpointConfig` from the ``checkpoint`` section of an ``lcx.train`` config,
    checked against :class:`lcx.conf.schema.CheckpointSchema` (every key, typed; the values
    are ``lcx/conf/config.yaml``'s, there are no defaults in code). None: checkpointing off.

    Raises:
      ValueError: an unknown, missing or mistyped key; ``every < 0`` or ``keep < 1``.
    """
    from lcx.conf.schema import CheckpointSchema, check_section

    if node is None:
        return CheckpointConfig(dir=None, every=0, keep=1, async_save=False, allow_config_change=False,
                                on_save_error="stop")
    c = check_section(node, CheckpointSchema, "checkpoint", tool="lcx.train")
    return CheckpointConfig(dir=resolve_dir(c["dir"], per_job=True), every=c["every"], keep=c["keep"],
                            async_save=c["async_save"], allow_config_change=c["allow_config_change"],
                            on_save_error=c["on_save_error"])


# -- abstract targets -----------------------------------------------------------------------------


def abstract_like(tree: Any, shardings: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves with the shapes and dtypes of ``tree`` and the given
    shardings: the restore target that makes orbax place each shard on the new plan's devices.

    Args:
      tree: pytree of arrays or ``ShapeDtypeStruct`` (e.g. from ``jax.eval_shape``).
      shardings: pytree of ``Sharding`` with the structure of ``tree``.
    """
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_train_state(abstract_params: Any, param_shardings: Any, optimizer: optax.GradientTransformation,
                         replicated: jax.sharding.Sharding, *, opt_shardings: Any = None) -> dict[str, Any]:
    """Restore target ``{"params", "opt_state"}`` for a model under a plan.

    Args:
      abstract_params: ``eqx.filter(abstract_model, is_arraylike)``: pytree of
        ``ShapeDtypeStruct`` (None where the model has no array).
      param_shardings: matching pytree of ``NamedSharding`` (:func:`lcx.models.model_shardings`).
      optimizer: the optax transformation whose state was saved.
      replicated: the plan's replicated sharding (``MeshPlan.replicated()``), for optax's
        scalar ``count``.
      opt_shardings: the optimizer state's shardings (default: each state like its parameter,
        :func:`lcx.training.step.opt_state_shardings`); ``Steps.opt_shardings`` places it where
        the run keeps it (``pinned_host`` with ``memory.offload_optimizer``). A checkpoint
        written from either memory kind restores into either.
    """
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    if opt_shardings is None:
        opt_shardings = opt_state_shardings(optimizer, abstract_params, param_shardings, replicated)
    return {
        "params": abstract_like(abstract_params, param_shardings),
        "opt_state": abstract_like(abstract_opt, opt_shardings),
    }


def train_state_target(config: Mapping[str, Any], mp: Any) -> tuple[dict[str, Any], Any]:
    """Restore target for a run's resolved ``config`` (as stored in a checkpoint's ``meta``)
    under the bound plan ``mp`` (:class:`lcx.sharding.MeshPlan`), which may differ from the
    plan that wrote the checkpoint.

    Returns:
      ``(target, static)``: ``{"params", "opt_state"}`` of ``ShapeDtypeStruct`` with ``mp``'s
      shardings, and the model's static part (``eqx.combine(params, static)`` is the model).
    """
    import equinox as eqx  # noqa: PLC0415 - keep this module's import light for the loop

    from lcx.models import ModelConfig, init_model, model_shardings
    from lcx.training.optim import optimizer_from_config

    model_cfg = ModelConfig.from_dict(dict(config["model"]))
    optimizer, _ = optimizer_from_config(config["train"])
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=jax.random.key(0))
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    target = abstract_train_state(abstract_params, model_shardings(abstract, mp), optimizer, mp.replicated())
    return target, static


def load_model(directory: str | os.PathLike, mp: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The model of a checkpoint, placed on the bound plan ``mp`` (any plan, any device count).

    Args:
      directory: a ``checkpoint.dir``.
      mp: :class:`lcx.sharding.MeshPlan` to place the parameters by.
      step: checkpoint step; default the newest.

    Returns:
      ``(model, meta)``.

    Raises:
      FileNotFoundError: no checkpoint in ``directory`` (or no such ``step``).
    """
    ckpts = Checkpoints(directory, read_only=True)
    try:
        steps = ckpts.steps()
        if not steps or (step is not None and step not in steps):
            raise FileNotFoundError(f"no checkpoint{'' if step is None else f' for step {step}'} in {directory}; "
                                    f"steps there: {steps}")
        step = steps[-1] if step is None else step
        target, static = train_state_target(ckpts.read_meta(step)["config"], mp)
        r = ckpts.restore(step, target)
    finally:
        ckpts.close()
    import equinox as eqx  # noqa: PLC0415

    return eqx.combine(r.state["params"], static), r.meta


# -- checks ---------------------------------------------------------------------------------------


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths (``jax.tree_util.keystr``) of the floating-point leaves of ``tree`` that hold a NaN
    or an infinity; empty if all are finite. One small reduction per leaf, run on the devices."""
    leaves = [
        (jax.tree_util.keystr(p), x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
    ]
    if not leaves:
        return []
    flags = jax.device_get(_all_finite([x for _, x in leaves]))
    return [name for (name, _), ok in zip(leaves, flags) if not bool(ok)]


@jax.jit
def _all_finite(xs):
    return [jnp.all(jnp.isfinite(x)) for x in xs]


def check_compatible(meta: Mapping[str, Any], model: Mapping[str, Any], *, where: str) -> None:
    """Refuse a checkpoint written for a different model configuration.

    Args:
      meta: the checkpoint's ``meta`` item (its ``config.model`` is compared).
      model: this run's resolved ``model`` config.
      where: the checkpoint's path, for the message.

    ``model.remat`` (with its ``model.remat_*`` placements) and the RoPE fields
    (``model.rope_*``) may differ: neither changes a parameter, and a length-extension stage changes RoPE scaling on purpose (logged).

    Raises:
      CheckpointMismatchError: some other ``model.<field>`` differs; the message names the field,
        both values and the fix.
    """
    saved = dict((meta.get("config") or {}).get("model") or {})
    # `remat` trades memory for compute, and the RoPE fields (rope_theta, rope_scaling_*, ...)
    # change positions' phases, not a parameter: a length-extension stage changes them on purpose
    # (lcx.training.schedule). Both may differ; RoPE changes are logged.
    rope = sorted(k for k in set(saved) | set(model) if k.startswith("rope_") and saved.get(k) != model.get(k))
    if rope:
        log.warning(
            "resuming %s with changed RoPE settings: %s",
            where,
            ", ".join(f"model.{k}: {saved.get(k)!r} -> {model.get(k)!r}" for k in rope),
        )
    # remat_* placements (absent from checkpoints written before they existed) likewise
    ignore = {"remat", *rope, *(k for k in set(saved) | set(model) if k.startswith("remat_"))}
    diff = sorted(k for k in set(saved) | set(model) if k not in ignore and saved.get(k) != model.get(k))
    if diff:
        k = diff[0]
        more = f" (and {', '.join('model.' + d for d in diff[1:])})" if len(diff) > 1 else ""
        raise CheckpointMismatchError(
            f"checkpoint {where} was written for model.{k}={saved.get(k)!r} but this run has "
            f"model.{k}={model.get(k)!r}{more}; resume with the checkpoint's model config "
            f"(e.g. model.{k}={saved.get(k)}) or point checkpoint.dir at a new directory"
        )


TRAIN_KEYS_FREE = frozenset({"log_every", "eval_every", "eval_batches", "check_memory", "dry_run", "reuse_run_dir"})
"""``train.*`` keys a resume may change: what is logged and checked, not what is trained."""
STAGE_KEYS = frozenset({"seq_len", "steps", "schedule_start", "lr", "warmup_steps", "global_batch"})
"""``train.*`` keys a length-extension stage sets (:func:`lcx.training.schedule.stage_config`)."""


class CheckpointConfigChangedError(CheckpointMismatchError):
    """The checkpoint was written by a run with another training config."""


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any], step: int) -> list[str]:
    """The training-relevant differences between a checkpoint's config and this run's.

    Compared: every ``train.*`` key but :data:`TRAIN_KEYS_FREE` (``train.steps`` may grow: an
    extension; it may shrink only to at most ``step``, where nothing is trained), and every
    ``data.*`` key. ``model.*`` is :func:`check_compatible`'s; ``plan``, ``hardware`` and
    ``memory`` may change (a checkpoint restores into any plan). At a stage boundary of a
    length-extension schedule (``train.schedule_start == step``) the keys a stage sets
    (:data:`STAGE_KEYS`) change on purpose. Keys present in only one config (written by an older
    lcx) are not compared.

    Returns:
      ``"train.lr: 0.003 -> 0.001"`` lines, sorted.
    """
    out = []
    st, nt = dict(saved.get("train") or {}), dict(now.get("train") or {})
    boundary = nt.get("schedule_start") is not None and int(nt["schedule_start"]) == int(step)
    for k in sorted(set(st) & set(nt)):
        a, b = st[k], nt[k]
        if k in TRAIN_KEYS_FREE or a == b or (boundary and k in STAGE_KEYS):
            continue
        if k == "steps" and isinstance(a, int) and isinstance(b, int) and (b >= a or b <= step):
            continue
        out.append(f"train.{k}: {a!r} -> {b!r}")
    sd, nd = dict(saved.get("data") or {}), dict(now.get("data") or {})
    out += [f"data.{k}: {sd[k]!r} -> {nd[k]!r}" for k in sorted(set(sd) & set(nd)) if sd[k] != nd[k]]
    return out


def check_resumable(meta: Mapping[str, Any], config: Mapping[str, Any], *, where: str, allow: bool,
                    job: Mapping[str, Any] | None = None) -> None:
    """Refuse to resume from a checkpoint that another run wrote.

    Args:
      meta: the checkpoint's ``meta`` item.
      config: this run's resolved config.
      where: the checkpoint's path, for messages.
      allow: ``checkpoint.allow_config_change``: changes are logged instead of refused.
      job: this process's :func:`multirun_job` (None: not a multirun).

    Raises:
      CheckpointMismatchError: the model differs (:func:`check_compatible`), or the checkpoint was
        written by another job of this sweep (a ``checkpoint.dir`` shared by the jobs).
      CheckpointConfigChangedError: the training config differs (names every differing key), and
        ``allow`` is off.
    """
    check_compatible(meta, dict(config.get("model") or {}), where=where)
    wrote = meta.get("sweep") or {}
    if job is not None and wrote.get("sweep_dir") == job["sweep_dir"] and wrote.get("job") != job["job"]:
        raise CheckpointMismatchError(
            f"checkpoint {where} was written by job {wrote.get('job')} of this sweep ({job['sweep_dir']}); job "
            f"{job['job']} must not resume it. The jobs of a sweep share an absolute checkpoint.dir: give a relative "
            f"one (each job then gets <job dir>/<checkpoint.dir>) or include the job in it, e.g. "
            f"checkpoint.dir=/ckpt/${{hydra:job.num}}")
    changes = config_changes(dict(meta.get("config") or {}), config, int(meta.get("step", 0)))
    if not changes:
        return
    if allow:
        log.warning("resuming %s with a changed config (checkpoint.allow_config_change=true): %s", where,
                    "; ".join(changes))
        return
    raise CheckpointConfigChangedError(
        f"checkpoint {where} was written by a run with another training config: {'; '.join(changes)}. Resume with "
        f"the checkpoint's values, point checkpoint.dir at a new directory, or set checkpoint.allow_config_change=true "
        f"to resume anyway")


# -- the manager ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Restored:
    """A restored checkpoint: ``step`` (completed optimizer steps), ``state``
    (``{"params", "opt_state"}`` placed by the restore target's shardings), ``meta`` (dict)."""

    step: int
    state: dict[str, Any]
    meta: dict[str, Any]


class Checkpoints:
    """Save and restore training state in one directory with an orbax ``CheckpointManager``.

    Args:
      directory: where step directories live (created if missing).
      keep: most recent checkpoints kept, ``>= 1``.
      async_save: write in a background thread (:meth:`save` returns after the device-to-host
        copy, so the caller may donate or overwrite its arrays at once).
      read_only: only read: nothing is created, deleted or moved (safe on the directory of a
        run that is still writing to it).

    Unless ``read_only``, leftover temporary directories of interrupted saves are deleted on
    construction: only the run that owns the directory may open it writable.

    A save that fails (a full disk, in the background or not) is never listed or restored: only
    finalized step directories are. Its error is raised, naming the step and the cause, by the
    first :meth:`check`, :meth:`wait`, :meth:`save` or :meth:`close` after it ended; its
    temporary files are deleted, older checkpoints are kept, and the step can be saved again.
    """

    def __init__(
        self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True, read_only: bool = False
    ):
        self.directory = pathlib.Path(directory).absolute()
        absl_log = logging.getLogger("absl")
        if absl_log.level == logging.NOTSET:
            # orbax reports every save phase at INFO through absl: dozens of lines per save in a
            # Hydra run (root logger at INFO). Keep its warnings; a user-set level is respected.
            absl_log.setLevel(logging.WARNING)
        self.read_only = bool(read_only)
        if not self.read_only:
            self.directory.mkdir(parents=True, exist_ok=True)
        self._keep = int(keep)
        self._async = bool(async_save)
        self._pending: int | None = None  # the step of the save in flight
        self._failed: tuple[int, BaseException] | None = None  # a failed save not yet raised
        if not self.read_only:
            self._remove_interrupted_saves()
        self._manager = self._open()

    def _remove_interrupted_saves(self) -> None:
        # orbax writes a step into `<step>.orbax-checkpoint-tmp*` and renames it when complete; a
        # leftover one is a save that a kill interrupted. orbax's own cleanup runs in the
        # background; doing it here, first, means no later listing can ever see one.
        if jax.process_index() != 0:
            return
        for p in sorted(self.directory.iterdir()):
            if TMP_SUFFIX in p.name:
                log.warning("removing %s: a save interrupted before it completed", p)
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def _open(self) -> ocp.CheckpointManager:
        if self.read_only:
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, enable_async_checkpointing=False)
        else:
            options = ocp.CheckpointManagerOptions(
                max_to_keep=self._keep,
                create=True,
                cleanup_tmp_directories=True,  # remnants of saves a SIGKILL interrupted
                enable_async_checkpointing=self._async,
            )
        return ocp.CheckpointManager(self.directory, item_names=("state", "meta"), options=options)

    # -- queries ----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Steps of the complete (finalized) checkpoints, ascending: never the save in flight nor
        a failed one (orbax lists a step as soon as its save starts). Does not raise a failed
        save's error (:meth:`check` does)."""
        self._collect(block=False)
        return sorted(s for s in self._manager.all_steps()
                      if s != self._pending and (self.directory / str(s)).is_dir())

    def latest_step(self) -> int | None:
        s = self.steps()
        return s[-1] if s else None

    # -- saving -----------------------------------------------------------------------------

    def save(self, step: int, params: Any, opt_state: Any, meta: Mapping[str, Any]) -> bool:
        """Start saving the state after ``step`` completed steps; returns False if that step is
        already saved. Waits for the previous save first (at most one is in flight).

        Raises:
          FloatingPointError: a parameter or optimizer-state tensor is not finite (the message
            lists them): a poisoned checkpoint is never written.
        """
        self.check(wait=True)  # at most one save in flight; a failed one is raised, naming its step
        if step in self.steps():
            return False
        bad = nonfinite_leaves({"params": params, "opt_state": opt_state})
        if bad:
            raise FloatingPointError(
                f"refusing to checkpoint step {step}: non-finite values in {', '.join(bad[:8])}"
                + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
                + "; the last good checkpoint is kept. Lower train.lr or check the data"
            )
        meta = dict(meta, step=int(step))
        self._pending = int(step)
        try:
            started = self._manager.save(
                int(step),
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                    meta=ocp.args.JsonSave(meta),
                ),
                force=True,
            )
        except Exception as e:  # noqa: BLE001 - a synchronous failure: the same path as a background one
            self._pending = None
            self._failed = (int(step), e)
            self._recover(int(step))
            self.check()
        if not self._async:
            self.check(wait=True)
        return bool(started)

    def check(self, wait: bool = False) -> None:
        """Raise the error of a save that failed, once (the next save starts clean).

        Args:
          wait: block until the save in flight ends; False: look only at a save that has ended.

        Raises:
          CheckpointSaveError: names the failed step, the cause and the checkpoints kept.
        """
        self._collect(block=wait)
        if self._failed is None:
            return
        step, e = self._failed
        self._failed = None
        cause = str(e).splitlines()[0] if str(e) else ""
        if len(cause) > 400:  # keep both ends: the failing file and the OS error ("No space left on device")
            cause = cause[:200] + " ... " + cause[-200:]
        raise CheckpointSaveError(
            f"checkpoint of step {step} in {self.directory} failed: {type(e).__name__}: {cause}. Nothing of it is "
            f"listed or restored; the checkpoints kept are steps {self.steps()}. Fix the cause (e.g. free disk space) "
            f"and save again: step {step} can be saved anew") from e

    def _collect(self, block: bool) -> None:
        """Finish the bookkeeping of the save in flight if it ended (or, ``block``, when it ends)."""
        if self._pending is None:
            return
        if not block and self._manager.is_saving_in_progress():
            return
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - whatever the writer raised is the cause to report
            self._failed = (step, e)
            self._recover(step)

    def _recover(self, step: int) -> None:
        """After a failed save of ``step``: delete its temporary files and reopen orbax (whose
        manager would otherwise keep listing the step and raise its error again)."""
        if jax.process_index() == 0:
            for p in self.directory.glob(f"{step}{TMP_SUFFIX}*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        try:
            self._manager.close()
        except Exception:  # noqa: BLE001, S110 - the error is the one already recorded
            pass
        self._manager = self._open()

    def wait(self) -> None:
        """Block until the save in flight (if any) is on disk.

        Raises:
          CheckpointSaveError: it (or an earlier one not yet raised) failed.
        """
        self.check(wait=True)

    def close(self) -> None:
        """Finish the save in flight and release orbax's threads.

        Raises:
          CheckpointSaveError: the last save failed (orbax's threads are released all the same).
        """
        try:
            self.check(wait=True)
        finally:
            self._manager.close()

    # -- restoring --------------------------------------------------------------------------

    def read_meta(self, step: int) -> dict[str, Any]:
        """The ``meta`` item of checkpoint ``step`` (JSON), without touching any array.

        Raises:
          Exception: whatever orbax raises for a missing or unreadable item.
        """
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        meta = out["meta"]
        if not isinstance(meta, dict) or "step" not in meta:
            raise ValueError(f"meta item has no 'step': {str(meta)[:200]}")
        return meta

    def restore(self, step: int, target: Mapping[str, Any]) -> Restored:
        """Read checkpoint ``step`` into ``target``'s shapes, dtypes and shardings.

        Args:
          step: a step from :meth:`steps`.
          target: ``{"params", "opt_state"}`` of ``jax.ShapeDtypeStruct`` with the shardings
            wanted now (:func:`abstract_train_state`); may be a different plan than the writer's.

        Raises:
          Exception: orbax's error for a missing, partial or corrupt checkpoint, or for shapes
            that do not match ``target``.
        """
        out = self._manager.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(dict(target)), meta=ocp.args.JsonRestore()),
        )
        return Restored(step=int(step), state=dict(out["state"]), meta=dict(out["meta"]))

    def restore_latest(
        self,
        target: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        *,
        check: Callable[[dict[str, Any], str], None] | None = None,
    ) -> Restored | None:
        """The newest checkpoint that reads back completely, or None if there is none.

        Newest first: an unreadable checkpoint (partial, corrupt, truncated files, bad JSON) is
        reported with ``logging.warning``, moved to ``<dir>/corrupt/`` (so that later saves of
        the same step and orbax's garbage collection are not confused by it), and the previous
        one is tried.

        Args:
          target: the restore target, or a function that builds it (called once, only if a
            checkpoint exists).
          check: called as ``check(meta, path)`` before any array is read; raise to refuse the
            checkpoint (e.g. :func:`check_compatible`). Its errors propagate: a refused
            checkpoint is not corrupt, and silently starting over would hide the mistake.

        Raises:
          NoUsableCheckpointError: checkpoints exist but none reads back.
          Whatever ``check`` raises.
        """
        steps = self.steps()
        if not steps:
            return None
        tgt = None
        failures = []
        for step in reversed(steps):
            where = str(self.directory / str(step))
            try:
                meta = self.read_meta(step)
            except Exception as e:  # noqa: BLE001 - any read failure means "unusable"
                failures.append(self._set_aside(step, e))
                continue
            if check is not None:
                check(meta, where)
            if tgt is None:
                tgt = target() if callable(target) else target
            try:
                restored = self.restore(step, tgt)
                _check_restored(restored.state, tgt)
            except Exception as e:  # noqa: BLE001
                failures.append(self._set_aside(step, e))
                continue
            if failures:
                log.warning("resuming from %s after skipping unreadable checkpoints: %s", where, "; ".join(failures))
            return restored
        raise NoUsableCheckpointError(
            f"no checkpoint in {self.directory} could be read ({'; '.join(failures)}); the unreadable ones were "
            f"moved to {self.directory / CORRUPT_DIR}. Start afresh with another checkpoint.dir, or repair them"
        )

    def _set_aside(self, step: int, error: BaseException) -> str:
        src = self.directory / str(step)
        msg = f"step {step}: {type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        if not self.read_only and jax.process_index() == 0 and src.exists():
            stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S%f")
            dst = self.directory / CORRUPT_DIR / f"step{step}-{stamp}"
            dst.parent.mkdir(exist_ok=True)
            shutil.move(str(src), str(dst))
            msg += f" (moved to {dst})"
        log.warning("checkpoint %s is unreadable and was skipped: %s", src, msg)
        # orbax caches the step list: re-read it so the set-aside step is forgotten
        self._manager.reload()
        return msg


def _check_restored(state: Mapping[str, Any], target: Mapping[str, Any]) -> None:
    """Orbax fills missing shards of a damaged array with zeros in some versions; refuse a
    restored tree whose structure, shapes or dtypes differ from the target's."""
    a, ta = jax.tree.flatten(state)
    b, tb = jax.tree.flatten(target)
    if ta != tb:
        raise ValueError(f"restored tree structure differs from the target: {ta} vs {tb}")
    for x, t in zip(a, b):
        if x.shape != t.shape or x.dtype != t.dtype:
            raise ValueError(f"restored array {x.shape} {x.dtype} differs from target {t.shape} {t.dtype}")


# -- metadata helpers -----------------------------------------------------------------------------


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A typed PRNG key as JSON: its implementation name and raw ``uint32`` key data."""
    data = np.asarray(jax.random.key_data(key))
    return {"impl": str(jax.random.key_impl(key)), "data": data.astype(np.uint32).tolist()}


def key_from_json(d: Mapping[str, Any]) -> jax.Array:
    """Inverse of :func:`key_to_json` (bit-exact)."""
    return jax.random.wrap_key_data(np.asarray(d["data"], dtype=np.uint32), impl=d["impl"])


def finite_or_none(x: float | None) -> float | None:
    """JSON cannot hold NaN/inf portably: store None instead."""
    return None if x is None or not math.isfinite(x) else float(x)


__all__ = [
    "CheckpointConfig",
    "CheckpointConfigChangedError",
    "check_resumable",
    "config_changes",
    "multirun_job",
    "resolve_dir",
    "CheckpointMismatchError",
    "CheckpointSaveError",
    "Checkpoints",
    "NoUsableCheckpointError",
    "Restored",
    "abstract_like",
    "abstract_train_state",
    "check_compatible",
    "is_arraylike",
    "checkpoint_config",
    "key_from_json",
    "key_to_json",
    "load_model",
    "train_state_target",
    "nonfinite_leaves",
]
