"""The cost ledger's per-device estimate of a training step against the hardware's memory
(:func:`memory_check`), before anything compiles: pure arithmetic, no device.

The estimate is :func:`lcx.cost.memory_breakdown` of the model's remat policy with the
``memory:`` options (vocabulary tiling, optimizer / parameter host offload); on ``hardware=cpu``
the simulated devices share the host's RAM, on accelerator presets each device has its HBM and a
share of the host memory.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from lcx.cost import hardware_from_config
from lcx.models import ModelConfig
from lcx.training.config import HardwareConfig, MemoryOptions


@dataclasses.dataclass(frozen=True)
class MemoryCheck:
    """The cost ledger's estimate of one run's memory against the hardware's (see
    :func:`memory_check`).

    Attributes:
      breakdown: :class:`lcx.cost.MemoryBreakdown` per device (bytes) of the run's policy.
      policy: the :class:`lcx.cost.ActivationPolicy` priced: the model's remat and placements
        with the ``memory:`` options (vocabulary tiling, optimizer / parameter offload).
      hardware: the :class:`lcx.cost.Hardware` preset.
      n_devices: devices of the run; ``local_devices``: those of this process.
      on_cpu: ``hardware=cpu``: device and host bytes of all local devices share this host's RAM.
      limit: bytes the estimate is compared with (cpu: RAM available now; else HBM per device;
        None: unknown, not checked); ``limit_source``: where the number comes from.
      host_limit: host bytes per device (accelerator presets; None: unknown or cpu).
      need: the bytes compared with ``limit`` (cpu: (device + host) x local devices; else the
        per-device peak); ``fits``: need <= limit and host <= host_limit (None: not checked).
    """

    breakdown: Any
    policy: Any
    hardware: Any
    n_devices: int
    local_devices: int
    on_cpu: bool
    limit: float | None
    limit_source: str
    host_limit: float | None
    need: float
    fits: bool | None

    @property
    def over_hbm(self) -> bool:
        return not self.on_cpu and self.limit is not None and self.need > self.limit

    @property
    def over_host(self) -> bool:
        return not self.on_cpu and self.host_limit is not None and self.breakdown.host > self.host_limit


def memory_policy(model_cfg: ModelConfig, memory: MemoryOptions | None = None):
    """The :class:`lcx.cost.ActivationPolicy` a run trains with: the model's remat policy and
    its placements (``model.remat``, ``model.remat_*``) and the ``memory:`` options."""
    from lcx.cost import ActivationPolicy

    mem = memory or MemoryOptions()
    return ActivationPolicy.from_model(
        model_cfg,
        vocab_tiling=mem.vocab_tiling,
        offload_optimizer=mem.offload_optimizer,
        offload_params=mem.offload_params,
    )


def memory_check(
    model_cfg: ModelConfig,
    plan,
    n_devices: int,
    *,
    seq_len: int,
    global_batch: int,
    hardware: HardwareConfig,
    memory: MemoryOptions | None = None,
    local_devices: int | None = None,
    policy=None,
) -> MemoryCheck:
    """Price the run's step with the cost ledger and compare it with the hardware's memory.

    Args:
      model_cfg: the model.
      plan: the (unbound) plan.
      n_devices: devices of the run.
      seq_len: S, tokens per sequence.
      global_batch: B, sequences per step.
      hardware: the ``hardware`` preset.
      memory: the ``memory:`` options (None: the defaults).
      local_devices: devices of this process (None: all ``n_devices``).
      policy: another :class:`lcx.cost.ActivationPolicy` to price on the same run (default
        :func:`memory_policy`; the advice of :mod:`lcx.training.memory.fixes` tries its fixes
        this way).

    Returns:
      The :class:`MemoryCheck`. Pure arithmetic; touches no device.
    """
    from lcx.cost import host_memory_available, memory_breakdown

    pol = policy or memory_policy(model_cfg, memory)
    n = int(n_devices)
    k = int(local_devices or n)
    hw = hardware_from_config(hardware, n, probe=False)
    kinds = {}
    if "memory_kinds" in inspect.signature(memory_breakdown).parameters:
        # XLA:CPU strips JAX memory kinds: offloaded tensors stay where they are, in the same RAM
        kinds["memory_kinds"] = hw.name != "cpu"
    m = memory_breakdown(
        model_cfg,
        plan,
        n,
        seq_len=seq_len,
        global_batch=global_batch,
        policy=pol,
        dtype=model_cfg.dtype,
        param_dtype=model_cfg.param_dtype,
        tie_embeddings=model_cfg.tie_embeddings,
        window=model_cfg.sliding_window,  # a uniform model's kind (layer_kinds carry their own)
        **kinds,
    )
    if hw.name == "cpu":
        avail = host_memory_available()
        limit, source = avail if avail is not None else (None, "this machine's available RAM cannot be read")
        need = (m.total + m.host) * k  # the simulated devices of this process share its host's RAM
        fits = None if limit is None else need <= limit
        return MemoryCheck(m, pol, hw, n, k, True, limit, source, None, need, fits)
    host = hw.host_memory_per_device
    fits = (hw.hbm_bytes is None or m.total <= hw.hbm_bytes) and (host is None or m.host <= host)
    return MemoryCheck(m, pol, hw, n, k, False, hw.hbm_bytes, "hardware.hbm_bytes", host, m.total, fits)


def host_parts(m, policy) -> dict[str, int]:
    """The parts of the offloaded bytes ``m.host`` (when the host's share is what overflows):
    parameters (``p`` = ``m.grads``), AdamW's two states (``2 p``) and offloaded activations."""
    p = m.grads
    out = {
        "parameters offloaded to host": p if policy.offload_params else 0,
        "optimizer state offloaded to host": 2 * p if policy.offload_optimizer else 0,
    }
    out["activations offloaded to host"] = max(0, m.host - sum(out.values()))
    return out


def memory_parts(m) -> dict[str, int]:
    """The parts of a :class:`lcx.cost.MemoryBreakdown` the memory check names as the largest."""
    return {name: getattr(m, field) for name, field in _PARTS}


# (what the message calls a part, its MemoryBreakdown field)
_PARTS = (
    ("parameters + gradients + optimizer state", "state"),
    ("saved activations", "activations"),
    ("block backward", "layer_working"),
    ("attention backward", "attention"),
    ("logits", "logits"),
)


def largest(parts: Mapping[str, float]) -> str:
    """The name of the largest of ``parts`` (the first of equal ones)."""
    return max(parts, key=lambda p: parts[p])


def format_count(n: int) -> str:
    """A count (of parameters) with a unit that leaves digits to read: 8.03B, 1.62M, 70.6K, 443K
    (three significant digits; from 100 units on, whole units: 1,235B, never 1.23e+03B)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}" if n < 100 * scale else f"{n / scale:,.0f}{unit}"
    return str(n)
