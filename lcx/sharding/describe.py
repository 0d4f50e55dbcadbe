"""``describe()``: how every array of a model is laid out under a plan, before anything compiles."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from lcx.sharding.plan import Plan, _as_axes


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """One kind of array: a name, whether it is a parameter or an activation, its logical axes,
    its global shape and its bytes per element."""

    name: str
    kind: str  # "param" | "activation"
    axes: tuple[str | None, ...]
    shape: tuple[int, ...]
    itemsize: int

    def __post_init__(self):
        if self.kind not in ("param", "activation"):
            raise ValueError(f"kind must be 'param' or 'activation', got {self.kind!r}")
        if len(self.axes) != len(self.shape):
            raise ValueError(f"{self.name}: {len(self.axes)} logical axes {self.axes} for shape {self.shape}")


@dataclasses.dataclass(frozen=True)
class ArrayLayout:
    info: ArrayInfo
    mesh_axes: tuple[tuple[str, ...], ...]
    shard_shape: tuple[int, ...]
    global_bytes: int
    bytes_per_device: int


def layout_arrays(plan: Plan, n_devices: int, arrays: Sequence[ArrayInfo]) -> list[ArrayLayout]:
    """Resolve each array's mesh axes and per-device shard under ``plan`` on ``n_devices``.

    Per-device bytes are ``prod(shard_shape) * itemsize`` with ``shard = ceil(dim / mesh size)``.

    Raises:
      PlanError: the plan's mesh does not fit ``n_devices`` or a spec is invalid.
    """
    shape = plan.mesh_shape(n_devices)
    out = []
    for a in arrays:
        spec = plan.param_spec(a.axes) if a.kind == "param" else plan.activation_spec(a.axes)
        mesh_axes = tuple(_as_axes(s) for s in spec) + ((),) * (len(a.shape) - len(spec))
        shard = tuple(math.ceil(d / math.prod(shape[m] for m in ma)) for d, ma in zip(a.shape, mesh_axes))
        out.append(ArrayLayout(a, mesh_axes, shard, math.prod(a.shape) * a.itemsize, math.prod(shard) * a.itemsize))
    return out


def describe(plan: Plan, n_devices: int, arrays: Sequence[ArrayInfo]) -> str:
    """A text table: mesh, then every parameter and activation kind with its logical axes, mesh
    axes, global shape, per-device shard shape and per-device bytes, and parameter totals."""
    rows = layout_arrays(plan, n_devices, arrays)
    mesh = " x ".join(f"{n}={s}" for n, s in plan.mesh_shape(n_devices).items())
    lines = [
        f"{plan!r}",
        f"mesh: {mesh} ({n_devices} devices); context-parallel degree {plan.context_degree(n_devices)}",
        "",
    ]
    hdr = ("kind", "array", "logical axes", "mesh axes", "global shape", "per-device shard", "bytes/device")
    body = []
    for r in rows:
        body.append(
            (
                r.info.kind,
                r.info.name,
                "(" + ", ".join(str(x) for x in r.info.axes) + ")",
                "(" + ", ".join("x".join(m) if m else "-" for m in r.mesh_axes) + ")",
                "x".join(map(str, r.info.shape)),
                "x".join(map(str, r.shard_shape)),
                _fmt_bytes(r.bytes_per_device),
            )
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(hdr, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    p_total = sum(r.global_bytes for r in rows if r.info.kind == "param")
    p_dev = sum(r.bytes_per_device for r in rows if r.info.kind == "param")
    lines += ["", f"parameters: {_fmt_bytes(p_total)} in total, {_fmt_bytes(p_dev)} per device"]
    return "\n".join(lines)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
