"""Hardware presets (the ``hardware=`` Hydra group): peak FLOP/s, memory, interconnect, flags.

Every number in ``conf/hardware/*.yaml`` carries its public source in a comment. On CPU the
peak is not a datasheet number: it is measured once by a float32 matmul probe
(:func:`lcx.cost.probes.cpu_peak_flops`) and cached in ``~/.cache/lcx/cpu_peak.json``
(``LCX_CACHE`` overrides the folder); the simulated CPU devices share the host's cores, so the
per-device peak is the host peak divided by the device count.

A preset also carries the XLA/libtpu flags a run on that hardware needs (asynchronous
collective-permute and all-gather, compute/communication overlap, scoped VMEM);
:func:`apply_hardware_flags` puts them into ``LIBTPU_INIT_ARGS`` / ``XLA_FLAGS`` before JAX
starts.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from lcx.cost.probes import cpu_peak_flops, cpu_probes
from lcx.cost.timing import TimeModel, time_model_from_config


@dataclasses.dataclass(frozen=True)
class Hardware:
    """One accelerator type, per JAX device unless the name says chip.

    Attributes:
      name: preset name (``tpu_v5p``, ``tpu7``, ``cpu``).
      peak_flops_per_device: peak FLOP/s of one JAX device in the compute dtype (bf16 on TPU).
      hbm_bytes: device memory of one JAX device in bytes (None: not meaningful, e.g. CPU).
      devices_per_chip: JAX devices per chip (1 on v5p megacore, 2 TensorCores on TPU7).
      hbm_bandwidth_per_chip: HBM bytes/s per chip (None if unknown).
      ici_bandwidth_per_chip: bidirectional inter-chip interconnect bytes/s per chip, all links.
      ici_links_per_chip: ICI links per chip (6 in a 3D torus).
      host_memory_per_chip: host RAM in bytes per chip (VM RAM / chips per VM); None: unlimited.
      host_bandwidth_per_chip: one-way host <-> chip bytes/s (the chip's PCIe link), which host
        offload moves its bytes over; None: unknown, host transfers are not priced.
      chips: chips in the slice, or None (use the device count).
      torus_cube: the slice's ICI torus is built of cubes of this many chips a side (4 on v5p and
        TPU7; :func:`lcx.cost.topology.slice_topology`); None: no torus (CPU).
      topology: the slice's torus shape in chips (e.g. ``(4, 4, 8)``); None: the standard shape
        for the chip count.
      libtpu_init_args: flags for ``LIBTPU_INIT_ARGS`` (TPU runtime).
      xla_flags: flags for ``XLA_FLAGS``.
      time_model: the preset's achieved rates (:class:`~lcx.cost.timing.TimeModel`; None: the
        roofline only).
    """

    name: str
    peak_flops_per_device: float
    hbm_bytes: float | None = None
    devices_per_chip: int = 1
    hbm_bandwidth_per_chip: float | None = None
    ici_bandwidth_per_chip: float | None = None
    ici_links_per_chip: int = 6
    host_memory_per_chip: float | None = None
    host_bandwidth_per_chip: float | None = None
    chips: int | None = None
    torus_cube: int | None = None
    topology: tuple[int, ...] | None = None
    libtpu_init_args: tuple[str, ...] = ()
    xla_flags: tuple[str, ...] = ()
    time_model: TimeModel | None = None

    def __post_init__(self):
        if self.peak_flops_per_device <= 0:
            raise ValueError(
                f"hardware.peak_flops_per_device must be positive FLOP/s, got {self.peak_flops_per_device}"
            )
        if self.devices_per_chip < 1 or self.ici_links_per_chip < 1:
            raise ValueError(
                f"hardware.devices_per_chip ({self.devices_per_chip}) and ici_links_per_chip "
                f"({self.ici_links_per_chip}) must be >= 1"
            )
        if self.host_bandwidth_per_chip is not None and self.host_bandwidth_per_chip <= 0:
            raise ValueError(
                f"hardware.host_bandwidth_per_chip must be positive bytes/s, got {self.host_bandwidth_per_chip} "
                "(null: unknown, host transfers are not priced)"
            )
        if self.torus_cube is not None and self.torus_cube < 1:
            raise ValueError(f"hardware.torus_cube={self.torus_cube} must be a positive chip count or null")
        if self.topology is not None:
            object.__setattr__(self, "topology", tuple(int(d) for d in self.topology))
            if not self.topology or min(self.topology) < 1:
                raise ValueError(
                    f"hardware.topology={list(self.topology)} must list positive chip counts per torus axis "
                    "(e.g. [4, 4, 8]) or be null"
                )
        object.__setattr__(self, "libtpu_init_args", tuple(self.libtpu_init_args))
        object.__setattr__(self, "xla_flags", tuple(self.xla_flags))

    @property
    def link_bandwidth(self) -> float | None:
        """One-way bytes/s of ONE ICI link: ``bidirectional per chip / 2 / links``. A ring hop
        sends to one neighbour over one link."""
        if self.ici_bandwidth_per_chip is None:
            return None
        return self.ici_bandwidth_per_chip / 2 / self.ici_links_per_chip

    @property
    def p2p_bandwidth_per_device(self) -> float | None:
        """One-way bytes/s a device gets for a ring hop (one link, shared by the chip's devices)."""
        lb = self.link_bandwidth
        return None if lb is None else lb / self.devices_per_chip

    @property
    def collective_bandwidth_per_device(self) -> float | None:
        """One-way bytes/s a device gets in a collective that uses every link (all-gather,
        all-to-all, reduce-scatter over a torus): ``bidirectional per chip / 2 / devices``."""
        if self.ici_bandwidth_per_chip is None:
            return None
        return self.ici_bandwidth_per_chip / 2 / self.devices_per_chip

    @property
    def host_memory_per_device(self) -> float | None:
        return None if self.host_memory_per_chip is None else self.host_memory_per_chip / self.devices_per_chip

    @property
    def host_bandwidth_per_device(self) -> float | None:
        """One-way host <-> device bytes/s: the chip's PCIe link shared by its devices (None:
        unknown)."""
        return None if self.host_bandwidth_per_chip is None else self.host_bandwidth_per_chip / self.devices_per_chip

    def physical_mesh(self, n_devices: int) -> tuple[int, ...] | None:
        """The torus axes ``n_devices`` devices sit on (chips' torus shape, then the on-chip axis
        where a chip holds several devices); None: no torus known (no ``torus_cube``, or a
        sub-cube slice).

        Raises:
          ValueError: ``topology`` does not hold ``n_devices / devices_per_chip`` chips.
        """
        from lcx.cost.topology import slice_topology

        chips = n_devices // self.devices_per_chip
        shape = self.topology
        if shape is not None and math.prod(shape) != chips:
            raise ValueError(
                f"hardware.topology={list(shape)} holds {math.prod(shape)} chips, but the step uses {chips} "
                f"({n_devices} devices / {self.devices_per_chip} per chip); set hardware.topology to the slice's "
                "shape, or null for the standard one"
            )
        if shape is None and self.torus_cube is not None:
            shape = slice_topology(chips, self.torus_cube)
        if shape is None:
            return None
        return (*shape, self.devices_per_chip) if self.devices_per_chip > 1 else tuple(shape)

    def n_devices(self, chips: int | None = None) -> int | None:
        """Devices for ``chips`` chips (default: :attr:`chips`); None if neither is known."""
        c = self.chips if chips is None else chips
        return None if c is None else int(c) * self.devices_per_chip


def host_memory_available() -> tuple[int, str] | None:
    """Bytes of host RAM a new allocation can use now, and where the number comes from.

    ``MemAvailable`` of ``/proc/meminfo`` (free memory plus what the kernel can reclaim), capped
    by the cgroup's limit less its usage when the process runs in a memory-limited container
    (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``); ``os.sysconf`` available pages
    where ``/proc`` is missing. None when none of these can be read.
    """
    avail: tuple[int, str] | None = None
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = (int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo")
                break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "os.sysconf available pages")
        except (OSError, ValueError, AttributeError):
            pass
    cg = pathlib.Path("/sys/fs/cgroup")
    for limit, usage in (
        ("memory.max", "memory.current"),
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
    ):
        try:
            lim = (cg / limit).read_text().strip()
            if lim == "max" or int(lim) >= 1 << 60:  # no limit (v1 writes a huge number)
                break
            left = int(lim) - int((cg / usage).read_text().strip())
        except (OSError, ValueError):
            continue
        if avail is None or left < avail[0]:
            avail = (max(0, left), f"the container's memory limit ({cg / limit}) less its usage")
        break
    return avail


def _get(node: Any, key: str, default: Any = None) -> Any:
    if isinstance(node, Mapping) or hasattr(node, "get"):
        v = node.get(key, default)
        return default if v is None else v
    return getattr(node, key, default)


def _flags(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return tuple(v.split())
    return tuple(str(x) for x in v)


def hardware_from_config(
    node: Any, n_devices: int | None = None, *, probe: bool = True, probe_time_model: bool = False
) -> Hardware:
    """Build :class:`Hardware` from the Hydra ``hardware`` node.

    Args:
      node: the ``hardware`` config node (or a mapping) with the keys of the preset YAMLs.
      n_devices: devices the run uses; divides the probed CPU peak among simulated devices.
      probe: on ``cpu`` with ``peak_flops_per_device: null``, measure the host (cached). If
        False, a placeholder of 1e9 FLOP/s per device is used (planner on a TPU preset never
        needs it).
      probe_time_model: also run the cpu preset's time-model probes (``time_model: {probe:
        true}``, :mod:`lcx.cost.probes`; cached, about 25 s once per machine) -- the planner and
        ``experiments/step_time_cpu.py`` ask for them; training never does (it needs only the
        peak, for MFU). False: a probed time model is left out (None).

    Raises:
      ValueError: a non-CPU preset without ``peak_flops_per_device``.
    """
    name = str(_get(node, "name", "custom"))
    peak = _get(node, "peak_flops_per_device")
    if peak is None:
        if name != "cpu":
            raise ValueError(f"hardware preset {name!r} needs peak_flops_per_device (FLOP/s per device)")
        devs = n_devices or int(_get(node, "cpu_devices", 1) or 1)
        peak = (cpu_peak_flops() if probe else 1e9 * devs) / devs
    hbm = _get(node, "hbm_bytes")
    chips = _get(node, "chips")
    tm, ici = _time_model(node, name, n_devices, probe and probe_time_model)
    return Hardware(
        name=name,
        peak_flops_per_device=float(peak),
        hbm_bytes=None if hbm is None else float(hbm),
        devices_per_chip=int(_get(node, "devices_per_chip", 1)),
        hbm_bandwidth_per_chip=_float_or_none(_get(node, "hbm_bandwidth_per_chip")),
        ici_bandwidth_per_chip=ici,
        ici_links_per_chip=int(_get(node, "ici_links_per_chip", 6)),
        host_memory_per_chip=_float_or_none(_get(node, "host_memory_per_chip")),
        host_bandwidth_per_chip=_float_or_none(_get(node, "host_bandwidth_per_chip")),
        chips=None if chips is None else int(chips),
        torus_cube=None if _get(node, "torus_cube") is None else int(_get(node, "torus_cube")),
        topology=None if _get(node, "topology") is None else tuple(int(d) for d in _get(node, "topology")),
        libtpu_init_args=_flags(_get(node, "libtpu_init_args")),
        xla_flags=_flags(_get(node, "xla_flags")),
        time_model=tm,
    )


def _time_model(node: Any, name: str, n_devices: int | None, probe: bool) -> tuple[TimeModel | None, float | None]:
    """The preset's time model and ``ici_bandwidth_per_chip``. A ``cpu`` preset whose
    ``time_model`` says ``probe: true`` takes both from :func:`lcx.cost.probes.cpu_probes` (its
    other ``time_model`` keys override the probed values; ``ici_bandwidth_per_chip`` set in the
    preset wins), or has none with ``probe=False`` (nothing is measured)."""
    ici = _float_or_none(_get(node, "ici_bandwidth_per_chip"))
    tm_node = _get(node, "time_model")
    keys = dict(tm_node.items()) if tm_node is not None and hasattr(tm_node, "items") else None
    if keys is None or not keys.pop("probe", False):
        return time_model_from_config(tm_node if keys is None else keys), ici
    if name != "cpu":
        raise ValueError(f"hardware preset {name!r}: time_model.probe measures this machine; only the cpu preset can")
    if not probe:
        return None, ici
    p = cpu_probes(n_devices or int(_get(node, "cpu_devices", 1) or 1))
    over = time_model_from_config(keys) if keys else None
    tm = p.time_model(**{k: getattr(over, k) for k in keys}) if over is not None else p.time_model()
    # one link per simulated device (ici_links_per_chip 1): per device one way = bidirectional / 2
    return tm, ici if ici is not None else 2.0 * p.bandwidth_per_device


def _float_or_none(v) -> float | None:
    return None if v is None else float(v)


def apply_hardware_flags(node: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put the preset's runtime flags into ``LIBTPU_INIT_ARGS`` and ``XLA_FLAGS``.

    Call before JAX initialises its backend (before the first array op or ``jax.devices()``):
    libtpu and XLA read these variables once, at start-up. Flags already present in the
    environment win (a flag whose name is already set is not added again), so a user can
    override any of them from the shell.

    Args:
      node: the Hydra ``hardware`` node (keys ``libtpu_init_args``, ``xla_flags``: lists of
        ``--flag=value`` strings, or null).
      environ: the environment to update (default ``os.environ``).

    Returns:
      The variables that were set, ``{name: new value}`` (empty if nothing changed).
    """
    env = os.environ if environ is None else environ
    changed: dict[str, str] = {}
    for var, key in (("LIBTPU_INIT_ARGS", "libtpu_init_args"), ("XLA_FLAGS", "xla_flags")):
        flags = _flags(_get(node, key))
        if not flags:
            continue
        value = _merge_flags(env.get(var, ""), flags)
        if value != env.get(var, ""):
            env[var] = value
            changed[var] = value
    return changed


def _merge_flags(existing: str, flags: Sequence[str]) -> str:
    have = {f.split("=", 1)[0] for f in existing.split()}
    extra = [f for f in flags if f.split("=", 1)[0] not in have]
    return " ".join([*existing.split(), *extra])
