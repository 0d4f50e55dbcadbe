"""The typed schema of every config section the entry points read (checked by :mod:`lcx.config.schema`).

Each schema is a dataclass made from a table of key -> type (:func:`make_schema`): the values live in
exactly one place, the YAML files in ``conf/`` (with their comments), so a field has no default
except for the few keys a YAML file leaves out on purpose. Types are ``typing.Optional``, not
``X | None``: OmegaConf 2.3 reads only the former in structured configs.

:func:`register_schemas` (called by :func:`lcx.config.register`) stores each dataclass in Hydra's
ConfigStore as ``schema/<name>``.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads typing.Optional in structured configs, not PEP 604's X | None
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional


def make_schema(name: str, doc: str, /, defaults: Mapping[str, Any] | None = None, **types: Any) -> type:
    """A dataclass ``name`` with one field per keyword of ``types`` (key -> type), in order.

    Args:
      name: the class name.
      doc: its docstring (which YAML section it describes).
      defaults: the default of each key a YAML file may leave out; every other key has none.
      types: the keys and their types.

    Returns:
      The dataclass, whose module is this one.
    """
    defaults = defaults or {}
    fields = [(k, t, dataclasses.field(default=defaults[k])) if k in defaults else (k, t) for k, t in types.items()]
    cls = dataclasses.make_dataclass(name, fields)
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


# One line per group of keys, not one per key (the formatter would make them one per key): a
# schema is a table, and the YAML files hold each key's meaning.
# fmt: off
TrainSchema = make_schema(
    "TrainSchema", "``train:`` of ``conf/config.yaml`` (values and their meaning are there).",
    # schedule_start: set by lcx.training.schedule for each stage of a length-extension schedule, never in YAML
    {"schedule_start": None},
    steps=int, seq_len=int, global_batch=int, seed=int, lr=float, warmup_steps=Optional[int],
    min_lr_ratio=float, weight_decay=float, b1=float, b2=float, grad_clip=Optional[float],
    log_every=int, eval_every=int, eval_batches=int, check_memory=bool, dry_run=bool, reuse_run_dir=bool,
    tensorboard=bool, schedule_start=Optional[int],
)
CheckpointSchema = make_schema(
    "CheckpointSchema", "``checkpoint:`` of ``conf/config.yaml``.",
    dir=Optional[str], every=int, keep=int, async_save=bool, allow_config_change=bool, on_save_error=str,
)
EvalCheckpointSchema = make_schema(
    "EvalCheckpointSchema", "``checkpoint:`` of ``conf/eval_config.yaml`` (which checkpoint ``lcx.eval`` reads).",
    dir=str, step=Optional[int],
)
MemorySchema = make_schema(
    "MemorySchema",
    """``memory:`` of ``config.yaml`` (lcx.train) and ``plan_config.yaml`` (lcx.plan also prices
    the activation policies ``remat``, ``decoder_layer_input``, ``context``, ``qkv``; lcx.train
    refuses them, :class:`lcx.training.memory.MemoryOptions`).""",
    dict.fromkeys(("remat", "decoder_layer_input", "context", "qkv")),
    vocab_tiling=int, offload_optimizer=bool, offload_params=bool,
    remat=Optional[str], decoder_layer_input=Optional[str], context=Optional[str], qkv=Optional[str],
)
PlannerSchema = make_schema(
    "PlannerSchema", "``planner:`` of ``conf/plan_config.yaml``.",
    search=bool, rows=str, probe_cpu=bool, packed_documents=bool,
)
EvalSchema = make_schema(
    "EvalSchema", "``eval:`` of ``conf/eval_config.yaml``.",
    task=str, lengths=Optional[list[int]], depths=list[float], per_depth=int, global_batch=Optional[int],
    digits=Optional[int], seed=int,
)
DistributedSchema = make_schema(
    "DistributedSchema", "``distributed:`` of ``conf/config.yaml``.",
    auto=bool, coordinator_address=Optional[str], num_processes=int, process_id=int,
)
HardwareSchema = make_schema(
    "HardwareSchema", "Every preset of the ``hardware=`` group (``conf/hardware/*.yaml``).",
    # time_model: a preset without one is priced at the roofline
    {"time_model": None},
    name=str, chips=Optional[int], cpu_devices=Optional[int], devices_per_chip=int,
    peak_flops_per_device=Optional[float], hbm_bytes=Optional[int], hbm_bandwidth_per_chip=Optional[float],
    ici_bandwidth_per_chip=Optional[float], ici_links_per_chip=int, host_memory_per_chip=Optional[float],
    host_bandwidth_per_chip=Optional[float], torus_cube=Optional[int], topology=Optional[list[int]],
    libtpu_init_args=list[str], xla_flags=list[str],
    attention_block=int, attention_kernel=str,
    time_model=Optional[dict[str, Any]],  # lcx.cost.timing.time_model_from_config checks it
)
StdlibDataSchema = make_schema(
    "StdlibDataSchema", "``data=stdlib`` (``conf/data/stdlib.yaml``).",
    name=str, tokenizer=str, val_fraction=float, split_seed=int,
)
TextDataSchema = make_schema(
    "TextDataSchema", "``data=text`` (``conf/data/text.yaml``).",
    name=str, paths=list[str], text_field=str, tokenizer=str, val_fraction=float, split_seed=int,
)
PasskeyDataSchema = make_schema(
    "PasskeyDataSchema", "``data=passkey`` (``conf/data/passkey.yaml``).",
    name=str, tokenizer=str, digits=int, min_depth=float, max_depth=float, recall_loss=bool, filler=str,
    loss_on=str, eval_depths=list[float], eval_per_depth=int, split_seed=int,
)
# fmt: on

DATA_SCHEMAS: dict[str, type] = {"stdlib": StdlibDataSchema, "text": TextDataSchema, "passkey": PasskeyDataSchema}
"""The schema of each data config, by its ``data.name``."""

SECTIONS: dict[str, type] = {
    "train": TrainSchema,
    "checkpoint": CheckpointSchema,
    "memory": MemorySchema,
    "eval": EvalSchema,
    "distributed": DistributedSchema,
    "hardware": HardwareSchema,
    "planner": PlannerSchema,
}
"""The schema of each top-level section, by its name."""


def register_schemas() -> None:
    """Register every schema in Hydra's ConfigStore as ``schema/<name>``."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in {
        **SECTIONS,
        "eval_checkpoint": EvalCheckpointSchema,
        **{f"data_{k}": v for k, v in DATA_SCHEMAS.items()},
    }.items():
        cs.store(group="schema", name=name, node=node)


__all__ = [
    "CheckpointSchema",
    "DATA_SCHEMAS",
    "DistributedSchema",
    "EvalCheckpointSchema",
    "EvalSchema",
    "HardwareSchema",
    "MemorySchema",
    "PasskeyDataSchema",
    "PlannerSchema",
    "SECTIONS",
    "StdlibDataSchema",
    "TextDataSchema",
    "TrainSchema",
    "register_schemas",
    "make_schema",
]
