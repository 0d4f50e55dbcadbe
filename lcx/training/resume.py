"""The state a run starts from: phase 2 of :func:`lcx.training.loop.train` (:func:`restore`:
the newest readable checkpoint's state, or a fresh one, as a :class:`Start`), the checks that
refuse a checkpoint another run or another model wrote, and reading a checkpoint's model back.

:mod:`lcx.training.checkpoint` saves and restores a :class:`~lcx.training.state.TrainState`;
this module builds the states: a fresh one (:func:`init_train_state`), the abstract restore
target (:func:`abstract_train_state`, also from a run's stored config:
:func:`train_state_target`, :func:`load_model`), and decides what it may restore into
(:func:`check_resumable`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import optax

from lcx.models.config import check_rope_overrides
from lcx.training.checkpoint import Checkpoints, Restored
from lcx.training.config import TrainConfig
from lcx.training.preflight import Run
from lcx.training.rundir import multirun_job
from lcx.training.state import TrainState
from lcx.training.step import is_arraylike, opt_state_shardings

log = logging.getLogger(__name__)


class CheckpointMismatchError(ValueError):
    """A checkpoint cannot serve this run: it was written for a different model configuration."""


def abstract_like(tree: Any, shardings: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves with the shapes and dtypes of ``tree`` and the given
    shardings: the restore target that makes orbax place each shard on the new plan's devices.

    Args:
      tree: pytree of arrays or ``ShapeDtypeStruct`` (e.g. from ``jax.eval_shape``).
      shardings: pytree of ``Sharding`` with the structure of ``tree``.
    """
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_train_state(
    abstract_params: Any, param_shardings: Any, optimizer: optax.GradientTransformation, opt_shardings: Any
) -> TrainState:
    """Restore target: a :class:`TrainState` of ``ShapeDtypeStruct`` for a model under a plan.

    Args:
      abstract_params: ``eqx.filter(abstract_model, is_arraylike)``: pytree of
        ``ShapeDtypeStruct`` (None where the model has no array).
      param_shardings: matching pytree of ``NamedSharding`` (:func:`lcx.models.model_shardings`).
      optimizer: the optax transformation whose state was saved.
      opt_shardings: the optimizer state's shardings: ``Steps.opt_shardings`` places it where the
        run keeps it (``pinned_host`` with ``memory.offload_optimizer``), or
        :func:`~lcx.training.step.opt_state_shardings` (each state like its parameter). A
        checkpoint written from either memory kind restores into either.
    """
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    return TrainState(
        params=abstract_like(abstract_params, param_shardings), opt_state=abstract_like(abstract_opt, opt_shardings)
    )


def init_train_state(
    model_cfg: Any,
    key: jax.Array,
    optimizer: optax.GradientTransformation,
    steps: Any,
    *,
    rng: jax.Array,
    data: dict[str, Any],
) -> TrainState:
    """A fresh :class:`TrainState` at step 0, every array created in its sharded layout.

    Args:
      model_cfg: :class:`lcx.models.ModelConfig`.
      key: the initialization key (``jax.random.key(train.seed)``).
      optimizer: the optax transformation.
      steps: :class:`lcx.training.step.Steps` (its ``param_shardings`` and ``opt_shardings``).
      rng: the training RNG stream's key.
      data: the data stream's starting position.
    """
    from lcx.models import init_model

    params = jax.jit(
        lambda k: eqx.filter(init_model(model_cfg, key=k), eqx.is_array), out_shardings=steps.param_shardings
    )(key)
    opt_state = init_opt_state(optimizer, params, steps.opt_shardings)
    return TrainState(params=params, opt_state=opt_state, step=0, rng=rng, data=data)


def pretrained_train_state(run: Run, *, rng: jax.Array, data: dict[str, Any]) -> TrainState:
    """A fresh :class:`TrainState` at step 0 whose parameters are the Hugging Face checkpoint
    ``run.config.pretrained`` (:func:`lcx.models.hf.load_weights`: each device reads its own
    slice), placed where the run keeps parameters."""
    from lcx.models.hf import load_weights

    assert run.config.pretrained is not None
    model = load_weights(run.config.pretrained, run.config.model, run.mp)
    params = jax.device_put(eqx.filter(model, eqx.is_array), run.steps.param_shardings)
    opt_state = init_opt_state(run.optimizer, params, run.steps.opt_shardings)
    return TrainState(params=params, opt_state=opt_state, step=0, rng=rng, data=data)


def init_opt_state(optimizer: optax.GradientTransformation, params: Any, opt_shardings: Any) -> Any:
    """Optimizer state created directly in its sharded layout (never materialised whole)."""
    return jax.jit(optimizer.init, out_shardings=opt_shardings)(params)


