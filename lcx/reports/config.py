"""The typed configuration of ``lcx.plan`` (:class:`PlanQuery`) and ``lcx.eval``
(:class:`EvalQuery`), and the sections only they read.

The entry points build these values once from the composed Hydra config
(:func:`lcx.config.plan_query`, :func:`lcx.config.eval_query`); the section classes are also the
schema of their YAML sections (``planner:`` of ``conf/plan_config.yaml``; ``eval:`` and
``checkpoint:`` of ``conf/eval_config.yaml``). Types are ``typing.Optional``, not ``X | None``:
OmegaConf 2.3 reads only the former in structured configs.
"""

# ruff: noqa: UP045 - OmegaConf 2.3 reads typing.Optional in structured configs, not PEP 604's X | None
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional

from lcx.models.config import ModelConfig
from lcx.sharding.plan import Plan
from lcx.training.config import HardwareConfig, MemoryOptions


@dataclasses.dataclass(frozen=True)
class PlannerConfig:
    """``planner:`` of ``conf/plan_config.yaml`` (the meaning of each key is there).

    Attributes:
      search: also search every plan (False: only price the given one).
      rows: ``best`` (one row per strategy, mesh and parameter sharding) or ``all``.
      probe_cpu: ``hardware=cpu``: measure the host's peak instead of a placeholder.
      packed_documents: rows pack several documents (each layout's measured imbalance).
    """

    search: bool
    rows: str
    probe_cpu: bool
    packed_documents: bool

    def __post_init__(self):
        if self.rows not in ("best", "all"):
            raise ValueError(f"planner.rows={self.rows!r}: use best (the best policy per strategy and degree) or all")


@dataclasses.dataclass(frozen=True)
class Published:
    """``published:`` of an experiment: a published run's step time (seconds) and MFU (0-1)."""

    step_time_s: float
    mfu: float


@dataclasses.dataclass(frozen=True)
class PlanQuery:
    """What one ``python -m lcx.plan`` prices.

    Attributes:
      model: the model; plan: the given plan (unbound, resolved against the hardware preset).
      seq_len, global_batch: S tokens per sequence, B sequences per step (``train.*``).
      memory: the ``memory:`` options, with the activation policy to price (None: the model's).
      hardware: the preset; planner: the ``planner:`` section; published: a published run to
        compare with (None: none).
    """

    model: ModelConfig
    plan: Plan
    seq_len: int
    global_batch: int
    memory: MemoryOptions
    hardware: HardwareConfig
    planner: PlannerConfig
    published: Optional[Published] = None


