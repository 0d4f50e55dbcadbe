"""Optimizer: AdamW with linear warmup + cosine decay and global-norm gradient clipping (optax)."""

from __future__ import annotations

from typing import TypedDict, Unpack

import optax

from lcx.models.params import decay_mask
from lcx.training.config import TrainConfig

Optimizer = tuple[optax.GradientTransformation, optax.Schedule]
"""An optax transformation and its learning-rate schedule (for logging the rate)."""


class OptimizerOptions(TypedDict, total=False):
    """:func:`make_optimizer`'s optional keywords (the ``train`` config's keys of those names).

    Keys:
      min_lr_ratio: the cosine's final rate as a fraction of ``lr`` (default 0.1).
      weight_decay: AdamW's decoupled weight decay (default 0.1).
      b1, b2, eps: Adam's moment decays and epsilon (defaults 0.9, 0.95, 1e-8).
      grad_clip: global-norm clipping threshold (default 1.0).
      schedule_start: the first optimizer step of this stage's schedule (default 0).
    """

    min_lr_ratio: float
    weight_decay: float
    b1: float
    b2: float
    eps: float
    grad_clip: float
    schedule_start: int


def make_optimizer(*, lr: float, steps: int, warmup_steps: int, **options: Unpack[OptimizerOptions]) -> Optimizer:
    """AdamW (Loshchilov & Hutter 2019) with linear warmup and cosine decay.

    The rate of optimizer step ``k = 1 .. n`` (``n = steps - schedule_start``, ``w = warmup_steps``)
    is ``lr * k / w`` for ``k <= w``, then the cosine ``end + (lr - end) (1 + cos(pi (k - w) /
    (n - w))) / 2`` down to ``end = lr * min_lr_ratio`` at step ``n`` (Loshchilov & Hutter 2017,
    arXiv:1608.03983): ``optax.warmup_cosine_decay_schedule`` read one count ahead, so the first
    step has rate ``lr / w``, not 0 (optax's schedule is 0 at count 0: a first step that moves
    nothing; gpt-neox #1373, torchtitan PR #1261), the peak comes at step ``w`` and the last step
    has exactly the final rate. With ``w = 0`` the cosine starts at step 1.

    Weight decay applies by parameter role (:func:`lcx.models.params.decay_mask`): weights and
    embeddings are decayed; norm gains, biases and attention sinks are not, whatever their rank.
    With ``schedule_start`` (a stage of a length-extension schedule, :mod:`lcx.training.schedule`)
    the warmup and cosine run over optimizer steps ``[schedule_start, steps)`` only: the
    schedule is shifted so that the stage's first step sees the start of its own warmup.

    Returns:
      ``(transformation, schedule)``: the schedule maps optax's step count (0 for the first
      update) to the rate that update uses.

    Raises:
      ValueError: ``steps <= schedule_start`` or ``warmup_steps`` not in
        ``[0, steps - schedule_start]``; at the first update, a parameter without a role.
    """
    schedule_start = options.get("schedule_start", 0)
    if not 0 <= schedule_start < steps:
        raise ValueError(f"train.steps={steps} must be >= 1 and > train.schedule_start={schedule_start} >= 0")
    span = steps - schedule_start
    if not 0 <= warmup_steps <= span:
        raise ValueError(f"train.warmup_steps={warmup_steps} must be in [0, {span}] (the steps of this run)")
    base = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=lr,
        warmup_steps=warmup_steps,
        decay_steps=max(span, warmup_steps + 1),
        end_value=lr * options.get("min_lr_ratio", 0.1),
    )
    # optax's count is 0 at the first update: step k = count + 1 - schedule_start reads base(k)
    schedule = lambda count: base(count + 1 - schedule_start)
    opt = optax.chain(
        optax.clip_by_global_norm(options.get("grad_clip", 1.0)),
        optax.adamw(
            schedule,
            b1=options.get("b1", 0.9),
            b2=options.get("b2", 0.95),
            eps=options.get("eps", 1e-8),
            weight_decay=options.get("weight_decay", 0.1),
            mask=decay_mask,
        ),
    )
    return opt, schedule


def optimizer_from_config(t: TrainConfig) -> Optimizer:
    """:func:`make_optimizer` from the ``train`` section: its rate, steps and AdamW settings;
    the warmup is :attr:`TrainConfig.warmup` (``warmup_steps: null``: 10% of the steps of this
    run, or of the stage's with ``schedule_start``)."""
    return make_optimizer(
        lr=t.lr,
        steps=t.steps,
        schedule_start=t.start,
        warmup_steps=t.warmup,
        min_lr_ratio=t.min_lr_ratio,
        weight_decay=t.weight_decay,
        b1=t.b1,
        b2=t.b2,
        grad_clip=float("inf") if t.grad_clip is None else t.grad_clip,  # null: no clipping
    )
