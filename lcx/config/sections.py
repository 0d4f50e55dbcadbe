"""Every typed section an entry point reads, by its name, and their registration with Hydra.

The classes live with the code that reads them (:mod:`lcx.training.config`,
:mod:`lcx.data.config`, :mod:`lcx.reports.config`): each is a frozen dataclass, one field per
key with its type, and it is the schema of its YAML section. :func:`register_schemas` (called by
:func:`lcx.config.register`) stores each in Hydra's ConfigStore as ``schema/<name>``;
:mod:`lcx.config.schema` checks a composed section against it.
"""

from __future__ import annotations

from lcx.data.config import DATA_CONFIGS
from lcx.reports.config import EvalCheckpointConfig, EvalConfig, GenerateOptions, PlannerConfig
from lcx.training.config import CheckpointConfig, DistributedConfig, HardwareConfig, MemoryOptions, TrainConfig

SECTIONS: dict[str, type] = {
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "memory": MemoryOptions,
    "eval": EvalConfig,
    "generate": GenerateOptions,
    "distributed": DistributedConfig,
    "hardware": HardwareConfig,
    "planner": PlannerConfig,
}
"""The typed class of each top-level section, by its name (``checkpoint`` as ``lcx.train`` reads
it; ``lcx.eval``'s is :class:`lcx.reports.config.EvalCheckpointConfig`)."""


def register_schemas() -> None:
    """Register every section's class in Hydra's ConfigStore as ``schema/<name>`` (and each data
    config as ``schema/data_<name>``, ``lcx.eval``'s checkpoint as ``schema/eval_checkpoint``)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, node in {
        **SECTIONS,
        "eval_checkpoint": EvalCheckpointConfig,
        **{f"data_{k}": v for k, v in DATA_CONFIGS.items()},
    }.items():
        cs.store(group="schema", name=name, node=node)


__all__ = ["DATA_CONFIGS", "SECTIONS", "register_schemas"]
