"""The composed Hydra config of each entry point read, checked and typed, once.

- :func:`run_config`: ``lcx.train`` (and ``lcx.extend``'s base run) -> :class:`RunConfig`;
- :func:`schedule_config`: ``lcx.extend`` -> :class:`lcx.training.schedule.Schedule` (the base
  run and its :func:`stages`);
- :func:`plan_query`: ``lcx.plan`` -> :class:`lcx.reports.config.PlanQuery`;
- :func:`eval_query`: ``lcx.eval`` -> :class:`lcx.reports.config.EvalQuery`;
- :func:`export_query`: ``lcx.export`` -> :class:`lcx.reports.config.ExportQuery`;
- :func:`generate_query`: ``lcx.generate`` -> :class:`lcx.reports.config.GenerateQuery`.

Every error is raised here, before any device starts or anything compiles, naming the key, the
value and the fix (:mod:`lcx.config.schema`).
"""

from __future__ import annotations

import pathlib
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lcx.config.plan import plan_from_config
from lcx.config.schema import check_section, typed
from lcx.data.config import DATA_CONFIGS, DataConfig
from lcx.data.tokenizers import (
    TOKENIZERS,
    ByteTokenizer,
    Tokenizer,
    check_model_vocab,
    data_tokenizer,
    get_tokenizer,
    padded_vocab_size,
)
from lcx.models import ModelConfig
from lcx.models.hf_config import hf_config
from lcx.reports.config import (
    EvalCheckpointConfig,
    EvalConfig,
    EvalQuery,
    ExportOptions,
    ExportQuery,
    GenerateOptions,
    GenerateQuery,
    PlannerConfig,
    PlanQuery,
    Published,
)
from lcx.sharding.plan import Plan
from lcx.training.config import (
    NO_CHECKPOINTS,
    SINGLE_PROCESS,
    CheckpointConfig,
    DistributedConfig,
    HardwareConfig,
    MemoryOptions,
    RunConfig,
    TrainConfig,
)
from lcx.training.rundir import launch_dir, resolve_dir
from lcx.training.schedule import Schedule, Stage, stages_from_list


def plain(node: Any) -> Any:
    """A config node as plain values (interpolations resolved); anything else unchanged."""
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def run_config(cfg: DictConfig, tool: str = "lcx.train") -> RunConfig:
    """The training run ``cfg`` configures, every section checked against its typed class.

    Raises:
      ValueError: a key unknown (names the nearest valid one) or mistyped, a value out of range,
        a ``memory.*`` key only ``lcx.plan`` reads; or the config is an analysis-only experiment
        (its top-level ``analysis_script`` names the script that reads it), which would
        otherwise train the default run.
      PlanError: an invalid ``plan`` (names the key).
    """
    script = cfg.get("analysis_script")
    if script is not None:
        raise ValueError(
            f"this experiment config trains nothing: it configures {script}, so {tool} would only "
            f"train the default run; run `python {script}` instead"
        )
    train = typed(cfg.get("train"), TrainConfig, "train", tool=tool)
    checkpoint = checkpoint_config(cfg.get("checkpoint"), tool)
    dist = cfg.get("distributed")  # none: one process
    distributed = SINGLE_PROCESS if dist is None else typed(dist, DistributedConfig, "distributed", tool=tool)
    hardware = typed(cfg.get("hardware"), HardwareConfig, "hardware", tool=tool)
    memory = typed(cfg.get("memory"), MemoryOptions, "memory", tool=tool)
    memory.check_trainable()
    data = data_config(cfg.get("data"), tool)
    return RunConfig(
        model=model_config(cfg.get("model"), data_tokenizer(data)),
        pretrained=pretrained_path(cfg.get("model")),
        plan=plan_config(cfg.get("plan"), hardware),
        plan_spec=plain(cfg.get("plan")) or {},
        data=data,
        train=train,
        memory=memory,
        checkpoint=checkpoint,
        hardware=hardware,
        distributed=distributed,
    )


