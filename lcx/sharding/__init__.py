"""Sharding plans: logical axes, mesh axes, sequence layouts. The bottom of the import graph."""

from lcx.sharding import axes
from lcx.sharding.layout import (
    LAYOUTS,
    apply_layout,
    causal_work_per_device,
    check_layout,
    inverse_permutation,
    layout_permutation,
    undo_layout,
)
from lcx.sharding.mesh import MeshPlan, bind, build_mesh
from lcx.sharding.plan import KERNELS, STRATEGIES, AttentionConfig, Plan, PlanError

__all__ = [
    "apply_layout",
    "AttentionConfig",
    "axes",
    "bind",
    "build_mesh",
    "causal_work_per_device",
    "check_layout",
    "inverse_permutation",
    "KERNELS",
    "layout_permutation",
    "LAYOUTS",
    "MeshPlan",
    "Plan",
    "PlanError",
    "STRATEGIES",
    "undo_layout",
]
