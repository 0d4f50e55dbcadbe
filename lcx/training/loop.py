"""The training loop: validate the plan, build data, model and optimizer, train, log, evaluate,
checkpoint (:mod:`lcx.training.checkpoint`) and resume.

Everything that can be wrong with the configuration (plan vs devices, model and batch; data
paths; sequence length) is checked before anything compiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import pathlib
import signal
import sys
import threading
import time
from typing import Any

import equinox as eqx
import jax
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lcx.cost import hardware_from_config, training_flops
from lcx.data import make_data
from lcx.models import ModelConfig, init_model, model_shardings
from lcx.sharding import MeshPlan, bind
from lcx.sharding.config import plan_from_config
from lcx.training.checkpoint import (
    Checkpoints,
    abstract_train_state,
    check_compatible,
    checkpoint_config,
    is_arraylike,
    finite_or_none,
    key_from_json,
    key_to_json,
    nonfinite_leaves,
)
from lcx.training.memory import MemoryOptions
from lcx.training.optim import optimizer_from_config
from lcx.training.runinfo import run_info
from lcx.training.step import init_opt_state, make_steps, put_batch

log = logging.getLogger(__name__)


def setup(cfg: DictConfig, devices=None) -> dict[str, Any]:
    """Resolve and validate everything a run needs, before compiling anything.

    :func:`resolve` on the device count, then the plan bound to ``devices``.

    Returns a dict with ``plan`` (MeshPlan), ``model_cfg``, ``devices``, ``memory``
    (:class:`~lcx.training.memory.MemoryOptions` of the ``memory:`` section).

    Raises:
      PlanError / ValueError: an invalid plan, model, batch or sequence configuration, with a
        message that names the value and the fix.
    """
    devices = list(jax.devices() if devices is None else devices)
    me = jax.process_index()
    local = sum(1 for d in devices if getattr(d, "process_index", 0) == me) or len(devices)
    ctx = resolve(cfg, len(devices), local_devices=local)
    return {"plan": bind(ctx["plan"], devices), "model_cfg": ctx["model_cfg"], "devices": devices,
            "memory": ctx["memory"]}


def resolve(cfg: DictConfig, n_devices: int, *, local_devices: int | None = None,
            run_memory_check: bool = True) -> dict[str, Any]:
    """Validate a run on ``n_devices`` devices from the configuration alone: the settings, the
    plan, the model, the ``memory:`` options and (``train.check_memory``) the cost ledger's
    memory estimate. No device is touched and nothing compiles, so it serves a dry run for a
    slice this machine does not have (:func:`dry_run`) as well as :func:`setup`.

    Args:
      cfg: the composed ``lcx.train`` config.
      n_devices: JAX devices of the run (all processes together).
      local_devices: of those, the devices of this process (``hardware=cpu``: the simulated
        devices that share this host's RAM); None: all of them.
      run_memory_check: False: skip the memory check even where ``train.check_memory`` asks for
        it (:func:`dry_run` prints the anatomy first, then checks).

    Returns:
      A dict with ``plan`` (the unbound :class:`~lcx.sharding.Plan`), ``model_cfg``, ``memory``
      (:class:`~lcx.training.memory.MemoryOptions`), ``n_devices`` and ``check_memory`` (bool).

    Raises:
      PlanError / ValueError: as :func:`setup`.
    """
    from lcx.conf import boolean, positive_int

    # whole numbers, never truncated: train.seq_len=512.5 is an error, not 512 tokens
    positive_int(cfg.train.seq_len, "train.seq_len", "tokens per sequence")
    positive_int(cfg.train.global_batch, "train.global_batch", "sequences per step")
    positive_int(cfg.train.steps, "train.steps", "optimizer steps")
    check = boolean(cfg.train.get("check_memory", True), "train.check_memory",
                    "refuse a step the cost ledger says exceeds memory")
    plan = plan_from_config(cfg.plan, hardware=cfg.hardware)
    model_cfg = ModelConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))
    plan.validate(
        n_devices, dims=model_cfg.dims(), seq_len=int(cfg.train.seq_len), global_batch=int(cfg.train.global_batch)
    )
    memory = MemoryOptions.from_config(cfg.get("memory"))
    P = plan.context_degree(n_devices)
    memory.check_tiling(int(cfg.train.seq_len) // P, seq_len=int(cfg.train.seq_len), context_degree=P)
    if check and run_memory_check:
        check_memory(cfg, model_cfg, plan, n_devices, memory=memory, local_devices=local_devices)
    return {"plan": plan, "model_cfg": model_cfg, "memory": memory, "n_devices": n_devices, "check_memory": check}


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
    return ActivationPolicy.from_model(model_cfg, vocab_tiling=mem.vocab_tiling, offload_optimizer=mem.offload_optimizer,
                                       offload_params=mem.offload_params)


def memory_check(cfg: DictConfig, model_cfg: ModelConfig, plan, n_devices: int, *, memory: MemoryOptions | None = None,
                 local_devices: int | None = None, policy=None) -> MemoryCheck:
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
    m = memory_breakdown(model_cfg, plan, n, seq_len=int(t.seq_len), global_batch=int(t.global_batch), policy=pol,
                         dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype,
                         tie_embeddings=model_cfg.tie_embeddings, **kinds)
    if hw.name == "cpu":
        avail = host_memory_available()
        limit, source = avail if avail is not None else (None, "this machine's available RAM cannot be read")
        need = (m.total + m.host) * k  # the simulated devices of this process share its host's RAM
        fits = None if limit is None else need <= limit
        return MemoryCheck(m, pol, hw, n, k, True, limit, source, None, need, fits)
    host = hw.host_memory_per_device
    fits = (hw.hbm_bytes is None or m.total <= hw.hbm_bytes) and (host is None or m.host <= host)
    return MemoryCheck(m, pol, hw, n, k, False, hw.hbm_bytes, "hardware.hbm_bytes", host, m.total, fits)


def check_memory(cfg: DictConfig, model_cfg: ModelConfig, plan, devices, *, memory: MemoryOptions | None = None,
                 local_devices: int | None = None) -> MemoryCheck:
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
        what = (f"{gib(m.total + m.host)} per device x {k} simulated CPU devices = {gib(chk.need)} of host RAM, "
                f"but this machine has {gib(chk.limit)} available ({chk.limit_source})")
        state_alone = state_min * k > chk.limit
    else:
        what = (f"{gib(m.total)} of HBM per device, but hardware.hbm_bytes is {gib(hw.hbm_bytes)}" if chk.over_hbm
                else f"{gib(m.host)} of offloaded bytes per device, but its share of host memory is "
                     f"{gib(chk.host_limit)}")
        state_alone = chk.over_hbm and state_min > hw.hbm_bytes
    parts = _parts(m)
    big = max(parts, key=parts.get)
    fixes = _memory_fixes(model_cfg, plan, m, state_min, state_alone, gib, on_cpu=chk.on_cpu, n=n, k=k,
                          check=chk, reprice=lambda pol: memory_check(cfg, model_cfg, plan, n, memory=mem,
                                                                      local_devices=k, policy=pol),
                          local_seq=int(cfg.train.seq_len) // plan.context_degree(n))
    raise ValueError(
        f"model={model_cfg.name} does not fit: the cost ledger estimates {what}; the largest part is {big} "
        f"({gib(parts[big])} per device); {fixes}. train.check_memory=false skips this check"
    )


def _parts(m) -> dict[str, int]:
    """The parts of a :class:`lcx.cost.MemoryBreakdown` the memory check names as the largest."""
    return {"parameters + gradients + optimizer state": m.state, "saved activations": m.activations,
            "block backward": m.layer_working, "attention backward": m.attention, "logits": m.logits}


def _memory_fixes(model_cfg: ModelConfig, plan, m, state_min: float, state_alone: bool, gib, *,
                  on_cpu: bool, n: int, k: int, check: MemoryCheck | None = None, reprice=None,
                  local_seq: int | None = None) -> str:
    """The advice of :func:`check_memory`: only changes that lower the estimate it compared.

    On ``hardware=cpu`` the limit is the host RAM that all simulated devices share, so what counts
    is the sum over devices: more devices or a larger ``plan.mesh.context`` only split the same
    tokens differently (the sum stays), while sharding replicated parameters does lower it (n
    copies become one), and host offload only moves bytes within the same RAM. Overrides are
    printed in a form Hydra accepts: ``plan.params`` has no ``embed`` key unless the preset sets
    one, so the rule is added with ``+``; the ``memory:`` keys exist in config.yaml.

    With ``check`` and ``reprice`` (a function from an :class:`lcx.cost.ActivationPolicy` to the
    :class:`MemoryCheck` of the same run under it), the policy fixes are priced before they are
    offered: vocabulary tiling (the smallest ``memory.vocab_tiling`` that divides the
    ``local_seq`` tokens of a device and makes the step fit, else the one at which the logits
    stop being the largest part) when the logits are the largest part; optimizer and parameter
    host offload when the state is (each only if it lowers the estimate, and its offloaded bytes
    fit the host's share); remat ``full`` only where it lowers the estimate.
    """
    tiny = model_cfg.name == "tiny"
    smaller = None if tiny else "a smaller model (e.g. model=tiny)"
    if state_alone:
        if on_cpu:  # sharded or not, the k simulated devices together hold at least one whole copy
            return (f"the parameters, gradients and AdamW state alone need {gib(state_min * k)} of host RAM (summed "
                    f"over the {k} simulated devices, however they are sharded), so model={model_cfg.name} cannot fit "
                    f"on this machine" + (f": use {smaller}" if smaller else ""))
        alone = (f"the parameters, gradients and AdamW state alone need {gib(state_min)} per device even sharded over "
                 f"all {n} devices")
        state_fix = _offload_fix(check, reprice, gib) if check is not None and reprice is not None else None
        return alone + ": use " + (f"{state_fix}, or " if state_fix else "") + (f"{smaller} or " if smaller else "") + \
            "more devices"
    opts = []
    parts = _parts(m)
    big = max(parts, key=parts.get)
    if check is not None and reprice is not None:
        if big == "logits" and local_seq:
            tile = _tiling_fix(check, reprice, local_seq, gib)
            if tile:
                opts.append(tile)
        if big == "parameters + gradients + optimizer state" and not on_cpu:
            off = _offload_fix(check, reprice, gib)
            if off:
                opts.append(off)
    if m.state > 1.01 * state_min:
        axes = ",".join(plan.mesh_axis_names)
        alt = "" if plan.name == "ring_cp" else ", or plan=ring_cp"
        opts.append(f"parameters sharded over every device (+plan.params.embed=[{axes}]{alt})")
    if not on_cpu:
        opts.append("more context parallelism (a larger plan.mesh.context: fewer tokens per device)")
    if model_cfg.remat != "full":
        full = _remat_full_fix(model_cfg, check, reprice)
        if full:
            opts.append(full)
    opts.append("a shorter train.seq_len or smaller train.global_batch")
    if smaller:
        opts.append(smaller)
    fixes = "use " + ", or ".join(opts)
    if on_cpu:
        fixes += ("; more simulated devices or more context parallelism do not help here: the devices share this "
                  "machine's RAM, and the sum over them stays the same")
        if tiny:
            fixes += "; model=tiny is the smallest preset: if none of these fit, the step cannot fit on this machine"
    return fixes


def _tiling_fix(check: MemoryCheck, reprice, local_seq: int, gib) -> str | None:
    """``vocabulary tiling (memory.vocab_tiling=N ...)`` with the smallest N > the current one
    that divides ``local_seq`` and makes the step fit; else the smallest at which the logits are
    no longer the largest part; None if no tile count lowers the estimate."""
    cur = check.policy.vocab_tiling
    divs = [d for d in _divisors(local_seq) if d > cur]
    first_not_largest = None
    for d in divs:
        c = reprice(dataclasses.replace(check.policy, vocab_tiling=d))
        if c.fits:
            return _tiling_text(d, local_seq, check, c, gib, fits=True)
        if first_not_largest is None and max(_parts(c.breakdown), key=_parts(c.breakdown).get) != "logits":
            first_not_largest = (d, c)
    if first_not_largest is not None:
        return _tiling_text(*first_not_largest[:1], local_seq, check, first_not_largest[1], gib, fits=False)
    return None


def _tiling_text(d: int, local_seq: int, check: MemoryCheck, c: MemoryCheck, gib, *, fits: bool) -> str:
    return (f"vocabulary tiling (memory.vocab_tiling={d}: the logits in {d} tiles of {local_seq // d:,} tokens, "
            f"{gib(c.breakdown.logits)} instead of {gib(check.breakdown.logits)} per device"
            + ("; then it fits" if fits else "") + ")")


def _offload_fix(check: MemoryCheck, reprice, gib) -> str | None:
    """``memory.offload_optimizer=true`` and/or ``memory.offload_params=true``: those not set yet
    that lower the compared estimate with their host bytes within the host's share (accelerator
    presets only: on cpu the host is the same RAM); None if none does."""
    if check.on_cpu:
        return None
    pol = check.policy
    keys = [f for f in ("offload_optimizer", "offload_params") if not getattr(pol, f)]
    helped = []
    for f in keys:
        c = reprice(dataclasses.replace(pol, **{f: True}))
        if c.need < check.need and not c.over_host:
            helped.append(f)
    if not helped:
        return None
    c = reprice(dataclasses.replace(pol, **{f: True for f in helped}))
    if c.over_host:
        return None
    overrides = " ".join(f"memory.{f}=true" for f in helped)
    return (f"host offload of the {' and '.join(f.split('_')[1].replace('params', 'parameters') for f in helped)} "
            f"({overrides}: {gib(c.need)} instead of {gib(check.need)} per device"
            + ("; then it fits" if c.fits else "") + ")")


def _remat_full_fix(model_cfg: ModelConfig, check: MemoryCheck | None, reprice) -> str | None:
    """``remat (model.remat=full ...)`` when it lowers the estimate (always offered without a
    pricing function); the ``remat_*`` placements are reset, ModelConfig refuses them otherwise."""
    placed = [f"model.{f}={ModelConfig.__dataclass_fields__[f].default}"
              for f in ("remat_layer_input", "remat_context", "remat_qkv")
              if getattr(model_cfg, f) != ModelConfig.__dataclass_fields__[f].default]
    text = "remat (model.remat=full" + "".join(" " + p for p in placed) + " keeps only each block's input)"
    if check is None or reprice is None:
        return text
    c = reprice(dataclasses.replace(check.policy, remat="full", decoder_layer_input="device", context="remat",
                                    qkv="remat"))
    return text if c.need < check.need else None


def _count(n: int) -> str:
    """A parameter count with a unit that leaves digits to read: 8.03B, 443K."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def dry_run_devices(cfg: DictConfig) -> tuple[int, int]:
    """``(devices of the run, devices of this process)`` from the configuration alone, for
    :func:`dry_run`: ``hardware.chips x hardware.devices_per_chip`` on an accelerator preset
    (128 for 64 TPU 7 chips), ``hardware.cpu_devices`` (x ``distributed.num_processes`` with a
    coordinator) on ``hardware=cpu``.

    Raises:
      ValueError: an accelerator preset without ``hardware.chips``; names the override.
    """
    from lcx.conf import positive_int

    hwn = cfg.hardware
    name = str(hwn.get("name"))
    per_chip = positive_int(hwn.get("devices_per_chip") or 1, "hardware.devices_per_chip", "JAX devices per chip")
    if hwn.get("cpu_devices"):
        k = positive_int(hwn.get("cpu_devices"), "hardware.cpu_devices", "simulated CPU devices per process")
        dist = cfg.get("distributed") or {}
        procs = int(dist.get("num_processes") or 1) if dist.get("coordinator_address") else 1
        return k * procs, k
    chips = hwn.get("chips")
    if chips is None:
        raise ValueError(f"train.dry_run=true with hardware={name} needs the slice's size: set hardware.chips=<chips> "
                         f"(each chip is hardware.devices_per_chip={per_chip} JAX device{'s' * (per_chip > 1)})")
    n = positive_int(chips, "hardware.chips", "chips in the slice") * per_chip
    return n, n


def dry_run(cfg: DictConfig, out_dir: str | pathlib.Path | None = None, *, file=None) -> dict[str, Any]:
    """``train.dry_run=true``: validate the run for the device count of its hardware preset and
    check its memory, without any device.

    Resolves the configuration (:func:`resolve` on :func:`dry_run_devices`: the plan, model,
    batch, sequence and ``memory:`` options are validated for ``hardware.chips x
    hardware.devices_per_chip`` devices, or the simulated CPU devices), prints the cost
    ledger's memory anatomy of one step by component (GiB per device, on device or on host)
    and the check against the preset's HBM and host memory, and writes ``dry_run.json`` in
    ``out_dir``. Nothing is compiled and no JAX backend is used, so a TPU 7 slice's run can be
    checked on a CPU machine.

    Returns:
      The JSON-able report: ``n_devices``, ``plan``, ``policy``, ``memory_bytes_per_device``
      (the breakdown), ``host_parts_bytes_per_device``, ``limit_bytes``, ``host_limit_bytes``,
      ``fits``.

    Raises:
      PlanError / ValueError: what :func:`setup` refuses, with the same messages (the memory
        check's after the anatomy is printed).
    """
    out = file or sys.stdout
    n, k = dry_run_devices(cfg)
    # everything but the memory check, whose verdict follows the anatomy it judges
    ctx = resolve(cfg, n, local_devices=k, run_memory_check=False)
    plan, model_cfg, mem, check = ctx["plan"], ctx["model_cfg"], ctx["memory"], ctx["check_memory"]
    chk = memory_check(cfg, model_cfg, plan, n, memory=mem, local_devices=k)
    text, host_parts = memory_anatomy(chk, cfg, model_cfg, plan)
    print(text, file=out, flush=True)
    report = {
        "n_devices": n, "local_devices": k, "plan": plan.to_config(), "policy": dataclasses.asdict(chk.policy),
        "memory_bytes_per_device": chk.breakdown.as_dict(), "host_parts_bytes_per_device": host_parts,
        "limit_bytes": chk.limit, "host_limit_bytes": chk.host_limit, "fits": chk.fits, "memory_checked": check,
    }
    if out_dir is not None:
        p = pathlib.Path(out_dir)
        p.mkdir(parents=True, exist_ok=True)
        (p / "dry_run.json").write_text(json.dumps(report, indent=1, default=str))
    if check:
        check_memory(cfg, model_cfg, plan, n, memory=mem, local_devices=k)  # raises the one-line error
    verdict = ("memory not checked (train.check_memory=false)" if not check
               else "memory not checked: this machine's available RAM cannot be read" if chk.fits is None
               else "the cost ledger says the step fits")
    print(f"dry run: OK: the plan is valid for {n} devices and {verdict}; nothing was compiled and no device "
          f"was used", file=out, flush=True)
    return report


def memory_anatomy(chk: MemoryCheck, cfg: DictConfig, model_cfg: ModelConfig, plan) -> tuple[str, dict[str, int]]:
    """The dry run's text: the run, then the ledger's memory of one step by component.

    Returns:
      ``(text, host parts)``: the parts in host memory in bytes per device (``parameters``,
      ``optimizer``, ``activations``).
    """
    m, pol, hw, n = chk.breakdown, chk.policy, chk.hardware, chk.n_devices
    S, B = int(cfg.train.seq_len), int(cfg.train.global_batch)
    P = plan.context_degree(n)
    T = S // P
    # GiB, or MiB for a step under 1 GiB (the CPU runs), one unit for the whole table
    unit, scale = ("GiB", 2**30) if m.total + m.host >= 2**30 or not chk.on_cpu else ("MiB", 2**20)
    g = lambda b: f"{b / scale:,.2f}"  # noqa: E731
    # the breakdown's host bytes split by what lives there: the float32 master parameters (the
    # size of their gradients), AdamW's two moments per parameter, and the offloaded activations
    p = m.grads
    host_par = p if pol.offload_params else 0
    host_opt = 2 * p if pol.offload_optimizer else 0
    host_act = max(0, m.host - host_par - host_opt)
    placed = []
    if pol.decoder_layer_input == "offload":
        placed.append("block inputs")
    if pol.remat == "custom":
        for name, where in (("attention context (flash output + logsumexp)", pol.context), ("q/k/v", pol.qkv)):
            if where == "offload":
                placed.append(name)
    chips = hw.chips
    where_dev = f"{hw.name} x {chips} chips = {n} devices" if chips and not chk.on_cpu else f"{hw.name}, {n} devices"
    lines = [
        f"dry run: model={model_cfg.name} ({_count(model_cfg.n_params)} parameters) on {where_dev} "
        f"(validated for the count; none initialised)",
        f"  plan: {plan!r}",
        f"  {S:,} tokens x {B} sequence{'s' * (B > 1)}; context degree {P}: {T:,} tokens per device",
        f"  policy: {pol.label} (model.remat={model_cfg.remat}; memory.vocab_tiling={pol.vocab_tiling}"
        + (f": {T // pol.vocab_tiling:,} tokens per tile" if pol.vocab_tiling > 1 else "")
        + f", memory.offload_optimizer={str(pol.offload_optimizer).lower()}, "
        f"memory.offload_params={str(pol.offload_params).lower()})",
        "",
        f"memory anatomy per device (cost ledger; {unit}):",
    ]
    # the transient phases of the step (never live together); the update phase, where the
    # ledger has one, follows the backward when the saved activations are dead
    upd = int(getattr(m, "update", 0) or 0)
    phase = {"block backward": m.layer_working, "attention backward": m.attention, "logits": m.logits,
             "attention forward": m.attention_forward}
    peak = max(phase, key=phase.get)
    if upd > m.activations + m.working:
        peak = "optimizer update"
    rows = []
    # on device: what the breakdown counts there; on host: what the offload options put there
    for name, dev, host, note in (("parameters", m.params, host_par, model_cfg.param_dtype),
                                  ("optimizer state", m.optimizer, host_opt, "AdamW mu, nu")):
        key = "memory.offload_params" if name == "parameters" else "memory.offload_optimizer"
        if dev or not host:
            rows.append((name, "device", dev, note + (f"; {key}: on device during the step" if host else "")))
        if host:
            rows.append((name, "host", host, f"{note}; {key}: pinned_host between steps"))
        if name == "parameters":
            rows.append(("gradients", "device", m.grads, ""))
    rows.append(("saved activations", "device", m.activations, f"remat {pol.remat}, all {model_cfg.n_layers} layers"))
    if host_act:
        rows.append(("saved activations", "host", host_act, "offloaded: " + ", ".join(placed)))
    rows += [
        ("block backward", "device", m.layer_working, "transient: the MLP phase of one block's backward"),
        ("attention backward", "device", m.attention, "transient: one layer's attention backward"),
        ("attention forward", "device", m.attention_forward, "transient: one layer's attention forward"),
        ("logits", "device", m.logits, "transient: the output head + loss backward"
         + (f", one of {pol.vocab_tiling} tiles" if pol.vocab_tiling > 1 else ", untiled")),
    ]
    if upd or pol.offload_optimizer:
        rows.append(("optimizer update", "device", upd, "transient: the offloaded optimizer state's device copy, "
                                                        "after the backward (saved activations dead)"))
    w = max(len(r[0]) for r in rows)
    lines.append(f"  {'component'.ljust(w)}  where  {(unit + '/device').rjust(11)}  note")
    for name, where, b, note in rows:
        mark = " <- peak phase" if name == peak and where == "device" else ""
        lines.append(f"  {name.ljust(w)}  {where.ljust(6)} {g(b).rjust(11)}  {note}{mark}")
    # the device peak as the ledger counts it (MemoryBreakdown.total)
    if peak == "optimizer update":
        lines.append(f"  device peak: state {g(m.state)} + optimizer update {g(upd)} = {g(m.total)} {unit} (the "
                     f"backward phases: {g(m.state + m.activations + m.working)})")
    else:
        lines.append(f"  device peak: state {g(m.state)} + saved activations {g(m.activations)} + largest transient "
                     f"({peak}) {g(m.working)} = {g(m.total)} {unit}")
    lines.append(f"  host: {g(m.host)} {unit} (parameters {g(host_par)}, optimizer {g(host_opt)}, "
                 f"activations {g(host_act)})")
    if chk.on_cpu:
        lim = "unknown" if chk.limit is None else f"{g(chk.limit)} {unit} available ({chk.limit_source})"
        lines.append(f"  against: (device + host) x {chk.local_devices} simulated devices = {g(chk.need)} {unit} of "
                     f"host RAM; {lim} (XLA:CPU strips memory kinds: 'host' is the same RAM)")
    else:
        hbm = "unlimited" if chk.limit is None else f"{g(chk.limit)} GiB"
        lines.append(f"  against: HBM {hbm} per device"
                     + (f" ({100 * m.total / chk.limit:.1f}% used)" if chk.limit else "")
                     + "; host " + ("unlimited" if chk.host_limit is None else
                                    f"{g(chk.host_limit)} GiB per device ({100 * m.host / chk.host_limit:.1f}% used; "
                                    f"hardware.host_memory_per_chip / {hw.devices_per_chip})"))
    return "\n".join(lines), {"parameters": host_par, "optimizer": host_opt, "activations": host_act}


def train(cfg: DictConfig, run_dir: str | pathlib.Path, devices=None) -> dict[str, Any]:
    """Train as configured; write ``metrics.jsonl`` and ``run_info.json`` in ``run_dir``.

    With ``checkpoint.dir`` set, resumes from the newest readable checkpoint there (if any),
    saves every ``checkpoint.every`` steps and at the end, and on SIGTERM/SIGINT saves the
    current step before exiting. A resumed run continues ``metrics.jsonl`` (lines of steps
    after the restored one, written before a crash, are dropped) and reproduces the losses of
    an uninterrupted run exactly: parameters, optimizer state (hence the learning-rate
    schedule), data position, RNG key and step counter all come from the checkpoint.

    Returns:
      Summary dict: ``losses`` (per step run by this call), ``final_loss`` (the last step's loss;
      None when this call trained no step: the checkpoint already reached ``train.steps``),
      ``val_loss`` (last; the checkpoint's when no step was trained), ``params`` (final
      parameters, for tests), ``static``, ``run_dir``, ``compile_s``, ``start_step`` (steps
      already done when this call began: 0, or the restored step).

    Raises:
      PlanError / ValueError: an invalid configuration, before anything compiles.
      CheckpointMismatchError: the checkpoint was written for another model config (names the
        field).
      NoUsableCheckpointError: checkpoints exist but none can be read.
      FloatingPointError: a non-finite loss (names the step and the non-finite tensors); no
        checkpoint of that state is written.
      SystemExit: after SIGTERM/SIGINT, with code 128 + signal number, once the final
        checkpoint is on disk.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = cfg.train
    total_steps = int(t.steps)
    ckpt_cfg = checkpoint_config(cfg.get("checkpoint"))
    ctx = setup(cfg, devices)
    mp: MeshPlan = ctx["plan"]
    model_cfg = ctx["model_cfg"]
    devices = ctx["devices"]
    memory: MemoryOptions = ctx["memory"]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    data = make_data(
        cfg.data,
        seq_len=int(t.seq_len),
        global_batch=int(t.global_batch),
        layout=mp.plan.attention.layout,
        context_degree=mp.context_degree,
        seed=int(t.seed),
    )
    hw = hardware_from_config(cfg.hardware, len(devices))
    flops = training_flops(model_cfg, int(t.seq_len), int(t.global_batch), window=model_cfg.sliding_window)

    key = jax.random.key(int(t.seed))
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=key)
    p_shard = model_shardings(abstract, mp)
    abstract_params, static = eqx.partition(abstract, is_arraylike)
    optimizer, schedule = optimizer_from_config(t)
    # where parameters and optimizer state live between steps: pinned_host when offloaded
    steps = make_steps(abstract, optimizer, mp, p_shard, memory)

    # The training RNG stream. The step draws no randomness today (no dropout); the key is
    # carried through checkpoints so that a stochastic step would resume exactly too.
    rng = jax.random.fold_in(key, 1)
    start = 0
    ckpts = Checkpoints(ckpt_cfg.dir, keep=ckpt_cfg.keep, async_save=ckpt_cfg.async_save) if ckpt_cfg.enabled else None
    restored = None
    if ckpts is not None:
        restored = ckpts.restore_latest(
            lambda: abstract_train_state(abstract_params, steps.param_shardings, optimizer, mp.replicated(),
                                         opt_shardings=steps.opt_shardings),
            check=lambda meta, where: check_compatible(meta, resolved["model"], where=where),
        )
    if restored is not None:
        params, opt_state = restored.state["params"], restored.state["opt_state"]
        _restore_data(data.train, restored.meta["data"])
        rng = key_from_json(restored.meta["rng"])
        start = int(restored.meta["step"])
        log.info("resumed from %s at step %d", ckpts.directory / str(start), start)
    else:
        params = jax.jit(lambda k: eqx.filter(init_model(model_cfg, key=k), eqx.is_array),
                         out_shardings=steps.param_shardings)(key)
        opt_state = None
    if opt_state is None:
        opt_state = init_opt_state(optimizer, params, steps.opt_shardings)

    info = run_info(devices)
    info["config"] = resolved
    info["plan"] = repr(mp.plan)
    info["mesh"] = dict(mp.mesh.shape)
    info["peak_flops_per_device"] = hw.peak_flops_per_device
    info["model_flops_per_step"] = flops.total
    info["checkpoint_dir"] = str(ckpt_cfg.dir) if ckpt_cfg.enabled else None
    info["resumed_from_step"] = start if restored is not None else None
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))
    metrics_path = run_dir / "metrics.jsonl"
    _truncate_metrics(metrics_path, start)

    def meta(step: int, loss: float | None, val: float | None) -> dict[str, Any]:
        return {
            "step": step,
            "data": data.train.state(),
            "rng": key_to_json(rng),
            "loss": finite_or_none(loss),
            "val_loss": finite_or_none(val),
            "plan": repr(mp.plan),
            "mesh": {k: int(v) for k, v in mp.mesh.shape.items()},
            "config": resolved,
        }

    losses: list[float] = []
    val_loss = restored.meta.get("val_loss") if restored is not None else None
    compile_s = None
    if start >= total_steps:
        # no step runs, so no loss is computed: the checkpoint's last loss is not this run's
        log.info("checkpoint at step %d already reached train.steps=%d; nothing to train", start, total_steps)
        if ckpts is not None:
            ckpts.close()
        return {
            "losses": losses,
            "final_loss": None,
            "val_loss": val_loss,
            "params": params,
            "static": static,
            "run_dir": str(run_dir),
            "compile_s": compile_s,
            "start_step": start,
        }

    batch = put_batch(next(data.train), steps.batch_sharding)
    t0 = time.perf_counter()
    train_c = steps.train.lower(params, opt_state, batch).compile()
    compile_s = time.perf_counter() - t0
    mem = train_c.memory_analysis()
    temp_bytes = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None

    tokens_per_step = int(t.seq_len) * int(t.global_batch)
    peak_total = hw.peak_flops_per_device * len(devices)
    log_every = max(1, int(t.log_every))
    eval_every = int(t.eval_every)
    saved_step = start if restored is not None else None
    with contextlib.ExitStack() as stack:
        if ckpts is not None:
            stack.callback(ckpts.close)  # an exception still lets an in-flight (good) save finish
        stop = stack.enter_context(_StopSignals(enabled=ckpts is not None))
        mf = stack.enter_context(metrics_path.open("a"))
        bar = stack.enter_context(
            tqdm(total=total_steps, initial=start, desc=f"train[{mp.plan.name}]", unit="step")
        )
        for step in range(start + 1, total_steps + 1):
            ts = time.perf_counter()
            params, opt_state, m = train_c(params, opt_state, batch)  # dispatched asynchronously
            # Host work overlaps the step on the devices: fetch the next batch while it runs.
            if step < total_steps:
                batch = put_batch(next(data.train), steps.batch_sharding)
            loss = float(m["loss"])  # blocks: the step time below is the whole step
            dt = time.perf_counter() - ts
            grad_norm = float(m["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                # A non-finite gradient poisons the update even when the loss is still finite;
                # both scalars are on the host already, so this check costs nothing per step.
                raise FloatingPointError(_nonfinite_report(step, loss, grad_norm, params, opt_state, ckpts, saved_step))
            losses.append(loss)
            rec = {
                "step": step,
                "loss": loss,
                "tokens_per_sec": tokens_per_step / dt,
                "mfu": flops.total / dt / peak_total,
                "step_time_s": dt,
                "lr": float(schedule(step - 1)),
                "grad_norm": grad_norm,
                "valid_tokens": float(m["tokens"]),
            }
            if step == start + 1:
                rec["compile_s"] = compile_s
                rec["temp_bytes_per_device"] = temp_bytes
                if restored is not None:
                    rec["resumed_from"] = start
            if eval_every > 0 and (step % eval_every == 0 or step == total_steps):
                val_loss = evaluate(steps, params, data.val_batches(int(t.eval_batches)))
                rec["val_loss"] = val_loss
            if step % log_every == 0 or "val_loss" in rec or step == total_steps:
                mf.write(json.dumps(rec) + "\n")
                mf.flush()
            post = {"loss": f"{loss:.3f}", "tok/s": f"{rec['tokens_per_sec']:.0f}"}
            if val_loss is not None:
                post["val"] = f"{val_loss:.3f}"
            bar.set_postfix(post)
            bar.update(1)
            if ckpts is not None and (ckpt_cfg.due(step) or step == total_steps or stop.signum):
                # the data position must be the one after this step's batch, not the prefetched one
                state = meta(step, loss, val_loss)
                state["data"] = _rewind(data.train, 1 if step < total_steps else 0)
                ckpts.save(step, params, opt_state, state)
                saved_step = step
            if stop.signum:
                ckpts.wait()
                name = signal.Signals(stop.signum).name
                msg = f"{name}: checkpoint of step {step} saved in {ckpts.directory}; exiting"
                log.warning(msg)
                print(msg, file=sys.stderr, flush=True)
                raise SystemExit(128 + stop.signum)
    return {
        "losses": losses,
        "final_loss": losses[-1],
        "val_loss": val_loss,
        "params": params,
        "static": static,
        "run_dir": str(run_dir),
        "compile_s": compile_s,
        "start_step": start,
    }


def _nonfinite_report(step, loss, grad_norm, params, opt_state, ckpts, saved_step) -> str:
    """The diagnostic of a non-finite step: which scalars, which tensors, what was kept."""
    bad = nonfinite_leaves({"params": params, "opt_state": opt_state})
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    msg = f"non-finite {what} at step {step} (loss={loss}, grad_norm={grad_norm}); "
    if bad:
        msg += f"non-finite tensors after the update: {', '.join(bad[:8])}"
        msg += f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    else:
        msg += "parameters and optimizer state are still finite (the forward pass overflowed)"
    if ckpts is not None:
        msg += (
            f". Step {step} was not checkpointed; the last checkpoint is step {saved_step} in {ckpts.directory}"
            if saved_step is not None
            else f". Nothing was checkpointed in {ckpts.directory}"
        )
    return msg + ". Lower train.lr, lengthen train.warmup_steps or check the data"


def _restore_data(batches, state: dict[str, Any]) -> None:
    """``batches.restore(state)``, or, when the checkpoint was written at another sequence length
    (the previous stage of a length-extension schedule, :mod:`lcx.training.schedule`), continue
    in the same epoch at the same fraction of its tokens (to within one row)."""
    old_len = state.get("seq_len")
    if old_len is None or int(old_len) == batches.seq_len:
        batches.restore(state)
        return
    if "num_tokens" not in state:
        # a generated stream (data=passkey): rows are drawn from (seed, row index) at whatever
        # length the stage asks for, so it simply continues at the next row
        log.info("sequence length %s -> %d: generated data continues at row %s", old_len, batches.seq_len,
                 state.get("row"))
        batches.restore({**state, "seq_len": batches.seq_len})
        return
    fraction = min(1.0, int(state["row"]) * int(old_len) / max(1, int(state["num_tokens"])))
    row = min(batches.rows_per_epoch - 1, int(fraction * batches.rows_per_epoch))
    log.info("sequence length %s -> %d: data continues at row %d of epoch %s", old_len, batches.seq_len, row,
             state["epoch"])
    batches.restore({**state, "seq_len": batches.seq_len, "num_tokens": batches.num_tokens, "row": row})


def _rewind(batches, n: int) -> dict[str, int]:
    """``batches.state()`` as it was ``n`` batches ago (the iterator only moves forward)."""
    st = batches.state()
    row = st["epoch"] * batches.rows_per_epoch + st["row"] - n * batches.global_batch
    return dict(st, epoch=row // batches.rows_per_epoch, row=row % batches.rows_per_epoch)


def _truncate_metrics(path: pathlib.Path, step: int) -> None:
    """Keep the lines of ``metrics.jsonl`` for steps ``<= step`` (a resumed run re-does the steps
    after its checkpoint; their first, lost attempt must not appear twice). Atomic rename, so a
    crash here leaves the old file or the new one, never half of one."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by a crash: everything after it is untrustworthy
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


class _StopSignals:
    """While active, SIGTERM and SIGINT only set ``signum``; the loop saves and exits at the end
    of the current step. A second signal restores the previous action and re-raises it, so a
    stuck save can still be interrupted. With ``enabled=False`` (no checkpointing) or outside
    the main thread (where Python forbids signal handlers) this does nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        print(
            f"{signal.Signals(signum).name} received: saving a checkpoint after this step "
            "(send it again to exit without saving)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False


def evaluate(steps, params, batches) -> float:
    """Validation loss in nats/token: global sum over all batches / global valid-token count."""
    total, count = 0.0, 0.0
    for b in batches:
        s, c = steps.evaluate(params, put_batch(b, steps.batch_sharding))
        total += float(s)
        count += float(c)
    if count == 0:
        raise ValueError("validation set has no valid tokens; raise data.val_fraction")
    return total / count

