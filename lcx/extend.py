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

import lcx.conf  # noqa: F401  (registers the structured plan schema with Hydra)


def main() -> float | None:
    from lcx.train import check_command_line

    check_command_line("lcx.extend")
    return _hydra_main()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    from lcx.train import explain_errors

    return explain_errors(_main, cfg)


def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from lcx.conf.schema import check_train_config
    from lcx.cost import apply_hardware_flags
    from lcx.train import configure_devices

    check_train_config(cfg, tool="lcx.extend")

    apply_hardware_flags(cfg.hardware)  # XLA/libtpu flags must be set before the backend starts
    devices = configure_devices(cfg)
    from lcx.training.schedule import run_schedule

    stages = run_schedule(cfg, HydraConfig.get().runtime.output_dir, devices)
    for s in stages:
        what = "skipped (already in the checkpoint)" if s["skipped"] else f"final train loss {s['final_loss']:.4f}"
        print(f"stage {s['name']}: steps {s['first_step']}-{s['last_step']} at {s['seq_len']} tokens: {what}",
              file=sys.stderr)
    return stages[-1].get("val_loss")


if __name__ == "__main__":
    main()
