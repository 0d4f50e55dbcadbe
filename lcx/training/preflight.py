"""Everything checked before a run compiles: the configuration resolved and validated from a
device count (:func:`resolve`, :func:`setup`), and ``train.dry_run=true`` (:func:`dry_run`), which
does that for hardware this machine does not have and prints the cost ledger's memory anatomy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import sys
from typing import Any

import jax
from omegaconf import DictConfig, OmegaConf

from lcx.models import ModelConfig
from lcx.sharding import MeshPlan, Plan, bind
from lcx.sharding.config import plan_from_config
from lcx.training.memcheck import MemoryCheck, check_memory, format_count, largest, memory_check
from lcx.training.memory import MemoryOptions

log = logging.getLogger("lcx.training.loop")


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What :func:`resolve` checked, from the configuration alone.

    Attributes:
      plan: the unbound plan.
      model_cfg: the model configuration.
      memory: the ``memory:`` section's options.
      n_devices: JAX devices of the run (all processes together).
      check_memory: ``train.check_memory``.
    """

    plan: Plan
    model_cfg: ModelConfig
    memory: MemoryOptions
    n_devices: int
    check_memory: bool


@dataclasses.dataclass(frozen=True)
class Setup:
    """What :func:`setup` resolved for the devices of a run.

    Attributes:
      plan: the plan bound to ``devices``.
      model_cfg: the model configuration.
      devices: the devices the mesh is built on (``jax.Device``).
      memory: the ``memory:`` section's options.
    """

    plan: MeshPlan
    model_cfg: ModelConfig
    devices: list[Any]
    memory: MemoryOptions


def setup(cfg: DictConfig, devices=None) -> Setup:
    """Resolve and validate everything a run needs, before compiling anything.

    :func:`resolve` on the device count, then the plan bound to ``devices``.

    Raises:
      PlanError / ValueError: an invalid plan, model, batch or sequence configuration, with a
        message that names the value and the fix.
    """
    devices = list(jax.devices() if devices is None else devices)
    me = jax.process_index()
    local = sum(1 for d in devices if getattr(d, "process_index", 0) == me) or len(devices)
    r = resolve(cfg, len(devices), local_devices=local)
    return Setup(plan=bind(r.plan, devices), model_cfg=r.model_cfg, devices=devices, memory=r.memory)