EVAL_TASKS = ("passkey", "generation")
"""What ``eval.task`` may be: ``passkey`` (teacher-forced retrieval, :mod:`lcx.training.retrieval`)
or ``generation`` (tasks scored by generation, :mod:`lcx.evals`; ``eval=ruler|niah|perplexity``)."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """``eval:`` of ``conf/eval_config.yaml``: one of the ``conf/eval/*.yaml`` presets (the
    meaning of each key is there).

    Attributes:
      task: ``passkey`` or ``generation`` (:data:`EVAL_TASKS`); name: the preset's name, the
        stem of the files written (``ruler.csv``, ...).
      lengths: context lengths in tokens (None: half, once and twice the checkpoint's).
      depths: needle (key) depths, fractions of the haystack; per_depth: rows (samples) per
        (length, depth), per task.
      global_batch: rows per forward pass (None: the checkpoint's ``train.global_batch``).
      digits: pass key digits of ``passkey`` (None: the checkpoint's ``data.digits``, else 5);
        seed: the rows' (examples') seed.
      tasks: ``generation``: names in :data:`lcx.evals.TASKS` (may be empty with a curve).
      threshold: the effective length's score threshold, a percentage on RULER's 0-100 scale
        (RULER's 85.6); the effective length is the longest length whose score exceeds it.
      generator: ``module:function`` of the generation function (:class:`lcx.evals.GenerateFn`).
      perplexity_docs: held-out documents of the perplexity-by-position curve (0: no curve);
        perplexity_bins: its position bins.
      rope: ``model.rope_*`` fields set on the checkpoint's model before it is scored (a RoPE
        scaling applied with no fine-tuning, :func:`lcx.training.resume.load_model`); None: as trained.

    Raises:
      ValueError: an unknown ``task`` or generation task, no task and no curve, a threshold
        outside (1, 100] (a fraction such as 0.856 is named as one), a negative ``perplexity_docs`` or ``perplexity_bins < 1``.
    """

    task: str
    name: str
    lengths: Optional[list[int]]
    depths: list[float]
    per_depth: int
    global_batch: Optional[int]
    digits: Optional[int]
    seed: int
    tasks: list[str]
    threshold: float
    generator: str
    perplexity_docs: int
    perplexity_bins: int
    rope: Optional[dict[str, Any]] = None

    def __post_init__(self):
        from lcx.evals.scoring import check_threshold
        from lcx.evals.tasks import get_task
        from lcx.models.config import check_rope_overrides

        check_rope_overrides(self.rope, where="eval.rope")
        if self.task not in EVAL_TASKS:
            raise ValueError(
                f"eval.task={self.task!r} is unknown; lcx.eval has {', '.join(EVAL_TASKS)} "
                "(choose a preset: eval=passkey, eval=ruler, eval=niah or eval=perplexity)"
            )
        if self.task == "generation":
            for t in self.tasks:
                get_task(t)
            if not self.tasks and self.perplexity_docs == 0:
                raise ValueError(
                    "eval.tasks=[] and eval.perplexity_docs=0: nothing to evaluate; name tasks or documents"
                )
        check_threshold(self.threshold, "eval.threshold")
        if self.perplexity_docs < 0 or self.perplexity_bins < 1:
            raise ValueError(
                f"eval.perplexity_docs={self.perplexity_docs}, eval.perplexity_bins={self.perplexity_bins}: "
                "need documents >= 0 (0: no curve) and bins >= 1"
            )


@dataclasses.dataclass(frozen=True)
class EvalCheckpointConfig:
    """``checkpoint:`` of ``conf/eval_config.yaml``: which checkpoint ``lcx.eval`` reads.

    Attributes:
      dir: a training run's ``checkpoint.dir`` (absolute once the entry point resolved it).
      step: the checkpoint's step (None: the newest).
    """

    dir: pathlib.Path
    step: Optional[int]


@dataclasses.dataclass(frozen=True)
class EvalQuery:
    """What one ``python -m lcx.eval`` evaluates: ``eval``, ``checkpoint`` and ``hardware``."""

    eval: EvalConfig
    checkpoint: EvalCheckpointConfig
    hardware: HardwareConfig


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """``generate:`` of ``conf/generate_config.yaml`` (:func:`lcx.generate.generate`'s options).

    Attributes:
      prompts: the prompts as text, encoded with the checkpoint's tokenizer (``data.tokenizer``).
      max_new_tokens: tokens generated per prompt.
      temperature: 0: greedy; > 0: sampling. top_p: nucleus mass in (0, 1]. seed: the sampling key.
      stop_at_eos: stop a row at the tokenizer's EOS id (when it has one).
    """

    prompts: list[str]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop_at_eos: bool

    def __post_init__(self):
        if not self.prompts:
            raise ValueError("generate.prompts is empty: give at least one, e.g. generate.prompts='[\"def main\"]'")
        if self.max_new_tokens < 1:
            raise ValueError(f"generate.max_new_tokens={self.max_new_tokens}: must be >= 1 (tokens per prompt)")


@dataclasses.dataclass(frozen=True)
class GenerateQuery:
    """What one ``python -m lcx.generate`` runs: ``checkpoint`` (read), ``generate`` options, the
    ``plan`` to run on (None: the checkpoint's own) and ``hardware``."""

    checkpoint: EvalCheckpointConfig
    generate: GenerateOptions
    plan: Optional[Plan]
    hardware: HardwareConfig


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """``export:`` of ``conf/export_config.yaml`` (:func:`lcx.models.save_pretrained`'s options).

    Attributes:
      max_shard_bytes: largest safetensors file in bytes (a larger single tensor gets its own).
      dtype: ``float32`` / ``bfloat16`` to store the weights in; None: the parameters' dtype.
    """

    max_shard_bytes: int
    dtype: Optional[str]


@dataclasses.dataclass(frozen=True)
class ExportQuery:
    """What one ``python -m lcx.export`` writes: ``checkpoint`` (read), ``out`` (the directory
    written, absolute), ``export`` options and ``hardware``."""

    checkpoint: EvalCheckpointConfig
    out: pathlib.Path
    export: ExportOptions
    hardware: HardwareConfig


__all__ = [
    "EVAL_TASKS",
    "EvalCheckpointConfig",
    "EvalConfig",
    "EvalQuery",
    "ExportOptions",
    "ExportQuery",
    "GenerateOptions",
    "GenerateQuery",
    "PlanQuery",
    "PlannerConfig",
    "Published",
]
