"""A 1-step training checkpoint of the tiny model, for the tests of the tools that read one
(``lcx.export``, ``lcx.generate``): Hydra's ``compose`` of an entry point's config, and the run."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import jax
from hydra import compose as hydra_compose
from hydra import initialize_config_module


def compose(name: str, overrides: Sequence[str]):
    """The composed ``conf/<name>.yaml`` with ``overrides`` (the structured configs registered by
    conftest)."""
    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return hydra_compose(config_name=name, overrides=list(overrides))


def train_tiny(root: pathlib.Path, devices, overrides: Sequence[str]) -> pathlib.Path:
    """Train ``model=tiny`` one step (128 tokens x 8 rows) with ``overrides``; its ``checkpoint.dir``."""
    from lcx.config import run_config
    from lcx.training.loop import train

    cfg = compose(
        "config",
        [
            "model=tiny",
            *overrides,
            "train.seq_len=128",
            "train.global_batch=8",
            "train.steps=1",
            "train.warmup_steps=0",
            "train.eval_every=0",
            f"checkpoint.dir={root / 'ckpt'}",
            "checkpoint.every=0",
        ],
    )
    with jax.numpy_dtype_promotion("standard"):
        train(run_config(cfg), root / "run", devices)
    return root / "ckpt"
