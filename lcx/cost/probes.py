"""Short probes of this machine: the ``cpu`` preset's :class:`~lcx.cost.timing.TimeModel`.

The ``cpu`` preset's achieved rates are not datasheet numbers: they are measured here, once per
machine, by a few second-long programs over the simulated devices, and cached beside the matmul
probe's peak (``LCX_CACHE``, default ``~/.cache/lcx/cpu_peak.json``; key: core count, device
count and :data:`PROBE_VERSION`). None of them is a training step; ``experiments/step_time_cpu.py``
checks the model they make against real ``lcx.train`` steps it was not fitted to.

Every probe runs on all ``n`` simulated devices at once (``jax.shard_map``, each device on its
own data, no communication unless the probe is about it), as a training step does: the devices
share the host's cores, so a probe's wall time is the host's, and a rate is total work over wall
time against the host's peak (:func:`lcx.cost.hardware.cpu_peak_flops`; the per-device peak is
host / n and the ledger divides work by n, so the ratio is the same). Each time is the median of
a few calls after one that compiles.

- ``linear_efficiency``: one transformer block without its attention (RMSNorm, q/k/v/o
  projections, RMSNorm, SwiGLU MLP, residuals), forward and backward, at the two per-device
  shapes the preset's steps cover (:data:`LINEAR_SHAPES`); model FLOPs ``6 T params`` over the
  host peak, geometric mean of the two.
- ``attention_efficiency['xla']``: the ``xla`` kernel (:func:`lcx.attention.flash_attention`)
  forward and backward, causal, at :data:`ATTENTION_SHAPE`; FLOPs as the time model executes
  them (model ``12 S^2/2 N H`` x 3.5 / 3 x ``(1 + block / S)``).
- ``kernel_call_s``: the same kernel at one 128-token tile, less its FLOPs' time and a no-op
  call's, per call (one forward, one backward).
- ``collective_latency_s``: a chain of 16 ``ppermute`` of 4 floats around the devices, less a
  no-op call, per ``ppermute``; ``bandwidth_per_device``: 4 ``ppermute`` of 4 MiB per device
  (one-way bytes/s each device gets while all copy at once; host memory copies).
- ``step_overhead_s``: a no-op call of a step-sized argument tree (the dispatch every step pays).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from lcx.cost.timing import TimeModel

PROBE_VERSION = 1
LINEAR_SHAPES = ((512, 128, 384, 4, 1), (1024, 256, 768, 8, 2))
"""Per-device (tokens T, d_model D, mlp F, query heads N, kv heads K) of the linear probe, head dim 32."""
ATTENTION_SHAPE = (1024, 4, 1, 32, 512)
"""Per-device (tokens S, query heads N, kv heads K, head dim H, block) of the attention probe."""


@dataclasses.dataclass(frozen=True)
class Probes:
    """What the probes measured (see the module docstring for each).

    Attributes:
      n_devices: simulated devices the probes ran on.
      host_peak_flops: the matmul probe's host FLOP/s (all devices together).
      linear_efficiency, attention_efficiency: achieved fractions of ``host_peak_flops``.
      kernel_call_s, collective_latency_s, step_overhead_s: seconds per call / collective / step.
      bandwidth_per_device: one-way bytes/s of a device's collective transfer.
    """

    n_devices: int
    host_peak_flops: float
    linear_efficiency: float
    attention_efficiency: float
    kernel_call_s: float
    collective_latency_s: float
    bandwidth_per_device: float
    step_overhead_s: float

    def time_model(self, **overrides: Any) -> TimeModel:
        """The :class:`TimeModel` of these rates (``overrides``: other TimeModel fields).

        ``ring_overlap`` defaults to 0: a simulated device's transfer is a host memory copy on
        the same cores as the compute, so nothing hides behind it.
        """
        fields: dict[str, Any] = {
            "attention_efficiency": {"xla": min(1.0, self.attention_efficiency)},
            "default_attention_efficiency": min(1.0, self.attention_efficiency),
            "linear_efficiency": min(1.0, self.linear_efficiency),
            "kernel_call_s": self.kernel_call_s,
            "collective_latency_s": self.collective_latency_s,
            "ring_overlap": 0.0,
            "step_overhead_s": self.step_overhead_s,
            "source": f"lcx.cost.probes v{PROBE_VERSION} on this machine ({self.n_devices} simulated devices)",
        }
        return TimeModel(**{**fields, **overrides})


def cpu_probes(n_devices: int, *, measure: Callable[[int], Probes] | None = None) -> Probes:
    """The probes of this machine for ``n_devices`` simulated devices, measured once and cached.

    Args:
      n_devices: simulated CPU devices of the runs to price.
      measure: the measurement (default: :func:`measure_in_subprocess`; tests pass a stub).
    """
    from lcx.cost.hardware import cache_path

    cache = cache_path()
    key = f"{os.cpu_count()}cpu-probes-v{PROBE_VERSION}-d{n_devices}"
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        data = {}
    if isinstance(data.get(key), dict):
        return Probes(**data[key])
    p = (measure or measure_in_subprocess)(n_devices)
    data[key] = dataclasses.asdict(p)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(data))
    except OSError:
        pass
    return p


def measure_in_subprocess(n_devices: int) -> Probes:
    """:func:`measure` in a fresh Python with ``n_devices`` CPU devices (a process's device
    count is fixed when JAX starts, and the caller's may differ).

    Raises:
      RuntimeError: the probe process failed (its stderr is in the message).
    """
    cmd = [sys.executable, "-m", "lcx.cost.probes", str(n_devices)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if r.returncode != 0:
        raise RuntimeError(f"the CPU probes failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    return Probes(**json.loads(r.stdout.strip().splitlines()[-1]))


def _median_time(f: Callable, *args: Any, repeats: int = 3) -> float:
    """Median wall seconds of ``f(*args)`` over ``repeats`` calls after a compiling one."""
    import jax

    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(n_devices: int) -> Probes:
    """Run every probe on the first ``n_devices`` CPU devices of this process (seconds)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec

    from lcx.cost.hardware import cpu_peak_flops

    devs = jax.devices("cpu")[:n_devices]
    if len(devs) < n_devices:
        raise ValueError(f"probes need {n_devices} CPU devices, JAX has {len(devs)} (set jax_num_cpu_devices)")
    n, mesh, spec = len(devs), Mesh(devs, ("d",)), PartitionSpec("d")
    peak = cpu_peak_flops()

    def per_device(fn: Callable, n_in: int = 1) -> Callable:
        # check_vma=False: the kernel's lax.switch mixes per-device and constant branches, as
        # inside lcx.attention's own shard_map
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec,) * n_in, out_specs=spec, check_vma=False))

    def put(shape: tuple[int, ...], scale: float = 0.1) -> jax.Array:
        x = scale * jax.random.normal(jax.random.key(len(shape)), (n * shape[0], *shape[1:]), jnp.float32)
        return jax.device_put(x, jax.NamedSharding(mesh, spec))

    noop = per_device(lambda x: x + 1)
    t_noop = _median_time(noop, put((4,)), repeats=5)
    lin = [_linear_rate(per_device, put, s) / peak for s in LINEAR_SHAPES]
    S, N, K, H, block = ATTENTION_SHAPE
    att_t, att_flops = _attention_time(per_device, put, S, N, K, H, block)
    att_eff = n * att_flops / att_t / peak
    small_t, small_flops = _attention_time(per_device, put, 128, N, K, H, 128)
    call_s = max(0.0, small_t - t_noop - n * small_flops / (peak * att_eff)) / 2

    def chain(x, hops: int):
        for _ in range(hops):
            x = jax.lax.ppermute(x, "d", [(i, (i + 1) % n) for i in range(n)])
        return x

    t_lat = _median_time(per_device(lambda x: chain(x, 16)), put((4,)), repeats=5)
    lat = max(0.0, t_lat - t_noop) / 16
    mib = 2**20
    t_bw = _median_time(per_device(lambda x: chain(x, 4)), put((mib,)))  # 4 MiB float32 per device
    bw = 4 * 4 * mib / max(t_bw - t_noop - 4 * lat, 1e-9)
    tree = [put((8,)) for _ in range(100)]  # a step's state has O(100) arrays
    t_tree = _median_time(per_device(lambda *xs: xs, 100), *tree, repeats=5)
    return Probes(
        n_devices=n,
        host_peak_flops=peak,
        linear_efficiency=math.exp(sum(map(math.log, lin)) / len(lin)),
        attention_efficiency=att_eff,
        kernel_call_s=call_s,
        collective_latency_s=lat,
        bandwidth_per_device=bw,
        step_overhead_s=t_tree,
    )


