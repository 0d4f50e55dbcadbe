"""Hydra entry point: ``python -m lcx.train [overrides]``.

Groups: ``model=`` (tiny | llama3_1_8b | llama3_70b | llama3_1_8b_longctx), ``plan=`` (dp | fsdp |
allgather | a2a | ring | usp | fsdp_ring), ``hardware=`` (cpu | tpu_v5p | tpu7), ``data=`` (stdlib |
stdlib_bpe | text | passkey), ``experiment=``. Writes ``metrics.jsonl`` and ``run_info.json`` in the Hydra run directory.

``train.dry_run=true`` validates the plan and checks memory for the hardware preset's device
count (``hardware.chips x hardware.devices_per_chip``), prints the memory anatomy, writes
``dry_run.json`` and exits without devices or compiling (:func:`lcx.training.preflight.dry_run`).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from lcx import cli


def train(cfg: DictConfig) -> float | None:
    """Train as configured in the Hydra run directory; the validation loss (None: none computed,
    or a dry run).

    A dry run is validated for ``hardware.chips x hardware.devices_per_chip`` devices and its
    memory checked against the preset without starting a backend or compiling, so
    ``python -m lcx.train experiment=longctx_14m_tpu7 train.dry_run=true`` checks a 128-device
    TPU 7 run on a CPU machine.

    Raises:
      ValueError / PlanError: a key unknown or mistyped, or what a real run refuses before compiling.
    """
    from lcx.config import run_config

    config = run_config(cfg)  # every key known and typed, once, before any device or compile
    if config.train.dry_run:
        cli.pin_cpu()  # never probe or start an accelerator for a dry run
        from lcx.training.preflight import dry_run

        dry_run(config, cli.output_dir())
        return None
    devices = cli.start_devices(config.hardware, config.distributed)
    # imported once the devices are configured: the training package imports jax's numerics
    from lcx.reports.train import done_message
    from lcx.training.loop import train as train_loop

    out = train_loop(config, cli.output_dir(), devices)
    print(done_message(out, config.train.steps), file=sys.stderr)
    return out.val_loss


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> float | None:
    return cli.explain_errors(train, cfg)


if __name__ == "__main__":
    cli.launch("lcx.train", main)
