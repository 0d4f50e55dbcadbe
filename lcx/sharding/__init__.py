"""Sharding plans: logical axes, mesh axes, sequence layouts. The bottom of the import graph."""

from lcx.sharding import axes as axes
from lcx.sharding.layout import (
    LAYOUTS as LAYOUTS,
)
from lcx.sharding.layout import (
    apply_layout as apply_layout,
)
from lcx.sharding.layout import (
    causal_work_per_device as causal_work_per_device,
)
from lcx.sharding.layout import (
    check_layout as check_layout,
)
from lcx.sharding.layout import (
    inverse_permutation as inverse_permutation,
)
from lcx.sharding.layout import (
    layout_permutation as layout_permutation,
)
from lcx.sharding.layout import (
    undo_layout as undo_layout,
)
from lcx.sharding.mesh import MeshPlan as MeshPlan
from lcx.sharding.mesh import bind as bind
from lcx.sharding.mesh import build_mesh as build_mesh
from lcx.sharding.plan import (
    KERNELS as KERNELS,
)
from lcx.sharding.plan import (
    STRATEGIES as STRATEGIES,
)
from lcx.sharding.plan import (
    AttentionConfig as AttentionConfig,
)
from lcx.sharding.plan import (
    Plan as Plan,
)
from lcx.sharding.plan import (
    PlanError as PlanError,
)