def checkpoint_config(node: Any, tool: str = "lcx.train") -> CheckpointConfig:
    """``checkpoint:`` of an ``lcx.train`` config, its ``dir`` absolute
    (:func:`lcx.training.rundir.resolve_dir`: relative to the launch directory, or under a
    multirun to each job's own). None: checkpointing off.

    Raises:
      ValueError: an unknown, missing or mistyped key; ``every < 0`` or ``keep < 1``.
    """
    if node is None:
        return NO_CHECKPOINTS
    per_job = {"dir": lambda d: resolve_dir(d, per_job=True)}
    return typed(node, CheckpointConfig, "checkpoint", tool=tool, resolve=per_job)


def model_config(node: Any, tokenizer: Tokenizer | None = None) -> ModelConfig:
    """The ``model`` section as a :class:`ModelConfig`, its vocabulary checked against the
    tokenizer's: the one place a model's vocabulary is derived.

    ``model.vocab_size: null`` (``model=tiny``) is the tokenizer's largest id + 1 padded up to a
    multiple of 128 (:func:`lcx.data.tokenizers.padded_vocab_size`): byte 256 stays 256, the
    embedded BPE's 4,096 stays 4,096, 50,257 ids become 50,304. An explicit size (a preset such
    as ``model=llama3_1_8b``, or ``model.vocab_size=...``) is kept, and refused if it has fewer
    rows than the tokenizer's largest id + 1.

    Args:
      node: the ``model`` section.
      tokenizer: the run's (:func:`lcx.data.tokenizers.data_tokenizer`); None (``lcx.plan``,
        which composes no data): a null size is the byte tokenizer's 256, and nothing is checked.

    Raises:
      ValueError: not a mapping, what :meth:`ModelConfig.from_dict` refuses (names the key), or a
        vocabulary smaller than the tokenizer's (:func:`lcx.data.tokenizers.check_model_vocab`:
        names both numbers and the fix).
    """
    d = plain(node)
    if not isinstance(d, dict):
        raise ValueError(f"the model section must be a mapping of its fields, got {d!r}")
    d = {str(k): v for k, v in d.items()}
    path = pretrained_path(node)
    if path is not None:  # model=hf: config.json gives the architecture, the section's fields override it
        del d["path"]
        cfg = hf_config(path, **d)
        if tokenizer is not None:
            check_model_vocab(cfg.vocab_size, tokenizer, f"model.path={path}")
        return cfg
    if "vocab_size" in d and d["vocab_size"] is None:
        d["vocab_size"] = padded_vocab_size((tokenizer or ByteTokenizer()).vocab_size)
    cfg = ModelConfig.from_dict(d)
    if tokenizer is not None:
        check_model_vocab(cfg.vocab_size, tokenizer, f"model={cfg.name}")
    return cfg


def pretrained_path(node: Any) -> str | None:
    """``model.path`` (``model=hf``): the Hugging Face checkpoint directory the model is read from,
    made absolute (a relative path under the launch directory, else the current one, as
    ``data.tokenizer``); None for a model section without it.

    Raises:
      ValueError: ``model.path`` is missing (``???``), not a string, or not a directory with a
        ``config.json``.
    """
    if node is None or "path" not in (list(node.keys()) if OmegaConf.is_config(node) else node):
        return None  # (OmegaConf's `in` is False for a missing ??? value: ask the keys)
    if OmegaConf.is_config(node) and OmegaConf.is_missing(node, "path"):
        raise ValueError(
            "model=hf needs model.path=DIR, a Hugging Face checkpoint directory (config.json + safetensors)"
        )
    p = plain(node)["path"]
    if not isinstance(p, str) or not p:
        raise ValueError(f"model.path must be a checkpoint directory, got {p!r}")
    given = pathlib.Path(p).expanduser()
    # as data.tokenizer (tokenizer_path): under the launch directory, else as given
    tried = [given] if given.is_absolute() else [launch_dir() / given, given.absolute()]
    for d in tried:
        if (d / "config.json").is_file():
            return str(d)
    raise ValueError(
        f"model.path={p}: no config.json in {' or '.join(map(str, dict.fromkeys(tried)))}; give a Hugging Face "
        "checkpoint directory"
    )


def plan_config(node: Any, hardware: HardwareConfig) -> Plan:
    """The ``plan`` section as an (unbound) :class:`Plan`, its null attention blocks and kernel
    taken from the hardware preset (:func:`lcx.config.plan.plan_from_config`).

    Raises:
      PlanError: a key not in the plan's schema, a wrong type, or any check of the plan itself.
    """
    return plan_from_config(
        node if node is not None else {},
        default_block=hardware.attention_block,
        default_kernel=hardware.attention_kernel,
    )


