"""``train.check_memory``: the cost ledger's per-device estimate of a run against the hardware's
memory, before anything compiles, and advice that is priced before it is offered.

The estimate is :func:`lcx.cost.memory_breakdown` of the model's remat policy with the
``memory:`` options (vocabulary tiling, optimizer / parameter host offload); on ``hardware=cpu``
the simulated devices share the host's RAM, on accelerator presets each device has its HBM and a
share of the host memory.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import jax
from omegaconf import DictConfig

from lcx.cost import hardware_from_config
from lcx.models import ModelConfig
from lcx.training.memory import MemoryOptions

log = logging.getLogger("lcx.training.loop")


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
    cfg: DictConfig,
    model_cfg: ModelConfig,
    plan,
    n_devices: int,
    *,
    memory: MemoryOptions | None = None,
    local_devices: int | None = None,
    policy=None,
) -> MemoryCheck:
    """Price the run's step with the cost ledger and compare it with the hardware's memory.

    ``policy`` (default :func:`memory_policy`) prices another policy on the same run (the
    advice of :func:`check_memory` tries its fixes this way). Pure arithmetic; touches no device.
    """
    from lcx.cost import host_memory_available, memory_breakdown

    mem = memory or MemoryOptions.from_config(cfg.get("memory"))
    pol = policy or memory_policy(model_cfg, mem)
    n = int(n_devices)
    k = int(local_devices or n)
    t = cfg.train
    hw = hardware_from_config(cfg.hardware, n, probe=False)
    kinds = {}
    if "memory_kinds" in inspect.signature(memory_breakdown).parameters:
        # XLA:CPU strips JAX memory kinds: offloaded tensors stay where they are, in the same RAM
        kinds["memory_kinds"] = hw.name != "cpu"
    m = memory_breakdown(
        model_cfg,
        plan,
        n,
        seq_len=int(t.seq_len),
        global_batch=int(t.global_batch),
        policy=pol,
        dtype=model_cfg.dtype,
        param_dtype=model_cfg.param_dtype,
        tie_embeddings=model_cfg.tie_embeddings,
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


def check_memory(
    cfg: DictConfig,
    model_cfg: ModelConfig,
    plan,
    devices,
    *,
    memory: MemoryOptions | None = None,
    local_devices: int | None = None,
) -> MemoryCheck:
    """Refuse, before anything compiles, a step the cost ledger says cannot fit in memory.

    The per-device estimate is :func:`lcx.cost.memory_breakdown` of the policy the run trains
    with under ``plan``: the model's remat policy and placements plus the ``memory:`` options
    (``memory.vocab_tiling`` divides the logits' transient; ``memory.offload_optimizer`` /
    ``offload_params`` move that state to host memory as the ledger prices it) (0.92-1.06 of
    XLA's compiled footprint for the tiny model on 8 CPU devices, docs/cost_ledger.md; 54 MiB vs
    the 56 MiB compiled per device for the default run). The limit: on ``hardware=cpu`` the
    simulated devices of this process share the host's RAM, so their sum (device and host bytes:
    ``pinned_host`` is the same RAM) must fit in the RAM available now
    (:func:`lcx.cost.host_memory_available`); on an accelerator preset each device's total must
    fit in ``hardware.hbm_bytes`` and its offloaded bytes in its share of the host memory. No
    margin is added: the ledger can be up to ~8% under XLA's footprint (more where XLA's heap
    packing loses bytes), so a run estimated just under the limit may still run out.
    ``train.check_memory=false`` skips the check.

    Args:
      devices: the run's devices, or their number (a dry run has only the count).
      memory: the ``memory:`` options (None: read from ``cfg``).
      local_devices: devices of this process (None: those of ``devices`` in this process, or all
        of a count).

    Returns:
      The :class:`MemoryCheck` (``fits`` None where this machine's RAM cannot be read).

    Raises:
      ValueError: the estimate exceeds the limit; names both, the largest part and the fixes,
        each an override Hydra accepts.
    """
    from lcx.cost.memory import DTYPE_BYTES
    from lcx.training.memfixes import memory_fixes  # it reads MemoryCheck from this module

    if isinstance(devices, int):
        n = devices
    else:
        devices = list(devices)
        n = len(devices)
        if local_devices is None:
            me = jax.process_index()
            local_devices = sum(1 for d in devices if getattr(d, "process_index", 0) == me) or n
    mem = memory or MemoryOptions.from_config(cfg.get("memory"))
    chk = memory_check(cfg, model_cfg, plan, n, memory=mem, local_devices=local_devices)
    if chk.fits is None:
        log.warning("train.check_memory: this machine's available RAM cannot be read; memory not checked")
        return chk
    if chk.fits:
        return chk
    m, hw, k = chk.breakdown, chk.hardware, chk.local_devices
    gib = lambda b: f"{b / 2**30:,.2f} GiB"  # noqa: E731
    # parameters, gradients and AdamW's two states, sharded over every device: no plan does better
    state_min = model_cfg.n_params * DTYPE_BYTES[model_cfg.param_dtype] * 4 / n
    if chk.on_cpu:
        what = (
            f"{gib(m.total + m.host)} per device x {k} simulated CPU devices = {gib(chk.need)} of host RAM, "
            f"but this machine has {gib(chk.limit)} available ({chk.limit_source})"
        )
        assert chk.limit is not None  # fits is known (False), so the RAM was read
        state_alone = state_min * k > chk.limit
    else:
        what = (
            f"{gib(m.total)} of HBM per device, but hardware.hbm_bytes is {gib(hw.hbm_bytes)}"
            if chk.over_hbm
            else f"{gib(m.host)} of offloaded bytes per device, but its share of host memory is {gib(chk.host_limit)}"
        )
        state_alone = chk.over_hbm and state_min > hw.hbm_bytes
    parts = memory_parts(m) if chk.on_cpu or chk.over_hbm else _host_parts(m, chk.policy)
    big = largest(parts)
    fixes = memory_fixes(
        model_cfg,
        plan,
        m,
        state_min,
        state_alone,
        gib,
        on_cpu=chk.on_cpu,
        n=n,
        k=k,
        check=chk,
        reprice=lambda pol: memory_check(cfg, model_cfg, plan, n, memory=mem, local_devices=k, policy=pol),
        local_seq=int(cfg.train.seq_len) // plan.context_degree(n),
    )
    raise ValueError(
        f"model={model_cfg.name} does not fit: the cost ledger estimates {what}; the largest part is {big} "
        f"({gib(parts[big])} per device); {fixes}. train.check_memory=false skips this check"
    )


def _host_parts(m, policy) -> dict[str, int]:
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
