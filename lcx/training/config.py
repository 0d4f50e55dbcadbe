"""The typed configuration of a training run: :class:`RunConfig` and its sections.

An entry point (``lcx.train``, ``lcx.extend``) turns the composed Hydra config into one
:class:`RunConfig`, once (:func:`lcx.config.run_config`), and the training code reads only these
frozen values: each function takes the section it needs. The section classes here are also the
schema of their YAML sections (:func:`lcx.config.register` stores them in Hydra's ConfigStore;
:mod:`lcx.config.schema` refuses an unknown key or a wrong type against them): one definition
per key, with its type. The values live in ``conf/config.yaml`` and the ``hardware=`` presets,
so a field has a default only where a YAML file leaves the key out on purpose. Types are
``typing.Optional``, not ``X | None``: OmegaConf 2.3 reads only the former in structured configs.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads typing.Optional in structured configs, not PEP 604's X | None
from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Optional

from lcx.data.config import DataConfig
from lcx.models.config import ModelConfig
from lcx.sharding.plan import Plan


def _at_least_one(key: str, value: int, what: str) -> None:
    if value < 1:
        raise ValueError(f"{key}={value}: must be >= 1 ({what})")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """``train:`` of ``conf/config.yaml`` (the values and their meaning are there).

    Attributes:
      steps: optimizer steps, ``>= 1`` (a length-extension stage: the stage's end, cumulative).
      seq_len: S, tokens per sequence, ``>= 1``.
      global_batch: B, sequences per step (all devices together), ``>= 1``.
      seed: the training seed (parameters, data order, RNG stream).
      lr: peak learning rate; warmup_steps: linear warmup steps (None: :attr:`warmup`'s 10%).
      min_lr_ratio: the cosine's final rate as a fraction of ``lr``.
      weight_decay, b1, b2, grad_clip: AdamW's decay and moments, global-norm clipping.
      log_every, eval_every, eval_batches: steps between ``metrics.jsonl`` lines and between
        validation losses (0: never), validation batches per evaluation.
      check_memory, dry_run, reuse_run_dir, tensorboard: the switches of ``conf/config.yaml``.
      schedule_start: the first optimizer step of a length-extension stage
        (:mod:`lcx.training.schedule` sets it, never a YAML file); None: 0.
      long_eval_every: steps between scorings of a small set of long-context tasks at
        ``seq_len`` by generation (:class:`lcx.training.hooks.LongEvalHook`); 0 or None: never
        (None: a checkpoint written before the key existed).

    Raises:
      ValueError: ``steps``, ``seq_len`` or ``global_batch`` below 1.
    """

    steps: int
    seq_len: int
    global_batch: int
    seed: int
    lr: float
    warmup_steps: Optional[int]
    min_lr_ratio: float
    weight_decay: float
    b1: float
    b2: float
    grad_clip: Optional[float]
    log_every: int
    eval_every: int
    eval_batches: int
    check_memory: bool
    dry_run: bool
    reuse_run_dir: bool
    tensorboard: bool
    schedule_start: Optional[int] = None
    long_eval_every: Optional[int] = None

    def __post_init__(self):
        # whole numbers are checked at the edge (lcx.config.schema): train.seq_len=512.5 is an
        # error there, never 512 tokens
        _at_least_one("train.seq_len", self.seq_len, "tokens per sequence")
        _at_least_one("train.global_batch", self.global_batch, "sequences per step")
        _at_least_one("train.steps", self.steps, "optimizer steps")

    @property
    def start(self) -> int:
        """The first optimizer step of this run's learning-rate schedule (0 but in a stage)."""
        return self.schedule_start or 0

    @property
    def warmup(self) -> int:
        """Warmup steps: ``warmup_steps``, or 10% of this run's (stage's) steps, at least 1."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return max(1, (self.steps - self.start) // 10)

    @property
    def tokens_per_step(self) -> int:
        """S x B tokens of one optimizer step."""
        return self.seq_len * self.global_batch


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """``checkpoint:`` of ``conf/config.yaml``.

    Attributes:
      dir: the checkpoint directory (absolute once the entry point resolved it:
        :func:`lcx.training.rundir.resolve_dir`), or None (checkpointing off).
      every: steps between periodic saves; 0 saves only at the end and on SIGTERM/SIGINT.
      keep: number of most recent checkpoints kept (older ones are deleted), ``>= 1``.
      async_save: write in a background thread while training continues.
      allow_config_change: resume from a checkpoint whose training config differs
        (:func:`lcx.training.resume.config_changes`); off: such a resume is refused.
      on_save_error: ``stop``: a failed save stops training (:class:`CheckpointSaveError`);
        ``retry``: the loop logs it and saves the next step's state instead (a second failure in
        a row stops).

    Raises:
      ValueError: ``every < 0``, ``keep < 1`` or an unknown ``on_save_error``.
    """

    dir: Optional[pathlib.Path]
    every: int
    keep: int
    async_save: bool
    allow_config_change: bool
    on_save_error: str

    def __post_init__(self):
        if self.on_save_error not in ("stop", "retry"):
            raise ValueError(
                f"checkpoint.on_save_error={self.on_save_error!r}: use stop (a failed save stops "
                "training) or retry (save the next step instead, once)"
            )
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


NO_CHECKPOINTS = CheckpointConfig(
    dir=None, every=0, keep=1, async_save=False, allow_config_change=False, on_save_error="stop"
)
"""Checkpointing off (a config without a ``checkpoint:`` section)."""


PLAN_ONLY_KEYS = {
    "remat": "model.remat",
    "decoder_layer_input": "model.remat_layer_input",
    "context": "model.remat_context",
    "qkv": "model.remat_qkv",
}
"""``memory.*`` keys only ``lcx.plan`` reads (to price a policy the model does not run) and the
``model.*`` key ``lcx.train`` reads instead."""


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """``memory:`` of ``config.yaml`` (lcx.train) and ``plan_config.yaml``: what fits a step in
    device memory beyond remat (:mod:`lcx.training.memory`).

    Attributes:
      vocab_tiling: tiles N the local sequence of the output head and loss is split into (1: the
        logits ``[b, T, V]`` are computed whole; MaxText ``num_vocab_tiling``). N must divide the
        local sequence ``T`` (:func:`lcx.training.memory.check_tiling`).
      offload_optimizer: AdamW's moments in ``pinned_host`` memory between steps (MaxText
        ``optimizer_memory_host_offload``).
      offload_params: the float32 master parameters in ``pinned_host`` memory between steps
        (MaxText ``parameter_memory_host_offload``).
      remat, decoder_layer_input, context, qkv: an activation policy other than the model's own,
        which ``lcx.plan`` prices; ``lcx.train`` trains the model's own policy and refuses them
        (:meth:`check_trainable`, :data:`PLAN_ONLY_KEYS`). None: unset.

    Raises:
      ValueError: ``vocab_tiling`` not a whole number >= 1, an offload switch not a bool.
    """

    vocab_tiling: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    remat: Optional[str] = None
    decoder_layer_input: Optional[str] = None
    context: Optional[str] = None
    qkv: Optional[str] = None

    def __post_init__(self):
        n = self.vocab_tiling
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                f"memory.vocab_tiling={n!r}: must be a whole number >= 1 (tiles of the local sequence "
                "the output head and loss are computed in; 1: untiled)"
            )
        for name in ("offload_optimizer", "offload_params"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise ValueError(
                    f"memory.{name}={v!r}: must be true or false; write memory.{name}=true or memory.{name}=false"
                )

    def check_trainable(self) -> None:
        """Refuse the plan-only keys (:data:`PLAN_ONLY_KEYS`) where they are set: lcx.train trains
        the model's own activation policy and never ignores a key.

        Raises:
          ValueError: names the key, its value and the ``model.*`` key to set instead.
        """
        for k, instead in PLAN_ONLY_KEYS.items():
            v = getattr(self, k)
            if v is not None:
                raise ValueError(
                    f"memory.{k}={v!r} is read by lcx.plan only (to price a policy the model does "
                    f"not run); lcx.train trains the model's own: set {instead} instead"
                )

    @property
    def any_offload(self) -> bool:
        return self.offload_optimizer or self.offload_params


@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    """Every preset of the ``hardware=`` group (``conf/hardware/*.yaml``; the meaning of each key
    is there). :func:`lcx.cost.hardware_from_config` turns it into a priced
    :class:`lcx.cost.Hardware` for a device count.

    Attributes:
      name: ``cpu``, ``tpu_v5p``, ``tpu7``, ...; chips: chips in the slice (None: unset);
      cpu_devices: simulated CPU devices per process (``hardware=cpu``); devices_per_chip: JAX
        devices per chip; the bandwidths in bytes/s, memories in bytes, peak in FLOP/s per device.

    Raises:
      ValueError: ``chips``, ``cpu_devices`` or ``devices_per_chip`` below 1.
    """

    name: str
    chips: Optional[int]
    cpu_devices: Optional[int]
    devices_per_chip: int
    peak_flops_per_device: Optional[float]
    hbm_bytes: Optional[int]
    hbm_bandwidth_per_chip: Optional[float]
    ici_bandwidth_per_chip: Optional[float]
    ici_links_per_chip: int
    host_memory_per_chip: Optional[float]
    host_bandwidth_per_chip: Optional[float]
    torus_cube: Optional[int]
    topology: Optional[list[int]]
    libtpu_init_args: list[str]
    xla_flags: list[str]
    attention_block: int
    attention_kernel: str
    # a preset without one is priced at the roofline; lcx.cost.timing.time_model_from_config checks it
    time_model: Optional[dict[str, Any]] = None

    def __post_init__(self):
        _at_least_one("hardware.devices_per_chip", self.devices_per_chip, "JAX devices per chip")
        if self.chips is not None:
            _at_least_one("hardware.chips", self.chips, "chips in the slice")
        if self.cpu_devices is not None:
            _at_least_one("hardware.cpu_devices", self.cpu_devices, "simulated CPU devices per process")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """``distributed:`` of ``conf/config.yaml``: JAX's multi-process runtime
    (``jax.distributed.initialize``), read by the entry points before any device starts.

    Attributes:
      auto: initialise with no arguments (TPU pods, SLURM: JAX detects the cluster).
      coordinator_address: ``host:port`` of process 0; None: one process.
      num_processes, process_id: this job's processes, and this one's index.
    """

    auto: bool
    coordinator_address: Optional[str]
    num_processes: int
    process_id: int


SINGLE_PROCESS = DistributedConfig(auto=False, coordinator_address=None, num_processes=1, process_id=0)
"""One process (a config without a ``distributed:`` section)."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run's whole configuration, typed and checked (what ``lcx.train`` and each
    stage of ``lcx.extend`` train).

    Attributes:
      model: the model; plan: the sharding plan (unbound: no devices yet; its attention blocks
        and kernel resolved against the hardware preset); data: the data source's config;
      train, memory, checkpoint, hardware, distributed: the sections of the same names.
      plan_spec: the ``plan`` section as written (plain values; null blocks and kernel stand for
        the hardware's defaults): what a checkpoint stores, so that ``lcx.eval`` on other
        hardware resolves them for that hardware.
      pretrained: the Hugging Face checkpoint directory a fresh run's parameters are read from
        (``model=hf model.path=DIR``, :func:`lcx.models.hf.load_weights`); None: random
        initialisation. A resumed run restores its own checkpoint instead.
    """

    model: ModelConfig
    plan: Plan
    data: DataConfig
    train: TrainConfig
    memory: MemoryOptions
    checkpoint: CheckpointConfig
    hardware: HardwareConfig
    distributed: DistributedConfig
    plan_spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    pretrained: str | None = None

    @functools.cached_property
    def resolved(self) -> dict[str, Any]:
        """The run as plain values, computed once: what checkpoints and ``run_info.json`` store
        and a resume compares (:func:`lcx.training.resume.check_resumable`). One mapping per
        section, the ``plan`` as written (:attr:`plan_spec`; else :meth:`lcx.sharding.Plan.to_config`),
        paths as strings."""
        out: dict[str, Any] = {"model": self.model.to_dict(), "plan": self.plan_spec or self.plan.to_config()}
        for k in ("data", "train", "memory", "checkpoint", "hardware", "distributed"):
            section = dataclasses.asdict(getattr(self, k))
            out[k] = {a: str(v) if isinstance(v, pathlib.Path) else v for a, v in section.items()}
        if self.pretrained is not None:
            out["pretrained"] = self.pretrained
        return out

    def replace(self, **sections: Any) -> RunConfig:
        """This run with some sections replaced (a length-extension stage)."""
        return dataclasses.replace(self, **sections)


__all__ = [
    "NO_CHECKPOINTS",
    "SINGLE_PROCESS",
    "CheckpointConfig",
    "DistributedConfig",
    "HardwareConfig",
    "MemoryOptions",
    "PLAN_ONLY_KEYS",
    "RunConfig",
    "TrainConfig",
]
