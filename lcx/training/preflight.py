"""Everything before the first compile: the run validated for a device count (:func:`resolve`:
the plan against the model, batch and sequence; the step's memory, :mod:`lcx.training.memory`),
bound to the devices (:func:`check`), and built (:func:`setup`: data, of which this process
reads the rows it holds (:func:`process_shard`), the model's structure, the optimizer and the
sharded steps) -- phase 1 of :func:`lcx.training.loop.train`. And
``train.dry_run=true`` (:func:`dry_run`), which validates a run for hardware this machine does
not have and prints the cost ledger's memory anatomy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import optax

from lcx.attention import check_layer_kinds
from lcx.cost import Hardware, hardware_from_config, training_flops
from lcx.cost.kinds import layer_groups
from lcx.data import Data, make_data
from lcx.data.tokenizers import check_model_vocab
from lcx.models import init_model, model_shardings
from lcx.sharding import MeshPlan, bind
from lcx.training.config import DistributedConfig, HardwareConfig, RunConfig
from lcx.training.memory import MemoryCheck, fit_step, memory_anatomy, memory_check
from lcx.training.optim import optimizer_from_config
from lcx.training.step import BATCH_AXES, Steps, is_arraylike, make_steps

log = logging.getLogger("lcx.training.loop")


def process_shard(sharding: jax.sharding.Sharding, shape: tuple[int, int]) -> tuple[int, int]:
    """``(index, count)``: the global batch's rows fall into ``count`` equal parts, each held by
    the devices of some processes, and this process holds part ``index``.

    Args:
      sharding: the batch's sharding.
      shape: the global batch's shape ``[B, S]``.

    Returns:
      ``(0, 1)`` on one process, or where every process holds every row; ``(p, n)`` where the
      rows split over ``n`` groups of processes (parts in order of their first row).

    Raises:
      ValueError: processes whose rows overlap without being equal, or differ in number (no
        sharding lcx builds does this).
    """
    rows: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        rows.setdefault(device.process_index, set()).update(range(shape[0])[index[0]])
    parts = sorted({frozenset(r) for r in rows.values()}, key=min)
    if len({len(p) for p in parts}) > 1 or len(set().union(*parts)) != sum(len(p) for p in parts):
        raise ValueError(
            f"the batch sharding {sharding} gives processes overlapping or unequal sets of rows; "
            f"each process must hold one of equal, disjoint parts of the {shape[0]} rows"
        )
    return parts.index(frozenset(rows[jax.process_index()])), len(parts)


def resolve(
    config: RunConfig, n_devices: int, *, local_devices: int | None = None, check_memory: bool | None = None
) -> MemoryCheck | None:
    """Validate ``config`` for ``n_devices`` devices from the configuration alone: the plan
    against the model, batch and sequence, then the step's memory (:func:`lcx.training.memory.fit_step`:
    the vocabulary tiles, and with ``train.check_memory`` the cost ledger's estimate). No device
    is touched and nothing compiles, so it serves a dry run for a slice this machine does not
    have (:func:`dry_run`) as well as :func:`check`.

    Args:
      config: the run.
      n_devices: JAX devices of the run (all processes together).
      local_devices: of those, the devices of this process (``hardware=cpu``: the simulated
        devices that share this host's RAM); None: all of them.
      check_memory: overrides ``train.check_memory`` (:func:`dry_run` prints the anatomy first,
        then checks).

    Returns:
      The memory estimate (None where it is not checked).

    Raises:
      PlanError / ValueError: an invalid plan, batch or sequence length, a layer kind of the
        model that the plan gives no strategy or whose strategy cannot run it
        (:func:`lcx.attention.check_layer_kinds`), or a step that does not fit, with a message
        that names the value and the fix.
    """
    t = config.train
    config.plan.validate(n_devices, dims=config.model.dims(), seq_len=t.seq_len, global_batch=t.global_batch)
    # each layer kind of the model against the strategy the plan gives it (none: refused)
    groups = layer_groups(config.model, window=config.model.sliding_window)
    check_layer_kinds((g.mask for g in groups), config.plan, n_devices, t.seq_len)
    return fit_step(
        config.model,
        config.plan,
        n_devices,
        train=t,
        memory=config.memory,
        hardware=config.hardware,
        local_devices=local_devices,
        check=t.check_memory if check_memory is None else check_memory,
    )


def check(config: RunConfig, devices=None) -> MeshPlan:
    """:func:`resolve` for ``devices`` (default: all of JAX's), then the plan bound to them.

    Raises:
      PlanError / ValueError: as :func:`resolve`.
    """
    devices = list(jax.devices() if devices is None else devices)
    me = jax.process_index()
    local = sum(1 for d in devices if getattr(d, "process_index", 0) == me) or len(devices)
    resolve(config, len(devices), local_devices=local)
    return bind(config.plan, devices)


@dataclasses.dataclass(frozen=True)
class Run:
    """What :func:`setup` builds once per run (phase 1 of :func:`lcx.training.loop.train`).

    Attributes:
      config: the run's configuration; mp: its plan bound to ``devices``.
      data: the training and validation batches.
      hw: the hardware preset priced for the devices (its peak FLOP/s gives the MFU); flops:
        the model's FLOPs per step (:func:`lcx.cost.training_flops`).
      key: the run's root PRNG key (``train.seed``).
      abstract_params, static: the model's structure (``ShapeDtypeStruct`` leaves) and its
        static part.
      optimizer, schedule: the optax transformation and its learning-rate schedule.
      steps: the sharded (uncompiled) train and evaluation steps.
    """

    config: RunConfig
    mp: MeshPlan
    devices: list[Any]
    data: Data
    hw: Hardware
    flops: Any
    key: jax.Array
    abstract_params: Any
    static: Any
    optimizer: optax.GradientTransformation
    schedule: Callable[[int], Any]
    steps: Steps


def setup(config: RunConfig, devices=None) -> Run:
    """Phase 1: validate (:func:`check`), then build the data, the model's abstract structure
    and shardings, the optimizer and the sharded steps. Nothing compiles.

    Raises:
      PlanError / ValueError: an invalid configuration, before anything compiles (a model
        vocabulary smaller than the tokenizer's: :func:`lcx.data.tokenizers.check_model_vocab`).
    """
    devices = list(jax.devices() if devices is None else devices)
    mp = check(config, devices)
    t, model_cfg, att = config.train, config.model, config.plan.attention
    data = make_data(
        config.data,
        seq_len=t.seq_len,
        global_batch=t.global_batch,
        layout=att.layout,
        context_degree=mp.context_degree,
        seed=t.seed,
        layout_block=max(att.block_q, att.block_kv),
        # this process's part of each batch's rows: where processes hold different rows, each reads
        # its own documents (lcx.data.corpus_source) and puts only its rows (put_batch)
        process_shard=process_shard(mp.activation_sharding(BATCH_AXES), (t.global_batch, t.seq_len)),
    )
    # lcx.config.run_config checked this already; a RunConfig built in code is checked here
    check_model_vocab(model_cfg.vocab_size, data.tokenizer, f"model={model_cfg.name}")
    key = jax.random.key(t.seed)
    built = build_steps(config, mp, key)
    return Run(
        config=config,
        mp=mp,
        devices=devices,
        data=data,
        hw=hardware_from_config(config.hardware, len(devices)),
        flops=training_flops(model_cfg, t.seq_len, t.global_batch, window=model_cfg.sliding_window),
        key=key,
        abstract_params=built.abstract_params,
        static=built.static,
        optimizer=built.optimizer,
        schedule=built.schedule,
        steps=built.steps,
    )


@dataclasses.dataclass(frozen=True)
class BuiltSteps:
    """The model's structure and the sharded steps of a run (:func:`build_steps`); nothing compiled.

    Attributes:
      abstract_params, static: the model's structure (``ShapeDtypeStruct`` leaves) and its static part.
      optimizer, schedule: the optax transformation and its learning-rate schedule.
      steps: the sharded (uncompiled) train and evaluation steps.
    """

    abstract_params: Any
    static: Any
    optimizer: optax.GradientTransformation
    schedule: Callable[[int], Any]
    steps: Steps


def build_steps(config: RunConfig, mp: MeshPlan, key: jax.Array) -> BuiltSteps:
    """The model's abstract structure (from ``key``), the optimizer and the train and evaluation
    steps under ``mp``: what :func:`setup` builds besides the data, and all that lowering the
    step needs (:mod:`lcx.training.lowering`)."""
    abstract = eqx.filter_eval_shape(init_model, config.model, key=key)
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    optimizer, schedule = optimizer_from_config(config.train)
    # where parameters and optimizer state live between steps: pinned_host when offloaded
    steps = make_steps(abstract, optimizer, mp, model_shardings(abstract, mp), config.memory)
    return BuiltSteps(abstract_params, static, optimizer, schedule, steps)


def dry_run_devices(hardware: HardwareConfig, distributed: DistributedConfig) -> tuple[int, int]:
    """``(devices of the run, devices of this process)`` from the configuration alone, for
    :func:`dry_run`: ``hardware.chips x hardware.devices_per_chip`` on an accelerator preset
    (128 for 64 TPU 7 chips), ``hardware.cpu_devices`` (x ``distributed.num_processes`` with a
    coordinator) on ``hardware=cpu``.

    Raises:
      ValueError: an accelerator preset without ``hardware.chips``; names the override.
    """
    per_chip = hardware.devices_per_chip
    if hardware.cpu_devices:
        k = hardware.cpu_devices
        procs = distributed.num_processes if distributed.coordinator_address else 1
        return k * procs, k
    if hardware.chips is None:
        raise ValueError(
            f"train.dry_run=true with hardware={hardware.name} needs the slice's size: set hardware.chips=<chips> "
            f"(each chip is hardware.devices_per_chip={per_chip} JAX device{'s' * (per_chip > 1)})"
        )
    n = hardware.chips * per_chip
    return n, n


@dataclasses.dataclass(frozen=True)
class DryRunReport:
    """What :func:`dry_run` found; ``dry_run.json`` holds its fields.

    Attributes:
      n_devices, local_devices: devices of the run, and of this process.
      plan: the plan as its ``plan`` config (:meth:`lcx.sharding.Plan.to_config`).
      policy: the :class:`lcx.cost.ActivationPolicy` priced, as a dict.
      memory_bytes_per_device: the ledger's breakdown (:meth:`lcx.cost.MemoryBreakdown.as_dict`).
      host_parts_bytes_per_device: ``parameters``, ``optimizer``, ``activations`` in host memory.
      limit_bytes, host_limit_bytes: what the check compared with (None: unknown).
      fits: the ledger's verdict (None: this machine's RAM cannot be read).
      memory_checked: ``train.check_memory``.
    """

    n_devices: int
    local_devices: int
    plan: dict[str, Any]
    policy: dict[str, Any]
    memory_bytes_per_device: dict[str, int]
    host_parts_bytes_per_device: dict[str, int]
    limit_bytes: float | None
    host_limit_bytes: float | None
    fits: bool | None
    memory_checked: bool


def dry_run(config: RunConfig, out_dir: str | pathlib.Path | None = None, *, file=None) -> DryRunReport:
    """``train.dry_run=true``: validate the run for the device count of its hardware preset and
    check its memory, without any device.

    Validates the run (:func:`resolve` on :func:`dry_run_devices`: the plan, model, batch,
    sequence and ``memory:`` options for ``hardware.chips x hardware.devices_per_chip``
    devices, or the simulated CPU devices), prints the cost
    ledger's memory anatomy of one step by component (GiB per device, on device or on host)
    and the check against the preset's HBM and host memory, and writes ``dry_run.json`` in
    ``out_dir``. Nothing is compiled and no JAX backend is used, so a TPU 7 slice's run can be
    checked on a CPU machine.

    Returns:
      The :class:`DryRunReport`.

    Raises:
      PlanError / ValueError: what :func:`check` refuses, with the same messages (the memory
        check's after the anatomy is printed).
    """
    out = file or sys.stdout
    n, k = dry_run_devices(config.hardware, config.distributed)
    # everything but the memory check, whose verdict follows the anatomy it judges
    resolve(config, n, local_devices=k, check_memory=False)
    plan, model_cfg, t, check = config.plan, config.model, config.train, config.train.check_memory
    chk = memory_check(
        model_cfg,
        plan,
        n,
        seq_len=t.seq_len,
        global_batch=t.global_batch,
        hardware=config.hardware,
        memory=config.memory,
        local_devices=k,
    )
    text, host_parts = memory_anatomy(chk, model_cfg, plan, t)
    print(text, file=out, flush=True)
    report = DryRunReport(
        n_devices=n,
        local_devices=k,
        plan=plan.to_config(),
        policy=dataclasses.asdict(chk.policy),
        memory_bytes_per_device=chk.breakdown.as_dict(),
        host_parts_bytes_per_device=host_parts,
        limit_bytes=chk.limit,
        host_limit_bytes=chk.host_limit,
        fits=chk.fits,
        memory_checked=check,
    )
    if out_dir is not None:
        p = pathlib.Path(out_dir)
        p.mkdir(parents=True, exist_ok=True)
        (p / "dry_run.json").write_text(json.dumps(dataclasses.asdict(report), indent=1, default=str))
    if check:
        resolve(config, n, local_devices=k)  # raises the memory check's one-line error
    verdict = (
        "memory not checked (train.check_memory=false)"
        if not check
        else "memory not checked: this machine's available RAM cannot be read"
        if chk.fits is None
        else "the cost ledger says the step fits"
    )
    print(
        f"dry run: OK: the plan is valid for {n} devices and {verdict}; nothing was compiled and no device was used",
        file=out,
        flush=True,
    )
    return report
