"""The last lines a training job prints: :func:`done_message` (``python -m lcx.train``) and
:func:`stage_lines` (``python -m lcx.extend``, one per stage of the schedule)."""

from __future__ import annotations

from lcx.training.schedule import StageResult
from lcx.training.state import TrainResult


def done_message(out: TrainResult, steps: int) -> str:
    """The last line of a run: the losses this run computed, or, when a resumed run found its
    checkpoint already at ``train.steps``, that there was nothing to train (no loss is printed
    that this run did not compute).

    Args:
      out: the result of :func:`lcx.training.loop.train` (``losses``, ``final_loss``,
        ``val_loss``, ``start_step``, ``run_dir``); losses in nats per token.
      steps: ``train.steps``.
    """
    if not out.losses:
        return (
            f"done: checkpoint at step {out.start_step} already reached train.steps={steps}; nothing to "
            f"train (raise train.steps to continue); run directory {out.run_dir}"
        )
    return (
        f"done: final train loss {out.final_loss:.4f} nats/token"
        + (f", validation loss {out.val_loss:.4f}" if out.val_loss is not None else "")
        + f"; run directory {out.run_dir}"
    )


def stage_lines(stages: list[StageResult]) -> list[str]:
    """One line per stage of a length-extension schedule (:func:`lcx.training.schedule.run_schedule`):
    its steps, sequence length (tokens) and final train loss (nats per token), or that it was
    skipped because the checkpoint already holds it."""
    lines = []
    for s in stages:
        what = "skipped (already in the checkpoint)" if s.skipped else f"final train loss {s.final_loss:.4f}"
        lines.append(f"stage {s.name}: steps {s.first_step}-{s.last_step} at {s.seq_len} tokens: {what}")
    return lines