def _linear_rate(per_device: Callable, put: Callable, shape: tuple[int, ...]) -> float:
    """Host FLOP/s of a transformer block's linear part, forward + backward, at ``shape``."""
    import jax
    import jax.numpy as jnp

    T, D, F, N, K = shape
    H = 32
    dims = {"q": (D, N * H), "k": (D, K * H), "v": (D, K * H), "o": (N * H, D)}
    dims |= {"gate": (D, F), "up": (D, F), "down": (F, D)}
    ws = {k: 0.05 * jax.random.normal(jax.random.key(i), s, jnp.float32) for i, (k, s) in enumerate(dims.items())}
    params = sum(a * b for a, b in dims.values())

    def norm(x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5)

    def block(w, x):
        h = norm(x)
        q, k, v = h @ w["q"], h @ w["k"], h @ w["v"]
        # stands in for attention: the same q, k, v in, one [T, N H] out, no quadratic work
        mix = q * jnp.tile(k + v, (1, N // K))
        x = x + mix @ w["o"]
        h = norm(x)
        return x + (jax.nn.silu(h @ w["gate"]) * (h @ w["up"])) @ w["down"]

    def step(x):
        return jax.grad(lambda w, x: jnp.sum(block(w, x) ** 2), argnums=(0, 1))(ws, x)[1]

    t = _median_time(per_device(step), put((T, D)))
    n = put((T, D)).shape[0] // T
    return n * 6.0 * T * params / t


def _attention_time(per_device: Callable, put: Callable, S: int, N: int, K: int, H: int, block: int):
    """(wall seconds, executed FLOPs per device) of the ``xla`` kernel's causal forward and
    backward at ``S`` tokens, ``N``/``K`` heads of width ``H``, ``block``-token tiles."""
    import jax
    import jax.numpy as jnp

    from lcx.attention import CAUSAL, XlaKernel, flash_attention

    kernel = XlaKernel(block_q=block, block_kv=block)
    pos = jnp.arange(S, dtype=jnp.int32)[None]
    seg = jnp.zeros((1, S), jnp.int32)

    def fwd_bwd(qkv):
        q, k, v = qkv[:, :, :N], qkv[:, :, N : N + K], qkv[:, :, N + K :]

        def loss(q, k, v):
            out = flash_attention(q, k, v, pos, pos, seg, seg, mask=CAUSAL, kernel=kernel)
            assert isinstance(out, jax.Array)  # no return_lse: the output alone
            return jnp.sum(out * out)

        dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
        return jnp.concatenate([dq, dk, dv], axis=2)

    t = _median_time(per_device(fwd_bwd), put((1, S, N + 2 * K, H)))
    model = 12.0 * S * S / 2 * N * H  # forward + backward, causal (lcx.cost.flops)
    return t, model * 3.5 / 3 * (1 + min(block, S) / S)


if __name__ == "__main__":  # python -m lcx.cost.probes N: measure on N devices, print JSON
    import jax

    jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
    print(json.dumps(dataclasses.asdict(measure(int(sys.argv[1])))))
