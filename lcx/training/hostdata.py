"""Host batches onto the devices: which rows of the global batch this process provides
(:func:`process_shard`) and the global arrays built from them (:func:`put_batch`).

The batch is sharded by the plan (rows over the data axes, sequence over the context axes). A
process's devices hold some of the rows; processes that hold the same rows are replicas, and
processes that hold different rows read different documents (:mod:`lcx.data.corpus_source`), so
each builds only its own rows and ``jax.make_array_from_process_local_data`` assembles the global
arrays. One process holds every row: it builds the whole batch, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np

from lcx.data.packing import BATCH_KEYS


def process_shard(sharding: jax.sharding.Sharding, shape: tuple[int, int]) -> tuple[int, int]:
    """``(index, count)``: the global batch's rows fall into ``count`` equal parts, each held by
    the devices of some processes, and this process holds part ``index``.

    Args:
      sharding: the batch's sharding.
      shape: the global batch's shape ``[B, S]``.

    Returns:
      ``(0, 1)`` on one process, or where every process holds every row; ``(p, n)`` where the
      rows split over ``n`` groups of processes (parts in order of their first row).

    Raises:
      ValueError: processes whose rows overlap without being equal, or differ in number (no
        sharding lcx builds does this).
    """
    rows: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map(tuple(shape)).items():
        rows.setdefault(device.process_index, set()).update(range(shape[0])[index[0]])
    parts = sorted({frozenset(r) for r in rows.values()}, key=min)
    if len({len(p) for p in parts}) > 1 or len(set().union(*parts)) != sum(len(p) for p in parts):
        raise ValueError(
            f"the batch sharding {sharding} gives processes overlapping or unequal sets of rows; "
            f"each process must hold one of equal, disjoint parts of the {shape[0]} rows"
        )
    return parts.index(frozenset(rows[jax.process_index()])), len(parts)


def put_batch(
    batch: Mapping[str, np.ndarray], sharding: jax.sharding.NamedSharding, global_rows: int | None = None
) -> dict[str, jax.Array]:
    """Host numpy batch ``{key: [rows, S]}`` -> global arrays ``[B, S]`` with ``sharding``.

    Args:
      batch: the five :data:`BATCH_KEYS` arrays of this process: its own part of the global batch
        (:func:`process_shard`; every row on one process), or the whole batch (evaluation).
      sharding: the batch's sharding.
      global_rows: B, rows of the global batch; None: ``batch`` is the whole batch (every
        process holds the same one).

    Returns:
      the five global ``jax.Array`` ``[B, S]``, same dtypes.
    """
    out = {}
    for k in BATCH_KEYS:
        x = np.asarray(batch[k])
        shape = (x.shape[0] if global_rows is None else int(global_rows), *x.shape[1:])
        out[k] = jax.make_array_from_process_local_data(sharding, x, shape)
    return out


__all__ = ["process_shard", "put_batch"]
