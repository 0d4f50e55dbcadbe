"""Binding a :class:`~lcx.sharding.plan.Plan` to devices: the mesh and NamedShardings.

The mesh uses ``AxisType.Auto`` axes so that ``jax.shard_map`` reshards its inputs and XLA
propagates shardings through ``jit`` (``jax.make_mesh`` defaults to Explicit axes).
Multi-host runs call ``jax.distributed.initialize`` first; ``jax.devices()`` then lists every
process's devices and the same plan builds the same global mesh on each process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from lcx.sharding.plan import Plan


# jax.Device is a variable bound to a class of the untyped jaxlib extension (no stub)
def build_mesh(plan: Plan, devices: Sequence[jax.Device] | None = None) -> Mesh:  # pyright: ignore[reportInvalidTypeForm]
    """Device mesh for ``plan`` over ``devices`` (default: all of ``jax.devices()``).

    Raises:
      PlanError: the plan's mesh does not use exactly ``len(devices)`` devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = plan.mesh_shape(len(devices))
    names = tuple(shape)
    return jax.make_mesh(
        tuple(shape[n] for n in names), names, axis_types=(AxisType.Auto,) * len(names), devices=devices
    )


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """A plan bound to a mesh: resolves logical axes to ``NamedSharding`` and constrains arrays."""

    plan: Plan
    mesh: Mesh

    @property
    def n_devices(self) -> int:
        return self.mesh.size

    @property
    def context_degree(self) -> int:
        return self.plan.context_degree(self.mesh.size)

    def param_sharding(self, logical_axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(self.mesh, self.plan.param_spec(logical_axes))

    def activation_sharding(self, logical_axes: Sequence[str | None]) -> NamedSharding:
        return NamedSharding(self.mesh, self.plan.activation_spec(logical_axes))

    def constrain(self, x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
        """``with_sharding_constraint`` of an activation to the plan's rule for ``logical_axes``."""
        return jax.lax.with_sharding_constraint(x, self.activation_sharding(logical_axes))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())


def bind(plan: Plan, devices: Sequence[jax.Device] | None = None) -> MeshPlan:  # pyright: ignore[reportInvalidTypeForm]  # as build_mesh
    """Bind ``plan`` to ``devices`` (default all): ``MeshPlan(plan, build_mesh(plan, devices))``."""
    return MeshPlan(plan, build_mesh(plan, devices))
