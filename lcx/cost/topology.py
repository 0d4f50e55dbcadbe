"""The ICI torus of a TPU slice, and whether a device group is a whole sub-torus of it.

TPU v5p and TPU7 slices of 64 chips and more are 3D tori built from 4 x 4 x 4 cubes, each
dimension a multiple of 4 with wraparound links (cloud.google.com/tpu/docs/v5p and
cloud.google.com/tpu/docs/tpu7x, "topologies": v5p-128 is 4x4x4, v5p-256 4x4x8, v5p-512 4x8x8,
v5p-1024 8x8x8); TPU7's two TensorCores per chip add a fourth, on-chip axis of 2.

``jax.experimental.mesh_utils.create_device_mesh`` gives each mesh axis a subset of whole
physical axes whose sizes multiply to the axis size; an axis of any other size must *split* a
physical axis, which, in its words, "would reduce total usable bandwidth" (XLA's TPU collectives
are built for whole torus axes). A group of 8 devices on a 4x4x4 slice is such a group: half of
one torus ring times another ring.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def slice_topology(chips: int, cube: int) -> tuple[int, int, int] | None:
    """The standard 3D torus shape of a slice of ``chips`` chips: the most cubic ``a <= b <= c``
    with each a multiple of ``cube`` and ``a b c = chips`` (None: ``chips`` is not a whole number
    of ``cube**3`` cubes, a sub-cube slice without wraparound links)."""
    if chips < cube**3 or chips % cube**3:
        return None
    best: tuple[int, int, int] | None = None
    for a in range(cube, chips + 1, cube):
        if a**3 > chips:
            break
        for b in range(a, math.isqrt(chips // a) + 1, cube):
            c, rest = divmod(chips, a * b)
            if rest or c % cube or c < b:
                continue
            if best is None or c - a < best[2] - best[0]:
                best = (a, b, c)
    return best


def subtorus_axes(group: int, physical: Sequence[int]) -> tuple[int, ...] | None:
    """The first combination of whole physical axes of ``physical`` (the slice's torus shape, plus
    the on-chip axis where a chip holds several devices) whose sizes multiply to ``group`` (fewest
    axes first; ``()`` for one device; None: ``group`` must split an axis)."""
    if group <= 1:
        return ()
    combos = (c for k in range(1, len(physical) + 1) for c in itertools.combinations(physical, k))
    return next((c for c in combos if math.prod(c) == group), None)


def is_subtorus(group: int, physical: Sequence[int]) -> bool:
    """Whether ``group`` devices can be a product of whole physical axes of ``physical``
    (:func:`subtorus_axes`)."""
    return subtorus_axes(group, physical) is not None
