"""Short probes of this machine: the host's matmul peak and the ``cpu`` preset's
:class:`~lcx.cost.timing.TimeModel`.

:mod:`lcx.cost.hardware` reads both from here (this module reads no preset). The peak
(:func:`cpu_peak_flops`) and the ``cpu`` preset's achieved rates (:func:`cpu_probes`) are measured
once per machine, the rates by second-long programs over the simulated devices, and kept in one
cache (``LCX_CACHE``, default ``~/.cache/lcx/cpu_peak.json``; :func:`read_cache`; the rates' key:
cores, devices, :data:`PROBE_VERSION`). None is a training
step: ``experiments/step_time_cpu.py`` checks their model against real ``lcx.train`` steps.

Every probe runs on all ``n`` simulated devices at once (``jax.shard_map``, each device on its
own data, no communication unless the probe is about it), as a training step does: the devices
share the host's cores, so a probe's wall time is the host's, and a rate is total work over wall
time against the host's peak (:func:`cpu_peak_flops`; the per-device peak is host / n and the
ledger divides work by n, so the ratio is the same). Each time is the best of
a few calls after one that compiles (as the matmul peak's), and the share of the machine other
processes used meanwhile is recorded (``foreign_share``): a probe beside another job measures
both.

- ``linear_efficiency``: one transformer block without its attention (RMSNorm, q/k/v/o
  projections, RMSNorm, SwiGLU MLP, residuals), forward and backward, at the two per-device
  shapes the preset's steps cover (:data:`LINEAR_SHAPES`); model FLOPs ``6 T params`` over the
  host peak, geometric mean of the two.
- ``attention_efficiency['xla']``: the ``xla`` kernel (:func:`lcx.attention.flash_attention`)
  forward and backward, causal, at :data:`ATTENTION_SHAPES`; FLOPs as the time model executes
  them (model ``12 S^2/2 N H`` x 3.5 / 3 x ``(1 + block / S)``), geometric mean of the two.
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
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from lcx.cost.timing import TimeModel

PROBE_VERSION = 3
LINEAR_SHAPES = ((512, 128, 384, 4, 1), (1024, 256, 768, 8, 2))
"""Per-device (tokens T, d_model D, mlp F, query heads N, kv heads K) of the linear probe, head dim 32."""
ATTENTION_SHAPES = ((512, 4, 1, 32, 256), (1024, 4, 1, 32, 512))
"""Per-device (tokens S, query heads N, kv heads K, head dim H, block) of the attention probe: the
tiles of the preset's steps (256 and 512 tokens, the zigzag chunk at 2,048 and 4,096 tokens)."""
MAX_FOREIGN_SHARE = 0.1
"""Probes during which other processes used more of the machine are measured again (3 tries at
most; the least disturbed is kept)."""


def cache_path() -> pathlib.Path:
    """The file the CPU probes cache their measurements in (``LCX_CACHE`` overrides the folder)."""
    return pathlib.Path(os.environ.get("LCX_CACHE", pathlib.Path.home() / ".cache" / "lcx")) / "cpu_peak.json"


def read_cache() -> dict[str, Any]:
    """The CPU probes' cache, ``{key: measurement}`` (empty when missing or unreadable)."""
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(key: str, value: Any) -> None:
    """Store ``value`` under ``key`` in the CPU probes' cache (where it cannot be written, the
    next process measures again)."""
    data = read_cache()
    data[key] = value
    try:
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        cache_path().write_text(json.dumps(data))
    except OSError:
        pass


def cpu_peak_flops(n: int = 2048, repeats: int = 3) -> float:
    """Host float32 matmul rate in FLOP/s (best of ``repeats`` runs of an n^3 matmul), cached.

    The probe runs once per machine (cache key: core count and n) on the first CPU device.
    """
    key = f"{os.cpu_count()}cpu-n{n}"
    cached = read_cache().get(key)
    if cached is not None:
        return float(cached)
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
    write_cache(key, rate)
    return rate


@dataclasses.dataclass(frozen=True)
class Probes:
    """What the probes measured (see the module docstring for each).

    Attributes:
      n_devices: simulated devices the probes ran on.
      host_peak_flops: the matmul probe's host FLOP/s (all devices together).
      linear_efficiency, attention_efficiency: achieved fractions of ``host_peak_flops``.
      kernel_call_s, collective_latency_s, step_overhead_s: seconds per call / collective / step.
      bandwidth_per_device: one-way bytes/s of a device's collective transfer.
      foreign_share: share of the machine's CPU time other processes used while the probes ran
        (None: not known).
    """

    n_devices: int
    host_peak_flops: float
    linear_efficiency: float
    attention_efficiency: float
    kernel_call_s: float
    collective_latency_s: float
    bandwidth_per_device: float
    step_overhead_s: float
    foreign_share: float | None = None

    def time_model(self, **overrides: Any) -> TimeModel:
        """The :class:`TimeModel` of these rates (``overrides``: other TimeModel fields).
        ``ring_overlap`` is 0: a simulated device's transfer is a host memory copy on the cores
        of the compute, so nothing hides behind it."""
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
    """The probes of this machine for ``n_devices`` simulated devices, measured once and cached
    (``measure``: the measurement, default :func:`measure_in_subprocess`; tests pass a stub)."""
    key = f"{os.cpu_count()}cpu-probes-v{PROBE_VERSION}-d{n_devices}"
    cached = read_cache().get(key)
    if isinstance(cached, dict):
        return Probes(**cached)
    tries = [(measure or measure_in_subprocess)(n_devices)]
    while len(tries) < 3 and (tries[-1].foreign_share or 0.0) > MAX_FOREIGN_SHARE:
        tries.append((measure or measure_in_subprocess)(n_devices))  # measured beside another job
    p = min(tries, key=lambda t: t.foreign_share or 0.0)
    write_cache(key, dataclasses.asdict(p))
    return p


