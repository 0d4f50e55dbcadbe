"""Hydra round trip for plans: the structured schema of the ``plan=`` group and preset loading.

The YAML files in ``conf/plan/`` are the single source of the named presets; code reads them
with :func:`preset` and YAML overrides are checked against :class:`PlanSchema`, so a misspelt key
(``plan.atention.strategy``) is an error, not a silently ignored setting.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
from typing import Any, Optional, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lcx.sharding.plan import AttentionConfig, Plan, PlanError

# the YAML tree is the data package lcx.conf (the top-level conf/ of a checkout, or the installed copy)
PRESET_DIR = pathlib.Path(str(importlib.resources.files("lcx.conf") / "plan"))


@dataclasses.dataclass
class AttentionSchema:
    strategy: str = "allgather"
    kernel: Optional[str] = None  # None: the hardware preset's attention_kernel (xla if none)
    layout: str = "zigzag"
    ulysses_axis: str = "ulysses"
    ring_axis: str = "ring"
    allow_kv_replication: bool = True
    block_q: Optional[int] = None  # None: the hardware preset's attention_block (512 if none)
    block_kv: Optional[int] = None
    block_q_dkv: Optional[int] = None  # None: the same as block_q (NOT the hardware default)
    block_kv_dkv: Optional[int] = None  # None: the same as block_kv


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


def plan_from_config(
    node: DictConfig | dict[str, Any], *, default_block: int = 512, default_kernel: str = "xla", hardware: Any = None
) -> Plan:
    """Build a :class:`Plan` from a Hydra/OmegaConf ``plan`` node or a plain dict.

    ``plan.attention.block_q`` / ``block_kv`` left null take ``default_block`` tokens: the
    hardware preset's ``attention_block`` (1024 on TPU v5p, 2048 on TPU 7 as in MaxText's
    long-context recipes, 512 on CPU). ``plan.attention.kernel`` left null takes
    ``default_kernel``: the hardware preset's ``attention_kernel`` (``splash`` on TPUs, ``xla``
    on CPU), so ``plan=ring hardware=tpu7`` runs and prices the splash kernel. Pass the
    ``hardware`` config node to take both defaults from it (what every entry point does).
    ``plan.attention.block_q_dkv`` / ``block_kv_dkv`` (the backward pass's blocks) stay null
    when null: the backward then uses the forward's blocks, whatever they resolved to.

    Raises:
      PlanError: a key not in :class:`PlanSchema` (misspelt), a value of the wrong type, or any
        check of :class:`Plan` itself.
    """
    if hardware is not None:
        default_block = int(hardware.get("attention_block") or default_block)
        default_kernel = str(hardware.get("attention_kernel") or default_kernel)
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
    for b in ("block_q", "block_kv"):
        if d["attention"][b] is None:
            d["attention"][b] = int(default_block)
    if d["attention"]["kernel"] is None:
        d["attention"]["kernel"] = str(default_kernel)
    return Plan(
        mesh=tuple(d["mesh"].items()),
        params=tuple(d["params"].items()),
        activations=tuple(d["activations"].items()),
        attention=AttentionConfig(**d["attention"]),
        name=d["name"],
    )


def preset(name: str, **attention: Any) -> Plan:
    """The named preset plan from ``conf/plan/<name>.yaml`` (dp, fsdp, allgather, a2a, ring,
    usp, fsdp_ring, ...), optionally with attention fields changed.

    Raises:
      PlanError: no preset of that name (the message lists the available ones).
    """
    path = PRESET_DIR / f"{name}.yaml"
    if not path.exists():
        raise PlanError(f"no plan preset {name!r}; available: {preset_names()}")
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        raise PlanError(f"plan preset {path} holds a YAML list; a plan preset is a mapping (mesh, params, ...)")
    p = plan_from_config(node)
    return p.with_attention(**attention) if attention else p


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
