"""Typed schemas of every config section the entry points read, and the one check against them.

``plan`` has its own schema (:mod:`lcx.sharding.config`); ``model`` is checked by
:meth:`lcx.models.ModelConfig.from_dict`. Everything else an entry point reads is described here:
the top-level ``train``, ``checkpoint``, ``memory``, ``eval`` and ``distributed`` sections and the
``hardware`` and ``data`` groups (one schema per data config: stdlib, text and passkey have
different keys). :func:`register_schemas` (called by :func:`lcx.config.register`) stores each
dataclass in Hydra's ConfigStore as ``schema/<name>``.

The values live in exactly one place, the YAML files in ``conf/`` (with their comments): the
fields here are types only (``dataclasses.MISSING``) except for the few keys a YAML file leaves
out on purpose. :func:`check_section` refuses, before anything compiles:

- a key not in the schema, also one appended with ``+`` (``+train.stpes=1``), naming the nearest
  valid key (difflib) and listing the valid ones;
- a value of the wrong type (``train.steps=1.5``, ``checkpoint.async_save=no``), naming the key,
  the value and the fix; ``key=no``/``off`` arrive from Hydra as strings and are refused, never
  read as true;
- (``complete=True``) a key the schema has that the section lacks.

A misspelt key *without* ``+`` is already refused by Hydra (the composed config is a struct);
:func:`check_overrides` runs on the command line first so that message names the nearest key too.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Optional

REQUIRED = dataclasses.MISSING


def _req():
    return dataclasses.field()  # no default: the YAML file holds the value


@dataclasses.dataclass
class TrainSchema:
    """``train:`` of ``conf/config.yaml`` (values and their meaning are there)."""

    steps: int = _req()
    seq_len: int = _req()
    global_batch: int = _req()
    seed: int = _req()
    lr: float = _req()
    warmup_steps: Optional[int] = _req()
    min_lr_ratio: float = _req()
    weight_decay: float = _req()
    b1: float = _req()
    b2: float = _req()
    grad_clip: Optional[float] = _req()
    log_every: int = _req()
    eval_every: int = _req()
    eval_batches: int = _req()
    check_memory: bool = _req()
    dry_run: bool = _req()
    reuse_run_dir: bool = _req()
    # set by lcx.training.schedule for each stage of a length-extension schedule, never in YAML
    schedule_start: Optional[int] = None


@dataclasses.dataclass
class CheckpointSchema:
    """``checkpoint:`` of ``conf/config.yaml``."""

    dir: Optional[str] = _req()
    every: int = _req()
    keep: int = _req()
    async_save: bool = _req()
    allow_config_change: bool = _req()
    on_save_error: str = _req()


@dataclasses.dataclass
class EvalCheckpointSchema:
    """``checkpoint:`` of ``conf/eval_config.yaml`` (which checkpoint ``lcx.eval`` reads)."""

    dir: str = _req()
    step: Optional[int] = _req()


@dataclasses.dataclass
class MemorySchema:
    """``memory:`` of ``config.yaml`` (lcx.train) and ``plan_config.yaml`` (lcx.plan also prices
    the activation policies ``remat``, ``decoder_layer_input``, ``context``, ``qkv``; lcx.train
    refuses them, :class:`lcx.training.memory.MemoryOptions`)."""

    vocab_tiling: int = _req()
    offload_optimizer: bool = _req()
    offload_params: bool = _req()
    remat: Optional[str] = None
    decoder_layer_input: Optional[str] = None
    context: Optional[str] = None
    qkv: Optional[str] = None


@dataclasses.dataclass
class PlannerSchema:
    """``planner:`` of ``conf/plan_config.yaml``."""

    search: bool = _req()
    rows: str = _req()
    probe_cpu: bool = _req()


@dataclasses.dataclass
class EvalSchema:
    """``eval:`` of ``conf/eval_config.yaml``."""

    task: str = _req()
    lengths: Optional[list[int]] = _req()
    depths: list[float] = _req()
    per_depth: int = _req()
    global_batch: Optional[int] = _req()
    digits: Optional[int] = _req()
    seed: int = _req()


@dataclasses.dataclass
class DistributedSchema:
    """``distributed:`` of ``conf/config.yaml``."""

    auto: bool = _req()
    coordinator_address: Optional[str] = _req()
    num_processes: int = _req()
    process_id: int = _req()


@dataclasses.dataclass
class HardwareSchema:
    """Every preset of the ``hardware=`` group (``conf/hardware/*.yaml``)."""

    name: str = _req()
    chips: Optional[int] = _req()
    cpu_devices: Optional[int] = _req()
    devices_per_chip: int = _req()
    peak_flops_per_device: Optional[float] = _req()
    hbm_bytes: Optional[int] = _req()
    hbm_bandwidth_per_chip: Optional[float] = _req()
    ici_bandwidth_per_chip: Optional[float] = _req()
    ici_links_per_chip: int = _req()
    host_memory_per_chip: Optional[float] = _req()
    host_bandwidth_per_chip: Optional[float] = _req()
    libtpu_init_args: list[str] = _req()
    xla_flags: list[str] = _req()
    attention_block: int = _req()
    attention_kernel: str = _req()


@dataclasses.dataclass
class StdlibDataSchema:
    """``data=stdlib`` (``conf/data/stdlib.yaml``)."""

    name: str = _req()
    tokenizer: str = _req()
    val_fraction: float = _req()
    split_seed: int = _req()


@dataclasses.dataclass
class TextDataSchema:
    """``data=text`` (``conf/data/text.yaml``)."""

    name: str = _req()
    paths: list[str] = _req()
    text_field: str = _req()
    tokenizer: str = _req()
    val_fraction: float = _req()
    split_seed: int = _req()


@dataclasses.dataclass
class PasskeyDataSchema:
    """``data=passkey`` (``conf/data/passkey.yaml``)."""

    name: str = _req()
    tokenizer: str = _req()
    digits: int = _req()
    min_depth: float = _req()
    max_depth: float = _req()
    recall_loss: bool = _req()
    filler: str = _req()
    loss_on: str = _req()
    eval_depths: list[float] = _req()
    eval_per_depth: int = _req()
    split_seed: int = _req()


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


# -- the check ------------------------------------------------------------------------------------


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    if isinstance(node, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except InterpolationResolutionError:
            # ${hydra:...} outside a Hydra run (the compose API): such values stay unchecked
            return OmegaConf.to_container(node, resolve=False)
    return node


def nearest(key: str, valid: Sequence[str]) -> str | None:
    """The valid key most like ``key`` (difflib), or None when none is close."""
    m = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return m[0] if m else None


def unknown_key_message(section: str, key: str, valid: Sequence[str], tool: str = "lcx") -> str:
    near = nearest(key, valid)
    hint = f"did you mean {section}.{near}? " if near else ""
    return (
        f"{section}.{key}: unknown key; {hint}{tool} reads {', '.join(f'{section}.{k}' for k in sorted(valid))} "
        f"(a misspelt key is refused, never ignored)"
    )


def _check_value(key: str, value: Any, tp: Any) -> Any:
    """``value`` converted to ``tp`` (an int-valued float to int, an int to float), or ValueError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _check_value(key, value, args[0])
    if value is None:
        raise ValueError(f"{key}=null: must be set (a {getattr(tp, '__name__', tp)}); write {key}=<value>")
    if isinstance(value, str) and (value == "???" or value.startswith("${")):
        return value  # unset (the reader's own message names the fix), or an unresolved interpolation
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r}: must be true or false (a boolean); write {key}=true or {key}=false")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}={value!r}: must be a whole number")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}={value!r}: must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{key}={value!r}: must be a string")
        return value
    if origin is list:
        if isinstance(value, str):
            raise ValueError(f"{key}={value!r}: must be a list, e.g. {key}=[{value}]")
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}={value!r}: must be a list")
        (inner,) = typing.get_args(tp) or (Any,)
        return [_check_value(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    return value


def check_section(node: Any, schema: type, section: str, *, complete: bool = True, tool: str = "lcx") -> dict:
    """The config section ``node`` checked against ``schema``, as a plain dict of typed values.

    Args:
      node: the section (DictConfig or mapping); None counts as empty.
      schema: a dataclass of this module.
      section: its dotted name, for messages (``train``, ``data``).
      complete: every field of ``schema`` without a default must be present.
      tool: the entry point, for messages.

    Raises:
      ValueError: an unknown key (names the nearest valid one), a value of the wrong type, or
        (``complete``) a missing key.
    """
    d = _plain(node) or {}
    if not isinstance(d, Mapping):
        raise ValueError(f"{section}={d!r}: must be a mapping of {schema.__name__} keys")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    out = {}
    for k, v in d.items():
        if k not in fields:
            raise ValueError(unknown_key_message(section, str(k), list(fields), tool))
        out[k] = _check_value(f"{section}.{k}", v, hints[k])
    if complete:
        for k, f in fields.items():
            if k in out:
                continue
            if f.default is REQUIRED and f.default_factory is REQUIRED:
                raise ValueError(
                    f"{section}.{k} is missing: {tool} needs it (add {section}.{k}=<value>, or "
                    f"compose the config from conf/)"
                )
            out[k] = f.default
    return out


def data_schema(node: Any) -> type:
    """The schema of a ``data`` section, by its ``name``.

    Raises:
      ValueError: an unknown ``data.name`` (names the valid ones).
    """
    name = (_plain(node) or {}).get("name")
    if name not in DATA_SCHEMAS:
        raise ValueError(f"unknown data.name {name!r}; use data=stdlib, data=text or data=passkey")
    return DATA_SCHEMAS[name]


TRAIN_SECTIONS = ("train", "checkpoint", "distributed", "hardware")
"""What :func:`check_train_config` checks completely (``memory`` is
:meth:`lcx.training.memory.MemoryOptions.from_config`'s, ``data`` by its name, ``plan`` and
``model`` by their own readers)."""


def check_train_config(cfg: Any, tool: str = "lcx.train") -> dict[str, dict]:
    """Check the sections of an ``lcx.train`` config; return them as typed plain dicts.

    Raises:
      ValueError: as :func:`check_section`.
    """
    out = {s: check_section(cfg.get(s), SECTIONS[s], s, tool=tool) for s in TRAIN_SECTIONS}
    if cfg.get("memory") is not None:
        check_section(cfg.get("memory"), MemorySchema, "memory", complete=False, tool=tool)
    data = cfg.get("data")
    if data is not None:
        out["data"] = check_section(data, data_schema(data), "data", tool=tool)
    return out


# -- the command line -----------------------------------------------------------------------------

_CHECKED_PREFIXES = ("train", "checkpoint", "memory", "eval", "distributed", "hardware", "data", "planner")


def check_overrides(argv: Sequence[str], tool: str = "lcx") -> None:
    """Refuse a command-line override of an unknown key in a checked section, naming the nearest
    valid key, before Hydra composes anything (Hydra's own refusal does not name it). ``data.*``
    keys are checked against the keys of every data config together (the selected one is known
    only after composition, where :func:`check_section` checks it exactly).

    Raises:
      ValueError: the unknown key, the nearest valid one and the valid ones.
    """
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key = arg.split("=", 1)[0].lstrip("+~")
        parts = key.split(".")
        if len(parts) < 2 or parts[0] not in _CHECKED_PREFIXES or "@" in key or "/" in key:
            continue
        section, leaf = parts[0], parts[1]
        if section == "data":
            valid = sorted({f.name for s in DATA_SCHEMAS.values() for f in dataclasses.fields(s)})
        elif section == "checkpoint" and tool == "lcx.eval":
            valid = [f.name for f in dataclasses.fields(EvalCheckpointSchema)]
        else:
            valid = [f.name for f in dataclasses.fields(SECTIONS[section])]
        if leaf not in valid:
            raise ValueError(unknown_key_message(section, leaf, valid, tool))


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
    "check_overrides",
    "check_section",
    "check_train_config",
    "data_schema",
    "nearest",
    "register_schemas",
    "unknown_key_message",
]