def measure_in_subprocess(n_devices: int) -> Probes:
    """:func:`measure` in a fresh Python with ``n_devices`` CPU devices (a process's device
    count is fixed when JAX starts, and the caller's may differ); RuntimeError if it fails."""
    cmd = [sys.executable, "-m", "lcx.cost.probes", str(n_devices)]
    r, load = run_with_load(cmd, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if r.returncode != 0:
        raise RuntimeError(f"the CPU probes failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    return Probes(**{**json.loads(r.stdout.strip().splitlines()[-1]), "foreign_share": load["foreign_share"]})


def run_with_load(cmd: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``subprocess.run(cmd, **kwargs)`` and the load beside it: ``wall_s``, ``cpu_s`` (the
    child's CPU seconds) and ``foreign_share`` (CPU time other processes used meanwhile over wall
    time x cores; None where ``/proc/stat`` cannot be read). Simulated devices share the cores
    with everything else, so a timing taken beside another job measures both."""
    import resource

    r0, b0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu_s(), time.perf_counter()
    r = subprocess.run(cmd, **kwargs)
    r1, busy, wall = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu_s() - b0, time.perf_counter() - t0
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    share = max(0.0, busy - cpu) / (wall * (os.cpu_count() or 1)) if busy > 0 else None
    return r, {"wall_s": wall, "cpu_s": cpu, "foreign_share": share}


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy since boot, every process (``/proc/stat``,
    less idle and iowait; 0 where it cannot be read)."""
    try:
        v = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _best_time(f: Callable, *args: Any, repeats: int = 3) -> float:
    """Fewest wall seconds of ``f(*args)`` over ``repeats`` calls after a compiling one."""
    import jax

    jax.block_until_ready(f(*args))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def measure(n_devices: int) -> Probes:
    """Run every probe on the first ``n_devices`` CPU devices of this process (seconds)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec

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

    t_noop = _best_time(per_device(lambda x: x + 1), put((4,)), repeats=5)
    lin = [_linear_rate(per_device, put, n, s) / peak for s in LINEAR_SHAPES]
    att = []
    for shape in ATTENTION_SHAPES:
        t, flops = _attention_time(per_device, put, *shape)
        att.append(n * flops / t / peak)
    att_eff = _geomean(att)
    N, K, H = ATTENTION_SHAPES[0][1:4]
    small_t, small_flops = _attention_time(per_device, put, 128, N, K, H, 128)
    call_s = max(0.0, small_t - t_noop - n * small_flops / (peak * att_eff)) / 2

    def chain(x, hops: int):
        for _ in range(hops):
            x = jax.lax.ppermute(x, "d", [(i, (i + 1) % n) for i in range(n)])
        return x

    t_lat = _best_time(per_device(lambda x: chain(x, 16)), put((4,)), repeats=5)
    lat = max(0.0, t_lat - t_noop) / 16
    mib = 2**20
    t_bw = _best_time(per_device(lambda x: chain(x, 4)), put((mib,)))  # 4 MiB float32 per device
    bw = 4 * 4 * mib / max(t_bw - t_noop - 4 * lat, 1e-9)
    tree = [put((8,)) for _ in range(100)]  # a step's state has O(100) arrays
    t_tree = _best_time(per_device(lambda *xs: xs, 100), *tree, repeats=5)
    return Probes(
        n_devices=n,
        host_peak_flops=peak,
        linear_efficiency=_geomean(lin),
        attention_efficiency=att_eff,
        kernel_call_s=call_s,
        collective_latency_s=lat,
        bandwidth_per_device=bw,
        step_overhead_s=t_tree,
    )


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def _linear_rate(per_device: Callable, put: Callable, n: int, shape: tuple[int, ...]) -> float:
    """Host FLOP/s of a transformer block's linear part, forward + backward, at ``shape`` on
    each of ``n`` devices."""
    import jax
    import jax.numpy as jnp

    (T, D, F, N, K), H = shape, 32
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
        dw, dx = jax.grad(lambda w, x: jnp.sum(block(w, x) ** 2), argnums=(0, 1))(ws, x)
        # every weight gradient feeds the output: XLA drops a gradient nobody reads
        return dx + sum(jnp.sum(g) for g in jax.tree.leaves(dw))

    return n * 6.0 * T * params / _best_time(per_device(step), put((T, D)))


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

    t = _best_time(per_device(fwd_bwd), put((1, S, N + 2 * K, H)))
    model = 12.0 * S * S / 2 * N * H  # forward + backward, causal (lcx.cost.flops)
    return t, model * 3.5 / 3 * (1 + min(block, S) / S)


if __name__ == "__main__":  # python -m lcx.cost.probes N: measure on N devices, print JSON
    import jax

    jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
    print(json.dumps(dataclasses.asdict(measure(int(sys.argv[1])))))
