"""Hydra entry point: ``python -m lcx.plan [overrides]`` — the cost ledger and plan search.

    python -m lcx.plan model=llama3_1_8b_longctx hardware=tpu7 train.seq_len=14000000 hardware.chips=64
    python -m lcx.plan experiment=longctx_4m_v5p

Prints the ledger of the given plan, the search table and the recommendation, and writes
``plan.json`` in the run directory (:func:`lcx.reports.plan.run`). Pure arithmetic on the CPU
backend: nothing compiles, so 14M tokens take seconds.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from lcx import cli
from lcx.reports.plan import run  # noqa: F401  (the report, also called directly by tests)


def plan(cfg: DictConfig) -> None:
    """Price the configured plan, search all plans, print the report and write ``plan.json``."""
    # the planner never needs an accelerator; jax read the environment when lcx imported it, so
    # the platform is pinned here (before the backend starts), not in the environment
    cli.pin_cpu()
    from lcx.config import plan_query

    run(plan_query(cfg), cli.output_dir())


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name="plan_config")
def main(cfg: DictConfig) -> None:
    cli.explain_errors(plan, cfg)


if __name__ == "__main__":
    cli.launch("lcx.plan", main)