def resolve(
    cfg: DictConfig, n_devices: int, *, local_devices: int | None = None, run_memory_check: bool = True
) -> Resolved:
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

    Raises:
      PlanError / ValueError: as :func:`setup`.
    """
    from lcx.config import boolean, positive_int
    from lcx.config.schema import check_train_config

    check_train_config(cfg)  # every key known and typed (also `+` ones), before anything else
    # whole numbers, never truncated: train.seq_len=512.5 is an error, not 512 tokens
    positive_int(cfg.train.seq_len, "train.seq_len", "tokens per sequence")
    positive_int(cfg.train.global_batch, "train.global_batch", "sequences per step")
    positive_int(cfg.train.steps, "train.steps", "optimizer steps")
    check = boolean(cfg.train.check_memory, "train.check_memory", "refuse a step the cost ledger says exceeds memory")
    plan = plan_from_config(cfg.plan, hardware=cfg.hardware)
    model_cfg = ModelConfig.from_dict(_mapping(OmegaConf.to_container(cfg.model, resolve=True), "model"))
    plan.validate(
        n_devices, dims=model_cfg.dims(), seq_len=int(cfg.train.seq_len), global_batch=int(cfg.train.global_batch)
    )
    memory = MemoryOptions.from_config(cfg.get("memory"))
    P = plan.context_degree(n_devices)
    memory.check_tiling(int(cfg.train.seq_len) // P, seq_len=int(cfg.train.seq_len), context_degree=P)
    if check and run_memory_check:
        check_memory(cfg, model_cfg, plan, n_devices, memory=memory, local_devices=local_devices)
    return Resolved(plan=plan, model_cfg=model_cfg, memory=memory, n_devices=n_devices, check_memory=check)


def _mapping(node: Any, key: str) -> dict[str, Any]:
    """``node`` (an OmegaConf container converted to plain values) as a dict.

    Raises:
      ValueError: the ``key`` section is not a mapping (a YAML list or a scalar).
    """
    if not isinstance(node, dict):
        raise ValueError(f"the {key} section must be a mapping of its fields, got {node!r}")
    return node


def dry_run_devices(cfg: DictConfig) -> tuple[int, int]:
    """``(devices of the run, devices of this process)`` from the configuration alone, for
    :func:`dry_run`: ``hardware.chips x hardware.devices_per_chip`` on an accelerator preset
    (128 for 64 TPU 7 chips), ``hardware.cpu_devices`` (x ``distributed.num_processes`` with a
    coordinator) on ``hardware=cpu``.

    Raises:
      ValueError: an accelerator preset without ``hardware.chips``; names the override.
    """
    from lcx.config import positive_int
    from lcx.config.schema import check_train_config

    check_train_config(cfg)
    hwn = cfg.hardware
    name = str(hwn.get("name"))
    per_chip = positive_int(hwn.get("devices_per_chip") or 1, "hardware.devices_per_chip", "JAX devices per chip")
    if hwn.get("cpu_devices"):
        k = positive_int(hwn.get("cpu_devices"), "hardware.cpu_devices", "simulated CPU devices per process")
        dist = cfg.distributed
        procs = int(dist.num_processes) if dist.coordinator_address else 1
        return k * procs, k
    chips = hwn.get("chips")
    if chips is None:
        raise ValueError(
            f"train.dry_run=true with hardware={name} needs the slice's size: set hardware.chips=<chips> "
            f"(each chip is hardware.devices_per_chip={per_chip} JAX device{'s' * (per_chip > 1)})"
        )
    n = positive_int(chips, "hardware.chips", "chips in the slice") * per_chip
    return n, n


@dataclasses.dataclass(frozen=True)
class DryRunReport:
    """What :func:`dry_run` found; ``dry_run.json`` holds its fields.

    Attributes:
      n_devices, local_devices: devices of the run, and of this process.
      plan: the plan as its ``plan`` config (:meth:`lcx.sharding.Plan.to_config`).
      policy: the :class:`lcx.cost.ActivationPolicy` priced, as a dict.
      memory_bytes_per_device: the ledger's breakdown (:meth:`lcx.cost.MemoryBreakdown.as_dict`).
      host_parts_bytes_per_device: ``parameters``, ``optimizer``, ``activations`` in host memory.
      limit_bytes, host_limit_bytes: what the check compared with (None: unknown).
      fits: the ledger's verdict (None: this machine's RAM cannot be read).
      memory_checked: ``train.check_memory``.
    """

    n_devices: int
    local_devices: int
    plan: dict[str, Any]
    policy: dict[str, Any]
    memory_bytes_per_device: dict[str, int]
    host_parts_bytes_per_device: dict[str, int]
    limit_bytes: float | None
    host_limit_bytes: float | None
    fits: bool | None
    memory_checked: bool


def dry_run(cfg: DictConfig, out_dir: str | pathlib.Path | None = None, *, file=None) -> DryRunReport:
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
      The :class:`DryRunReport`.

    Raises:
      PlanError / ValueError: what :func:`setup` refuses, with the same messages (the memory
        check's after the anatomy is printed).
    """
    out = file or sys.stdout
    n, k = dry_run_devices(cfg)
    # everything but the memory check, whose verdict follows the anatomy it judges
    r = resolve(cfg, n, local_devices=k, run_memory_check=False)
    plan, model_cfg, mem, check = r.plan, r.model_cfg, r.memory, r.check_memory
    chk = memory_check(cfg, model_cfg, plan, n, memory=mem, local_devices=k)
    text, host_parts = memory_anatomy(chk, cfg, model_cfg, plan)
    print(text, file=out, flush=True)
    report = DryRunReport(
        n_devices=n,
        local_devices=k,
        plan=plan.to_config(),
        policy=dataclasses.asdict(chk.policy),
        memory_bytes_per_device=chk.breakdown.as_dict(),
        host_parts_bytes_per_device=host_parts,
        limit_bytes=chk.limit,
        host_limit_bytes=chk.host_limit,
        fits=chk.fits,
        memory_checked=check,
    )
    if out_dir is not None:
        p = pathlib.Path(out_dir)
        p.mkdir(parents=True, exist_ok=True)
        (p / "dry_run.json").write_text(json.dumps(dataclasses.asdict(report), indent=1, default=str))
    if check:
        check_memory(cfg, model_cfg, plan, n, memory=mem, local_devices=k)  # raises the one-line error
    verdict = (
        "memory not checked (train.check_memory=false)"
        if not check
        else "memory not checked: this machine's available RAM cannot be read"
        if chk.fits is None
        else "the cost ledger says the step fits"
    )
    print(
        f"dry run: OK: the plan is valid for {n} devices and {verdict}; nothing was compiled and no device was used",
        file=out,
        flush=True,
    )
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
        f"dry run: model={model_cfg.name} ({format_count(model_cfg.n_params)} parameters) on {where_dev} "
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
    phase = {
        "block backward": m.layer_working,
        "attention backward": m.attention,
        "logits": m.logits,
        "attention forward": m.attention_forward,
    }
    peak = largest(phase)
    if upd > m.activations + m.working:
        peak = "optimizer update"
    rows = []
    # on device: what the breakdown counts there; on host: what the offload options put there
    for name, dev, host, note in (
        ("parameters", m.params, host_par, model_cfg.param_dtype),
        ("optimizer state", m.optimizer, host_opt, "AdamW mu, nu"),
    ):
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
        (
            "logits",
            "device",
            m.logits,
            "transient: the output head + loss backward"
            + (f", one of {pol.vocab_tiling} tiles" if pol.vocab_tiling > 1 else ", untiled"),
        ),
    ]
    if upd or pol.offload_optimizer:
        rows.append(
            (
                "optimizer update",
                "device",
                upd,
                "transient: the offloaded optimizer state's device copy, after the backward (saved activations dead)",
            )
        )
    w = max(len(r[0]) for r in rows)
    lines.append(f"  {'component'.ljust(w)}  where  {(unit + '/device').rjust(11)}  note")
    for name, where, b, note in rows:
        mark = " <- peak phase" if name == peak and where == "device" else ""
        lines.append(f"  {name.ljust(w)}  {where.ljust(6)} {g(b).rjust(11)}  {note}{mark}")
    # the device peak as the ledger counts it (MemoryBreakdown.total)
    if peak == "optimizer update":
        lines.append(
            f"  device peak: state {g(m.state)} + optimizer update {g(upd)} = {g(m.total)} {unit} (the "
            f"backward phases: {g(m.state + m.activations + m.working)})"
        )
    else:
        lines.append(
            f"  device peak: state {g(m.state)} + saved activations {g(m.activations)} + largest transient "
            f"({peak}) {g(m.working)} = {g(m.total)} {unit}"
        )
    lines.append(
        f"  host: {g(m.host)} {unit} (parameters {g(host_par)}, optimizer {g(host_opt)}, activations {g(host_act)})"
    )
    if chk.on_cpu:
        lim = "unknown" if chk.limit is None else f"{g(chk.limit)} {unit} available ({chk.limit_source})"
        lines.append(
            f"  against: (device + host) x {chk.local_devices} simulated devices = {g(chk.need)} {unit} of "
            f"host RAM; {lim} (XLA:CPU strips memory kinds: 'host' is the same RAM)"
        )
    else:
        hbm = "unlimited" if chk.limit is None else f"{g(chk.limit)} GiB"
        lines.append(
            f"  against: HBM {hbm} per device"
            + (f" ({100 * m.total / chk.limit:.1f}% used)" if chk.limit else "")
            + "; host "
            + (
                "unlimited"
                if chk.host_limit is None
                else f"{g(chk.host_limit)} GiB per device ({100 * m.host / chk.host_limit:.1f}% used; "
                f"hardware.host_memory_per_chip / {hw.devices_per_chip})"
            )
        )
    return "\n".join(lines), {"parameters": host_par, "optimizer": host_opt, "activations": host_act}