def data_config(node: Any, tool: str = "lcx.train") -> DataConfig:
    """The ``data`` section as the typed config of the source it names (:mod:`lcx.data.config`).

    Raises:
      ValueError: no ``data`` section, an unknown ``data.name`` (names the valid ones), or a key
        unknown, mistyped or (``data.paths=???``) unset; a bad ``data.mixture`` entry.
    """
    d = plain(node)
    name = d.get("name") if isinstance(d, dict) else None
    if name not in DATA_CONFIGS:
        raise ValueError(f"unknown data.name {name!r}; use data={', data='.join(DATA_CONFIGS)}")
    if d.get("mixture") and d.get("paths") == "???":
        node = {**d, "paths": []}  # a mixture's sources name their own paths
    return typed(node, DATA_CONFIGS[name], "data", tool=tool, resolve={"tokenizer": tokenizer_path})


def tokenizer_path(name: str) -> str:
    """``data.tokenizer`` with a relative path that exists under the launch directory made
    absolute (:func:`lcx.training.rundir.launch_dir`); a registered name, an absolute path, or
    a name that exists nowhere (its error names it as given) unchanged."""
    if name in TOKENIZERS:
        return name
    p = pathlib.Path(name).expanduser()
    if not p.is_absolute() and (launch_dir() / p).exists():
        return str(launch_dir() / p)
    return name


def schedule_config(cfg: DictConfig, tool: str = "lcx.extend") -> Schedule:
    """What ``lcx.extend`` runs: the base run (:func:`run_config`) and its :func:`stages`.

    Raises:
      ValueError / PlanError: as :func:`run_config` and :func:`stages`.
    """
    return Schedule(run=run_config(cfg, tool=tool), stages=tuple(stages(cfg)))


def stages(cfg: DictConfig) -> list[Stage]:
    """The stages of ``lcx.extend``'s ``schedule.stages`` (:func:`lcx.training.schedule.stages_from_list`).

    Raises:
      ValueError: no stages, or a bad stage (names the stage and key).
    """
    node = cfg.get("schedule")
    if node is None or not node.get("stages"):
        raise ValueError(
            "no schedule: set schedule.stages (a list of {seq_len, steps, lr, model: {...}}), e.g. "
            "python -m lcx.extend experiment=length_extension"
        )
    return stages_from_list(plain(node["stages"]))


def plan_query(cfg: DictConfig, tool: str = "lcx.plan") -> PlanQuery:
    """What ``lcx.plan`` prices: the model, the given plan, ``train.seq_len`` and
    ``train.global_batch``, the ``memory:`` options, the hardware preset, ``planner:`` and an
    experiment's ``published`` step.

    ``train`` may hold more keys (an experiment sets those lcx.train reads): each must still be a
    real one, with the right type.

    Raises:
      ValueError / PlanError: a key unknown or mistyped, a count below 1, ``planner.rows`` not
        best/all, an invalid plan.
    """
    t = check_section(cfg.get("train"), TrainConfig, "train", complete=False, tool=tool)
    for key, what in (("seq_len", "tokens per sequence"), ("global_batch", "sequences per step")):
        if key not in t:
            raise ValueError(f"train.{key} is missing: {tool} needs it (add train.{key}=<value>)")
        if t[key] < 1:
            raise ValueError(f"train.{key}={t[key]}: must be >= 1 ({what})")
    hardware = typed(cfg.get("hardware"), HardwareConfig, "hardware", tool=tool)
    pub = plain(cfg.get("published"))
    data = plain(cfg.get("data"))  # an experiment may name one: its tokenizer sizes a null vocabulary
    tok = data.get("tokenizer") if isinstance(data, dict) else None
    return PlanQuery(
        model=model_config(cfg.get("model"), None if tok is None else get_tokenizer(tokenizer_path(tok))),
        plan=plan_config(cfg.get("plan"), hardware),
        seq_len=t["seq_len"],
        global_batch=t["global_batch"],
        memory=typed(cfg.get("memory"), MemoryOptions, "memory", tool=tool),
        hardware=hardware,
        planner=typed(cfg.get("planner"), PlannerConfig, "planner", tool=tool),
        published=None if pub is None else Published(float(pub["step_time_s"]), float(pub["mfu"])),
    )