def train_state_target(config: Mapping[str, Any], mp: Any) -> tuple[TrainState, Any]:
    """Restore target for a run's resolved ``config`` (as stored in a checkpoint's ``meta``)
    under the bound plan ``mp`` (:class:`lcx.sharding.MeshPlan`), which may differ from the
    plan that wrote the checkpoint.

    Returns:
      ``(target, static)``: a :class:`TrainState` of ``ShapeDtypeStruct`` with ``mp``'s
      shardings, and the model's static part (``eqx.combine(params, static)`` is the model).
    """
    from lcx.models import ModelConfig, init_model, model_shardings
    from lcx.training.optim import optimizer_from_config

    model_cfg = ModelConfig.from_dict(dict(config["model"]))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    optimizer, _ = optimizer_from_config(TrainConfig(**{k: v for k, v in config["train"].items() if k in fields}))
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=jax.random.key(0))
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    shardings = model_shardings(abstract, mp)
    opt_shardings = opt_state_shardings(optimizer, abstract_params, shardings, mp.replicated())
    target = abstract_train_state(abstract_params, shardings, optimizer, opt_shardings)
    return target, static


def checkpoint_run(directory: str | os.PathLike, step: int | None = None) -> tuple[int, dict[str, Any]]:
    """``(step, config)``: the step (default the newest) and the resolved run config stored in
    the ``meta`` of a checkpoint, read without restoring anything.

    Raises:
      FileNotFoundError: no checkpoint in ``directory``.
    """
    c = Checkpoints(directory, read_only=True)
    try:
        steps = c.steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        step = step if step is not None else steps[-1]
        return step, c.read_meta(step)["config"]
    finally:
        c.close()


