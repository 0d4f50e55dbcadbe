"""Hydra entry point: ``python -m lcx.extend experiment=length_extension [overrides]``.

Runs the progressive length-extension schedule ``schedule.stages`` (:mod:`lcx.training.schedule`):
each stage is a training run at its own sequence length, RoPE scaling, steps and learning rate
that resumes from the previous stage's checkpoint in ``checkpoint.dir``. Every stage's plan is
validated before the first one trains. Writes ``stage{i}_{name}/metrics.jsonl`` per stage and
``schedule.json`` in the Hydra run directory. Re-running the same command after an interruption
continues where it stopped.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lcx import cli


def extend(cfg: DictConfig) -> float | None:
    """Run every stage of ``schedule.stages``; the last stage's validation loss (None: none).

    Raises:
      ValueError / PlanError: a key unknown or mistyped, or a stage a real run refuses.
    """
    from lcx.config import schedule_config

    schedule = schedule_config(cfg)  # the base run and its stages, typed once
    devices = cli.start_devices(schedule.run.hardware, schedule.run.distributed)
    from lcx.reports.train import stage_lines
    from lcx.training.schedule import run_schedule

    results = run_schedule(schedule, cli.output_dir(), devices)
    for line in stage_lines(results):
        print(line, file=sys.stderr)
    return results[-1].val_loss


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> float | None:
    return cli.explain_errors(extend, cfg)


if __name__ == "__main__":
    cli.launch("lcx.extend", main)
