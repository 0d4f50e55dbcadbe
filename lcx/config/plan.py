"""The Hydra side of plans: the structured schema of the ``plan=`` group (:class:`PlanSchema`)
and a composed ``plan`` node checked against it and built (:func:`plan_from_config`).

A composed node is checked against :class:`PlanSchema`, so a misspelt key
(``plan.atention.strategy``) or a mistyped value is an error, not a silently ignored setting;
plain mappings (presets, checkpoints) are :func:`lcx.sharding.config.plan_from_dict`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lcx.sharding.config import plan_from_dict
from lcx.sharding.plan import AttentionConfig, Plan, PlanError


@dataclasses.dataclass
class AttentionSchema:
    # one strategy name, or a mapping layer kind -> name ({global: ring, sliding: halo}); Any, as
    # OmegaConf types no union of a string and a mapping (AttentionConfig checks the value)
    strategy: Any = "allgather"
    kernel: str | None = None  # None: the hardware preset's attention_kernel (xla if none)
    layout: str = "zigzag"
    ulysses_axis: str = "ulysses"
    ring_axis: str = "ring"
    allow_kv_replication: bool = True
    block_q: int | None = None  # None: the hardware preset's attention_block (512 if none)
    block_kv: int | None = None
    block_q_dkv: int | None = None  # None: the same as block_q (NOT the hardware default)
    block_kv_dkv: int | None = None  # None: the same as block_kv


@dataclasses.dataclass
class PlanSchema:
    """Schema of the Hydra ``plan`` node. ``params``/``activations`` map a logical axis to a mesh
    axis name, a list of mesh axis names, or null."""

    name: str = "custom"
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    activations: dict[str, Any] = dataclasses.field(default_factory=dict)
    attention: AttentionSchema = dataclasses.field(default_factory=AttentionSchema)


assert [f.name for f in dataclasses.fields(AttentionSchema)] == [f.name for f in dataclasses.fields(AttentionConfig)]


def register_schema() -> None:
    """Register :class:`PlanSchema` as ``plan/schema`` in Hydra's ConfigStore. Every preset in
    ``conf/plan/`` starts from it (``defaults: [schema, _self_]``), so at composition time
    every key exists (``plan.attention.block_q=256`` needs no ``+``) and a misspelt or mistyped
    key is an error. Called by :func:`lcx.config.register`, not on import."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="plan", name="schema", node=PlanSchema)


def plan_from_config(node: Any, *, default_block: int = 512, default_kernel: str = "xla") -> Plan:
    """Build a :class:`Plan` from a composed ``plan`` node (or a plain mapping), checked against
    :class:`PlanSchema`.

    ``plan.attention.block_q`` / ``block_kv`` left null take ``default_block`` tokens: the
    hardware preset's ``attention_block`` (1024 on TPU v5p, 2048 on TPU 7 as in MaxText's
    long-context recipes, 512 on CPU). ``plan.attention.kernel`` left null takes
    ``default_kernel``: the hardware preset's ``attention_kernel`` (``splash`` on TPUs, ``xla``
    on CPU), so ``plan=ring hardware=tpu7`` runs and prices the splash kernel; every entry point
    passes both from its hardware preset. ``plan.attention.block_q_dkv`` / ``block_kv_dkv`` (the
    backward pass's blocks) stay null when null: the backward then uses the forward's blocks.

    Raises:
      PlanError: a key not in :class:`PlanSchema` (misspelt), a value of the wrong type, or any
        check of :class:`Plan` itself.
    """
    if isinstance(node, DictConfig):
        # plain values: a composed node keeps PlanSchema as its type, and merging a typed node
        # would accept a key Hydra appended (``+plan.foo=1``) instead of refusing it; a
        # DictConfig converts to a dict (OmegaConf's return type covers every node kind)
        node = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))
    if "defaults" in node:  # a preset file read directly
        node = {k: v for k, v in node.items() if k != "defaults"}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PlanSchema), node)
    except OmegaConfBaseException as e:
        raise PlanError(f"invalid plan config: {e.msg if hasattr(e, 'msg') else e}".strip()) from None
    # merged into PlanSchema, so a dict with its keys (OmegaConf types the result loosely)
    d = cast(dict[str, Any], OmegaConf.to_container(merged, resolve=True))
    return plan_from_dict(d, default_block=default_block, default_kernel=default_kernel)


__all__ = ["AttentionSchema", "PlanSchema", "plan_from_config", "register_schema"]
