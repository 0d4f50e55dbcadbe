"""Progressive length extension: train in stages of growing sequence length, each stage resuming
from the previous stage's checkpoint with its own RoPE scaling, steps and learning rate.

Llama 3 extended its context in six stages from 8K to 128K tokens (Grattafiori et al. 2024,
arXiv:2407.21783, section 3.4.2); YaRN (Peng et al. 2023, arXiv:2309.00071) and Code Llama's
larger RoPE base (Rozière et al. 2023, arXiv:2308.12950) are the usual RoPE changes between
stages. A schedule is the ``schedule.stages`` list of the config (see
``conf/experiment/length_extension.yaml``); ``python -m lcx.extend`` runs it.

Semantics:

- Stages run in order; stage ``i`` covers optimizer steps ``(end_{i-1}, end_i]`` where
  ``end_i`` is the sum of ``steps`` up to and including stage ``i``. All stages share
  ``checkpoint.dir``: stage ``i`` is an ordinary :func:`lcx.training.loop.train` call with
  ``train.steps = end_i`` that resumes from the newest checkpoint there (the end of stage
  ``i - 1``, or a mid-stage checkpoint after an interruption) and saves at its end.
- Per stage: ``seq_len`` (``train.seq_len``), ``steps``, ``lr`` (peak), optional
  ``warmup_steps`` (default 10% of the stage), optional ``global_batch``, and ``model``: model
  fields set on top of the base ``model`` config for that stage (not cumulative), typically the
  RoPE fields. The learning rate warms up and decays (cosine) over the stage's own steps
  (``train.schedule_start``); optimizer moments carry over.
- Every stage's plan is validated (:func:`lcx.training.preflight.check`: mesh vs devices, sequence
  length vs context degree and layout, heads vs Ulysses degree, batch) before the first stage
  trains, and again when the stage starts.
- Checkpoints accept RoPE changes across stages (:func:`lcx.training.resume.check_compatible`);
  any other model change is refused. The data stream continues in the same epoch at the same
  fraction of its tokens when the sequence length changes.
- Stages that the checkpoint already covers are skipped, so re-running the same command after
  an interruption continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from lcx.models.config import ModelConfig
from lcx.training.config import RunConfig

log = logging.getLogger(__name__)

_STAGE_KEYS = ("name", "seq_len", "steps", "lr", "warmup_steps", "global_batch", "model")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a length-extension schedule.

    Attributes:
      name: label (run sub-directory ``stage{i}_{name}``).
      seq_len: tokens per sequence in this stage.
      steps: optimizer steps in this stage, ``>= 1``.
      lr: peak learning rate of this stage's warmup + cosine schedule.
      warmup_steps: warmup steps of this stage; None: 10% of ``steps`` (at least 1).
      global_batch: sequences per step; None: ``train.global_batch``.
      model: ModelConfig fields set for this stage (e.g. ``rope_scaling_type``).
    """

    name: str
    seq_len: int
    steps: int
    lr: float
    warmup_steps: int | None = None
    global_batch: int | None = None
    model: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for f in ("seq_len", "steps"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"schedule stage {self.name!r}: {f} must be a positive integer, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"schedule stage {self.name!r}: lr must be positive, got {self.lr!r}")


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What ``python -m lcx.extend`` runs: the base run and its stages (:func:`stage_config`
    makes each stage's run from them).

    Attributes:
      run: the base run (``train.*`` and ``model.*`` as configured; each stage sets its own).
      stages: the stages, in order.
    """

    run: RunConfig
    stages: tuple[Stage, ...]


def stages_from_list(raw: Any) -> list[Stage]:
    """The stages of ``schedule.stages`` (plain values: a list of mappings).

    Raises:
      ValueError: no stages, stages that are not a list of mappings, an unknown stage key, or a
        bad value (names the stage and key).
    """
    if not raw:
        raise ValueError(
            "no schedule: set schedule.stages (a list of {seq_len, steps, lr, model: {...}}), e.g. "
            "python -m lcx.extend experiment=length_extension"
        )
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise ValueError(f"schedule.stages must be a list of stages ({{seq_len, steps, lr, ...}}), got {raw!r}")
    out = []
    for i, st in enumerate(raw):
        if not isinstance(st, Mapping):
            raise ValueError(f"schedule stage {i} must be a mapping ({{seq_len, steps, lr, ...}}), got {st!r}")
        unknown = sorted(set(st) - set(_STAGE_KEYS))
        if unknown:
            raise ValueError(f"schedule stage {i}: unknown keys {unknown}; known keys are {list(_STAGE_KEYS)}")
        out.append(
            Stage(
                name=str(st.get("name", f"{i}")),
                seq_len=int(st["seq_len"]),
                steps=int(st["steps"]),
                lr=float(st["lr"]),
                warmup_steps=_int_or_none(st.get("warmup_steps")),
                global_batch=_int_or_none(st.get("global_batch")),
                model=dict(st.get("model") or {}),
            )
        )
    return out


def _int_or_none(v: Any) -> int | None:
    return None if v is None else int(v)


def stage_config(run: RunConfig, stages: Sequence[Stage], i: int) -> RunConfig:
    """The training run of stage ``i``: ``run`` with the stage's train and model values.

    ``train.steps`` is the stage's end (cumulative) and ``train.schedule_start`` its start.

    Raises:
      ValueError: a stage's model field unknown or invalid (:meth:`ModelConfig.from_dict`).
    """
    start = sum(s.steps for s in stages[:i])
    st = stages[i]
    train = dataclasses.replace(
        run.train,
        seq_len=st.seq_len,
        steps=start + st.steps,
        schedule_start=start,
        lr=st.lr,
        warmup_steps=st.warmup_steps,
        global_batch=run.train.global_batch if st.global_batch is None else st.global_batch,
    )
    model = ModelConfig.from_dict({**run.model.to_dict(), **st.model}) if st.model else run.model
    return run.replace(train=train, model=model)


@dataclasses.dataclass(frozen=True)
class StageResult:
    """What :func:`run_schedule` reports of one stage (one entry of ``schedule.json``).

    Attributes:
      name: the stage's label.
      first_step, last_step: the optimizer steps the stage covers, 1-based and inclusive.
      seq_len: tokens per sequence.
      model: the model fields the stage set.
      run_dir: the stage's run directory (``stage{i}_{name}``).
      skipped: the checkpoint already covered the stage, so nothing was trained.
      final_loss, val_loss: the stage's last train and validation loss, nats/token (None when
        skipped, or no validation ran).
      start_step: steps already done when the stage's training began (None when skipped).
    """

    name: str
    first_step: int
    last_step: int
    seq_len: int
    model: dict[str, Any]
    run_dir: str
    skipped: bool
    final_loss: float | None = None
    val_loss: float | None = None
    start_step: int | None = None


def run_schedule(schedule: Schedule, run_dir: str | pathlib.Path, devices=None) -> list[StageResult]:
    """Run every stage of ``schedule`` in order, each a :func:`stage_config` of its base run
    (module docstring).

    Writes ``stage{i}_{name}/`` (each stage's ``metrics.jsonl`` and ``run_info.json``) and
    ``schedule.json`` (the :class:`StageResult` of every stage run or skipped so far) in ``run_dir``.

    Returns:
      One :class:`StageResult` per stage.

    Raises:
      ValueError: no ``checkpoint.dir`` (stages hand over through it).
      PlanError / ValueError: some stage's plan, model, sequence length or optimizer schedule
        (e.g. a warmup longer than the stage) is invalid; raised before the first stage trains.
      Whatever :func:`lcx.training.loop.train` raises.
    """
    from lcx.training.checkpoint import Checkpoints
    from lcx.training.loop import train

    run, stages = schedule.run, schedule.stages
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run.checkpoint
    if ckpt.dir is None:
        raise ValueError("a schedule needs checkpoint.dir: each stage resumes from the previous stage's checkpoint")
    configs = check_stages(run, stages, devices)
    done = 0
    if ckpt.dir.exists():
        c = Checkpoints(ckpt.dir, read_only=True)
        try:
            done = c.latest_step() or 0
        finally:
            c.close()

    results: list[StageResult] = []
    for i, (st, c) in enumerate(zip(stages, configs, strict=True)):
        first, last = c.train.start + 1, c.train.steps
        sub = run_dir / f"stage{i}_{st.name}"
        result = StageResult(st.name, first, last, st.seq_len, dict(st.model), str(sub), skipped=done >= last)
        what = f"stage {i} ({st.name})"
        if result.skipped:
            log.info("%s: checkpoint at step %d already covers steps %d-%d; skipped", what, done, first, last)
        else:
            log.info("%s: steps %d-%d at seq_len %d, lr %g, model %s", what, first, last, st.seq_len, st.lr, st.model)
            out = train(c, sub, devices)
            result = dataclasses.replace(
                result, final_loss=out.final_loss, val_loss=out.val_loss, start_step=out.start_step
            )
            done = last
        results.append(result)
        summaries = [dataclasses.asdict(r) for r in results]
        (run_dir / "schedule.json").write_text(json.dumps(summaries, indent=2, default=str))
    return results


def check_stages(run: RunConfig, stages: Sequence[Stage], devices=None) -> list[RunConfig]:
    """Fail fast: every stage's warmup, model, plan and optimizer, before any stage trains.

    Returns:
      The :func:`stage_config` of each stage.

    Raises:
      PlanError / ValueError: what :func:`stage_config`, :func:`lcx.training.preflight.check` or
        the optimizer refuses, prefixed with the stage (index, name, sequence length); a warmup
        outside ``[0, steps]`` names the stage's own ``schedule.stages.<i>.warmup_steps``.
    """
    from lcx.training.optim import optimizer_from_config
    from lcx.training.preflight import check

    configs = []
    for i, st in enumerate(stages):
        where = f"schedule stage {i} ({st.name!r}, seq_len={st.seq_len})"
        if st.warmup_steps is not None and not 0 <= st.warmup_steps <= st.steps:
            # the stage's value, not train.warmup_steps, is the one to change
            raise ValueError(
                f"{where}: warmup_steps={st.warmup_steps} must be in [0, {st.steps}] (the stage's steps); "
                f"set schedule.stages.{i}.warmup_steps to at most {st.steps} or null (10% of them)"
            )
        try:
            c = stage_config(run, stages, i)
            check(c, devices)
            optimizer_from_config(c.train)
        except ValueError as e:
            raise type(e)(f"{where}: {e}") from None
        configs.append(c)
    return configs


__all__ = ["Schedule", "Stage", "StageResult", "check_stages", "run_schedule", "stage_config", "stages_from_list"]