def _checkpoint_to_read(cfg: DictConfig, tool: str, usage: str) -> EvalCheckpointConfig:
    """``checkpoint:`` of a tool that reads a training checkpoint (``dir`` absolute)."""
    node = cfg.get("checkpoint")
    if not node or not node.get("dir") or node.get("dir") == "???":
        raise ValueError(f"{tool} needs a checkpoint: {usage} (the checkpoint.dir of a python -m lcx.train run)")
    return typed(node, EvalCheckpointConfig, "checkpoint", tool=tool, resolve={"dir": resolve_dir})


def eval_query(cfg: DictConfig, tool: str = "lcx.eval") -> EvalQuery:
    """What ``lcx.eval`` evaluates: ``eval``, the checkpoint (``dir`` absolute) and ``hardware``.

    Raises:
      ValueError: no ``checkpoint.dir``, or a key unknown or mistyped.
    """
    return EvalQuery(
        eval=typed(cfg.get("eval"), EvalConfig, "eval", tool=tool),
        checkpoint=_checkpoint_to_read(cfg, tool, "python -m lcx.eval checkpoint.dir=DIR"),
        hardware=typed(cfg.get("hardware"), HardwareConfig, "hardware", tool=tool),
    )


def export_query(cfg: DictConfig, tool: str = "lcx.export") -> ExportQuery:
    """What ``lcx.export`` writes: the checkpoint read, ``out`` (absolute), ``export`` options
    and ``hardware``.

    Raises:
      ValueError: no ``checkpoint.dir`` or ``out``; ``export.max_shard_bytes`` below 1;
        ``export.dtype`` not float32 / bfloat16 / null; a key unknown or mistyped.
    """
    usage = "python -m lcx.export checkpoint.dir=DIR out=OUT"
    ckpt = _checkpoint_to_read(cfg, tool, usage)
    out = cfg.get("out")
    if out in (None, "", "???"):
        raise ValueError(f"{tool} needs out=<directory> for the Hugging Face checkpoint: {usage}")
    opts = typed(cfg.get("export"), ExportOptions, "export", tool=tool)
    if opts.max_shard_bytes < 1:
        raise ValueError(f"export.max_shard_bytes={opts.max_shard_bytes}: must be >= 1 (bytes per safetensors file)")
    if opts.dtype not in (None, "float32", "bfloat16"):
        raise ValueError(f"export.dtype={opts.dtype!r}: use float32, bfloat16 or null (the parameters' dtype)")
    return ExportQuery(
        checkpoint=ckpt,
        out=resolve_dir(str(out)) or pathlib.Path(str(out)),
        export=opts,
        hardware=typed(cfg.get("hardware"), HardwareConfig, "hardware", tool=tool),
    )


def generate_query(cfg: DictConfig, tool: str = "lcx.generate") -> GenerateQuery:
    """What ``lcx.generate`` runs: the checkpoint read, ``generate`` options, the ``plan=`` given
    on the command line (None: the checkpoint's) and ``hardware``.

    Raises:
      ValueError: no ``checkpoint.dir``; no prompts; ``generate.max_new_tokens < 1``; a key
        unknown or mistyped; a plan the plan checks refuse (:class:`lcx.sharding.PlanError`).
    """
    hardware = typed(cfg.get("hardware"), HardwareConfig, "hardware", tool=tool)
    node = cfg.get("plan")
    return GenerateQuery(
        checkpoint=_checkpoint_to_read(cfg, tool, "python -m lcx.generate checkpoint.dir=DIR generate.prompts=[...]"),
        generate=typed(cfg.get("generate"), GenerateOptions, "generate", tool=tool),
        plan=None if node is None else plan_config(node, hardware),
        hardware=hardware,
    )


__all__ = [
    "checkpoint_config",
    "data_config",
    "eval_query",
    "export_query",
    "generate_query",
    "plain",
    "plan_query",
    "run_config",
    "schedule_config",
    "stages",
    "tokenizer_path",
]
