"""Plans from plain values: :func:`plan_from_dict` (a ``plan`` mapping, as a preset file, a
checkpoint or :meth:`lcx.sharding.Plan.to_config` holds it) and the named presets of
``conf/plan/`` (:func:`preset`), the single source of their values.

The Hydra side (the ``plan=`` group's structured schema, and a composed ``plan`` node checked
against it) is :mod:`lcx.config.plan`; this module reads no Hydra or OmegaConf.
"""

from __future__ import annotations

import importlib.resources
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import yaml

from lcx.sharding.plan import AttentionConfig, Plan, PlanError

# the YAML tree is the data package lcx.conf (the top-level conf/ of a checkout, or the installed copy)
PRESET_DIR = pathlib.Path(str(importlib.resources.files("lcx.conf") / "plan"))

PLAN_KEYS = ("name", "mesh", "params", "activations", "attention")
"""The keys of a ``plan`` mapping."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats (``1e-5`` is a float, as Hydra reads it)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def read_yaml(text: str) -> Any:
    """A YAML document of ``conf/`` as plain values, numbers read as Hydra reads them."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def plan_from_dict(d: Mapping[str, Any], *, default_block: int = 512, default_kernel: str = "xla") -> Plan:
    """Build a :class:`Plan` from a plain ``plan`` mapping (a preset's ``defaults`` key ignored).

    ``attention.block_q`` / ``block_kv`` left null (or absent) take ``default_block`` tokens, and
    ``attention.kernel`` ``default_kernel``: the hardware preset's ``attention_block`` and
    ``attention_kernel`` where an entry point passes them (:func:`lcx.config.plan.plan_from_config`).
    ``block_q_dkv`` / ``block_kv_dkv`` stay null when null: the backward then uses the forward's
    blocks, whatever they resolved to.

    Raises:
      PlanError: a key that is not a plan's (names the valid ones), or any check of :class:`Plan`.
    """
    d = {k: v for k, v in d.items() if k != "defaults"}
    bad = sorted(set(d) - set(PLAN_KEYS))
    if bad:
        raise PlanError(f"invalid plan config: unknown key(s) {bad}; a plan has {', '.join(PLAN_KEYS)}")
    att = dict(d.get("attention") or {})
    known = set(AttentionConfig.__dataclass_fields__)
    bad = sorted(set(att) - known)
    if bad:
        raise PlanError(f"invalid plan config: unknown plan.attention key(s) {bad}; known: {sorted(known)}")
    for b in ("block_q", "block_kv"):
        if att.get(b) is None:
            att[b] = int(default_block)
    if att.get("kernel") is None:
        att["kernel"] = str(default_kernel)
    return Plan(
        mesh=tuple((d.get("mesh") or {}).items()),
        params=tuple((d.get("params") or {}).items()),
        activations=tuple((d.get("activations") or {}).items()),
        attention=AttentionConfig(**att),
        name=str(d.get("name", "custom")),
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
    node = read_yaml(path.read_text())
    if not isinstance(node, dict):
        raise PlanError(
            f"plan preset {path} holds {type(node).__name__}; a plan preset is a mapping (mesh, params, ...)"
        )
    p = plan_from_dict(node)
    return p.with_attention(**attention) if attention else p


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