def load_model(
    directory: str | os.PathLike, mp: Any, step: int | None = None, rope: Mapping[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """The model of a checkpoint, placed on the bound plan ``mp`` (any plan, any device count).

    Args:
      directory: a ``checkpoint.dir``.
      mp: :class:`lcx.sharding.MeshPlan` to place the parameters by.
      step: checkpoint step; default the newest.
      rope: ``model.rope_*`` fields set on the stored model config before the model is built
        (a RoPE scaling applied with no fine-tuning; no parameter depends on them), e.g.
        ``{"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0, "rope_original_max_len": 256}``.

    Returns:
      ``(model, meta)``; ``meta["config"]["model"]`` holds the fields ``rope`` set.

    Raises:
      FileNotFoundError: no checkpoint in ``directory`` (or no such ``step``).
      ValueError: a ``rope`` key that is not a ``rope_*`` field of the model config, or a value the
        model config refuses.
    """
    check_rope_overrides(rope, where="rope")
    ckpts = Checkpoints(directory, read_only=True)
    try:
        steps = ckpts.steps()
        if not steps or (step is not None and step not in steps):
            raise FileNotFoundError(
                f"no checkpoint{'' if step is None else f' for step {step}'} in {directory}; steps there: {steps}"
            )
        step = steps[-1] if step is None else step
        config = ckpts.read_meta(step)["config"]
        if rope:
            config = {**config, "model": {**config["model"], **rope}}
        target, static = train_state_target(config, mp)
        r = ckpts.restore(step, target)
    finally:
        ckpts.close()
    meta = {**r.meta, "config": {**r.meta["config"], "model": config["model"]}} if rope else r.meta
    return eqx.combine(r.state.params, static), meta


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


TRAIN_KEYS_FREE = frozenset(
    {"log_every", "eval_every", "eval_batches", "long_eval_every", "check_memory", "dry_run", "reuse_run_dir"}
)
"""``train.*`` keys a resume may change: what is logged and checked, not what is trained."""
DATA_KEYS_FREE = frozenset({"workers", "prefetch"})
"""``data.*`` keys a resume may change: how the batches are built, not which (grain's state is
then replaced by the same position, :meth:`lcx.data.GrainBatches.restore`)."""
STAGE_KEYS = frozenset({"seq_len", "steps", "schedule_start", "lr", "warmup_steps", "global_batch"})
"""``train.*`` keys a length-extension stage sets (:func:`lcx.training.schedule.stage_config`)."""


class CheckpointConfigChangedError(CheckpointMismatchError):
    """The checkpoint was written by a run with another training config."""


def config_changes(saved: Mapping[str, Any], now: Mapping[str, Any], step: int) -> list[str]:
    """The training-relevant differences between a checkpoint's config and this run's.

    Compared: every ``train.*`` key but :data:`TRAIN_KEYS_FREE` (``train.steps`` may grow: an
    extension; it may shrink only to at most ``step``, where nothing is trained), and every
    ``data.*`` key but :data:`DATA_KEYS_FREE`. ``model.*`` is :func:`check_compatible`'s; ``plan``, ``hardware`` and
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
    out += [
        f"data.{k}: {sd[k]!r} -> {nd[k]!r}"
        for k in sorted(set(sd) & set(nd))
        if sd[k] != nd[k] and k not in DATA_KEYS_FREE
    ]
    return out


def check_resumable(
    meta: Mapping[str, Any], config: Mapping[str, Any], *, where: str, allow: bool, job: Mapping[str, Any] | None = None
) -> None:
    """Refuse to resume from a checkpoint that another run wrote.

    Args:
      meta: the checkpoint's ``meta`` item.
      config: this run's resolved config.
      where: the checkpoint's path, for messages.
      allow: ``checkpoint.allow_config_change``: changes are logged instead of refused.
      job: this process's :func:`lcx.training.rundir.multirun_job` (None: not a multirun).

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
            f"checkpoint.dir=/ckpt/${{hydra:job.num}}"
        )
    changes = config_changes(dict(meta.get("config") or {}), config, int(meta.get("step", 0)))
    if not changes:
        return
    if allow:
        log.warning(
            "resuming %s with a changed config (checkpoint.allow_config_change=true): %s", where, "; ".join(changes)
        )
        return
    raise CheckpointConfigChangedError(
        f"checkpoint {where} was written by a run with another training config: {'; '.join(changes)}. Resume with "
        f"the checkpoint's values, point checkpoint.dir at a new directory, or set checkpoint.allow_config_change=true "
        f"to resume anyway"
    )


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts: what :func:`restore` found (phase 2 of :func:`lcx.training.loop.train`).

    Attributes:
      state: the state to train from.
      ckpts: the open :class:`Checkpoints` (None: checkpointing off; the caller closes it).
      restored: what was restored (None: a fresh state).
      total: ``train.steps``.
    """

    state: TrainState
    ckpts: Checkpoints | None
    restored: Restored | None
    total: int

    @property
    def step(self) -> int:
        """Steps already done (0, or the restored step)."""
        return self.state.step

    @property
    def resumed(self) -> bool:
        """Whether the state comes from a checkpoint."""
        return self.restored is not None

    @property
    def done(self) -> bool:
        """Whether the checkpoint already reached ``train.steps``: no step is left to train."""
        return self.step >= self.total

    @property
    def val_loss(self) -> float | None:
        """The restored checkpoint's validation loss (None: fresh, or none recorded)."""
        return self.restored.meta.get("val_loss") if self.restored is not None else None


def restore(run: Run) -> Start:
    """Phase 2: with ``checkpoint.dir``, open the checkpoints there and restore the newest
    readable one's :class:`TrainState` (checked resumable, the data stream moved to its
    position); else, or where there is none, a fresh state at step 0.

    The training RNG stream is ``fold_in(key, 1)``. The step draws no randomness today (no
    dropout); the key is carried through checkpoints so that a stochastic step would resume
    exactly too.

    Returns:
      The :class:`Start`: the state to train from, the open :class:`Checkpoints` (None:
      checkpointing off; the caller closes it), what was restored (None: fresh).

    Raises:
      CheckpointMismatchError / CheckpointConfigChangedError: :func:`check_resumable`'s.
      NoUsableCheckpointError: checkpoints exist but none can be read.
    """
    c, steps, data, key = run.config.checkpoint, run.steps, run.data.train, run.key

    def resumable(meta: Mapping[str, Any], where: str) -> None:
        check_resumable(meta, run.config.resolved, where=where, allow=c.allow_config_change, job=multirun_job())

    def target() -> TrainState:
        return abstract_train_state(run.abstract_params, steps.param_shardings, run.optimizer, steps.opt_shardings)

    def fresh() -> TrainState:
        rng = jax.random.fold_in(key, 1)
        if run.config.pretrained is not None:
            return pretrained_train_state(run, rng=rng, data=data.state())
        return init_train_state(run.config.model, key, run.optimizer, steps, rng=rng, data=data.state())

    total = run.config.train.steps
    if c.dir is None:
        return Start(fresh(), None, None, total)
    ckpts = Checkpoints(c.dir, keep=c.keep, async_save=c.async_save)
    restored = ckpts.restore_latest(target, check=resumable)
    if restored is None:
        return Start(fresh(), ckpts, None, total)
    data.resume(restored.meta["data"])
    log.info("resumed from %s at step %d", ckpts.directory / str(restored.step), restored.step)
    return Start(restored.state.replace(data=data.state()), ckpts, restored, total)


__all__ = [
    "DATA_KEYS_FREE",
    "STAGE_KEYS",
    "TRAIN_KEYS_FREE",
    "Start",
    "CheckpointConfigChangedError",
    "CheckpointMismatchError",
    "abstract_like",
    "abstract_train_state",
    "check_compatible",
    "check_resumable",
    "config_changes",
    "init_opt_state",
    "pretrained_train_state",
    "init_train_state",
    "load_model",
    "restore",
    "train_state_target",
]
