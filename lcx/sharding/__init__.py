"""Sharding plans: logical axes, mesh axes, sequence layouts. The bottom of the import graph."""

from lcx.sharding import axes as axes
from lcx.sharding.layout import (
    LAYOUTS as LAYOUTS,
    apply_layout as apply_layout,
    causal_work_per_device as causal_work_per_device,
    check_layout as check_layout,
    inverse_permutation as inverse_permutation,
    layout_permutation as layout_permutation,
    undo_layout as undo_layout,
)
from lcx.sharding.mesh import MeshPlan as MeshPlan, bind as bind, build_mesh as build_mesh
from lcx.sharding.plan import (
    KERNELS as KERNELS,
    STRATEGIES as STRATEGIES,
    AttentionConfig as AttentionConfig,
    Plan as Plan,
    PlanError as PlanError,
)
