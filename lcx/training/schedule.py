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
- Every stage's plan is validated (:func:`lcx.training.preflight.setup`: mesh vs devices, sequence
  length vs context degree and layout, heads vs Ulysses degree, batch) before the first stage
  trains, and again when the stage starts.
- Checkpoints accept RoPE changes across stages (:func:`lcx.training.resume.check_compatible`);
  any other model change is refused. The data stream continues in the same epoch at the same
  fraction of its tokens when the sequence length changes.
- Stages that the checkpoint already covers are skipped, so re-running the same command after
  an interruption continues where it stopped.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

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


def stages_from_config(node: Any) -> list[Stage]:
    """The stages of the ``schedule`` config node (``{"stages": [...]}``).

    Raises:
      ValueError: no stages, an unknown stage key, or a bad value (names the stage and key).
    """
    if node is None or not node.get("stages"):
        raise ValueError(
            "no schedule: set schedule.stages (a list of {seq_len, steps, lr, model: {...}}), e.g. "
            "python -m lcx.extend experiment=length_extension"
        )
    raw = node["stages"]
    raw = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else list(raw)
    out = []
    for i, st in enumerate(raw):
        unknown = sorted(set(st) - set(_STAGE_KEYS))
        if unknown:
            raise ValueError(f"schedule stage {i}: unknown keys {unknown}; known keys are {list(_STAGE_KEYS)}")
        out.append(
            Stage(
                name=str(st.get("name", f"{i}")),
                seq_len=int(st["seq_len"]),
                steps=int(st["steps"]),
                lr=float(st["lr"]),
                warmup_steps=None if st.get("warmup_steps") is None else int(st["warmup_steps"]),
                global_batch=None if st.get("global_batch") is None else int(st["global_batch"]),
                model=dict(st.get("model") or {}),
            )
        )
    return out


def stage_config(cfg: DictConfig, stages: Sequence[Stage], i: int) -> DictConfig:
    """The full training config of stage ``i``: ``cfg`` with the stage's train and model values.

    ``train.steps`` is the stage's end (cumulative) and ``train.schedule_start`` its start; the
    ``schedule`` node itself is dropped (a stage is an ordinary training run).
    """
    start = sum(s.steps for s in stages[:i])
    st = stages[i]
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.pop("schedule", None)
        c.train.seq_len = st.seq_len
        c.train.steps = start + st.steps
        c.train.schedule_start = start
        c.train.lr = st.lr
        c.train.warmup_steps = st.warmup_steps
        if st.global_batch is not None:
            c.train.global_batch = st.global_batch
        for k, v in st.model.items():
            c.model[k] = v
    return c


def run_schedule(cfg: DictConfig, run_dir: str | pathlib.Path, devices=None) -> list[dict[str, Any]]:
    """Run every stage of ``cfg.schedule`` in order (module docstring).

    Writes ``stage{i}_{name}/`` (each stage's ``metrics.jsonl`` and ``run_info.json``) and
    ``schedule.json`` (the stages, their step ranges and results) in ``run_dir``.

    Returns:
      One summary per stage: ``name``, ``first_step``, ``last_step``, ``seq_len``,
      ``final_loss``, ``val_loss``, ``skipped`` (already covered by the checkpoint), ``run_dir``.

    Raises:
      ValueError: no ``checkpoint.dir`` (stages hand over through it) or a bad schedule.
      PlanError / ValueError: some stage's plan, model, sequence length or optimizer schedule
        (e.g. a warmup longer than the stage) is invalid; raised before the first stage trains.
      Whatever :func:`lcx.training.loop.train` raises.
    """
    from lcx.training.checkpoint import Checkpoints
    from lcx.training.loop import setup, train
    from lcx.training.optim import optimizer_from_config
    from lcx.training.resume import checkpoint_config

    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    stages = stages_from_config(cfg.get("schedule"))
    ckpt = checkpoint_config(cfg.get("checkpoint"))
    if not ckpt.enabled:
        raise ValueError("a schedule needs checkpoint.dir: each stage resumes from the previous stage's checkpoint")
    configs = [stage_config(cfg, stages, i) for i in range(len(stages))]
    for i, c in enumerate(configs):  # fail fast: every stage's plan and optimizer before any training
        try:
            setup(c, devices)
            optimizer_from_config(c.train)
        except ValueError as e:
            hint = ""
            if "warmup_steps" in str(e):  # the stage's value, not train.warmup_steps, is the one to change
                hint = (
                    f"; set schedule.stages.{i}.warmup_steps to at most {stages[i].steps} (the stage's steps) or "
                    f"null (10% of them)"
                )
            raise type(e)(f"schedule stage {i} ({stages[i].name!r}, seq_len={stages[i].seq_len}): {e}{hint}") from None
    done = 0
    if ckpt.dir.exists():
        c = Checkpoints(ckpt.dir, read_only=True)
        try:
            done = c.latest_step() or 0
        finally:
            c.close()

    summaries = []
    for i, (st, c) in enumerate(zip(stages, configs, strict=True)):
        first, last = int(c.train.schedule_start) + 1, int(c.train.steps)
        sub = run_dir / f"stage{i}_{st.name}"
        summary = {
            "name": st.name,
            "first_step": first,
            "last_step": last,
            "seq_len": st.seq_len,
            "model": dict(st.model),
            "run_dir": str(sub),
            "skipped": done >= last,
        }
        if done >= last:
            log.info(
                "stage %d (%s): checkpoint at step %d already covers steps %d-%d; skipped",
                i,
                st.name,
                done,
                first,
                last,
            )
            summary.update(final_loss=None, val_loss=None)
        else:
            log.info(
                "stage %d (%s): steps %d-%d at seq_len %d, lr %g, model %s",
                i,
                st.name,
                first,
                last,
                st.seq_len,
                st.lr,
                dict(st.model),
            )
            out = train(c, sub, devices)
            summary.update(final_loss=out.final_loss, val_loss=out.val_loss, start_step=out.start_step)
            done = last
        summaries.append(summary)
        (run_dir / "schedule.json").write_text(json.dumps(summaries, indent=2, default=str))
    return summaries


__all__ = ["Stage", "run_schedule", "stage_config", "stages_from_config"]
