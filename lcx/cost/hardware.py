"""Hardware presets: peak FLOP/s and memory per device (the ``hardware=`` Hydra group).

On CPU the peak is not a datasheet number: it is measured once by a float32 matmul probe and
cached in ``~/.cache/lcx/cpu_peak.json``. The simulated CPU devices share the host's cores, so
the per-device peak is the host peak divided by the number of simulated devices.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Attributes:
    name: preset name.
    peak_flops_per_device: peak FLOP/s of one device in the compute dtype (bf16 on TPU).
    hbm_bytes: device memory in bytes (None if not meaningful).
    """

    name: str
    peak_flops_per_device: float
    hbm_bytes: float | None = None


def cpu_peak_flops(n: int = 2048, repeats: int = 3) -> float:
    """Host float32 matmul rate in FLOP/s (best of ``repeats`` runs of an n^3 matmul), cached."""
    cache = pathlib.Path(os.environ.get("LCX_CACHE", pathlib.Path.home() / ".cache" / "lcx")) / "cpu_peak.json"
    key = f"{os.cpu_count()}cpu-n{n}"
    try:
        data = json.loads(cache.read_text())
        if key in data:
            return float(data[key])
    except (OSError, ValueError):
        data = {}
    import jax
    import jax.numpy as jnp

    dev = jax.devices("cpu")[0]
    a = jax.device_put(jnp.ones((n, n), jnp.float32), dev)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    rate = 2.0 * n**3 / best
    data[key] = rate
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    except OSError:
        pass
    return rate


def hardware_from_config(node, n_devices: int) -> Hardware:
    """Build :class:`Hardware` from the Hydra ``hardware`` node; probes the CPU when its peak is null."""
    peak = node.get("peak_flops_per_device")
    if peak is None:
        if node.get("name") != "cpu":
            raise ValueError(f"hardware preset {node.get('name')!r} needs peak_flops_per_device")
        peak = cpu_peak_flops() / n_devices
    return Hardware(name=str(node.get("name")), peak_flops_per_device=float(peak), hbm_bytes=node.get("hbm_bytes"))
