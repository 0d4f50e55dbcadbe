"""Hydra configs. Importing this package registers the structured plan schema."""

from lcx.sharding import config as _plan_config  # noqa: F401  (registers plan/schema)
