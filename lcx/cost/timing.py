"""The calibrated time model: what a hardware preset achieves, not its datasheet.

The roofline of :func:`lcx.cost.estimate` prices every FLOP at peak and every byte at the link's
datasheet bandwidth, so its MFU is an upper bound. A :class:`TimeModel` replaces each of those
with an achieved rate, one named parameter per mechanism, read from the ``time_model`` node of
``conf/hardware/<preset>.yaml`` (each value with its source there: a public figure, or a fit by
``experiments/ledger_calibration.py`` / ``experiments/step_time_cpu.py`` to named measured steps).

Per device and step, with ``F`` the peak FLOP/s (:class:`StepWork` holds the inputs):

- attention: ``(executed + replay / replay_efficiency) / (F * attention_efficiency[kernel]
  * min(1, head_dim / mxu_dim)) + calls * kernel_call_s``. *Executed* FLOPs are the model's forward and the kernel's backward,
  which recomputes the scores (FlashAttention-2: 5 matmuls backward against 2 forward, Dao 2023,
  arXiv:2307.08691, section 3.1.2; model FLOPs count 2), plus a replayed forward, times the
  causal block waste ``1 + block_kv / S`` (the diagonal blocks run whole); plus ``skipped_tiles
  * skipped_tile_s``: a tile of the dK/dV backward's grid that a causal mask skips whole still
  costs its grid step though none of its FLOPs. A *call* is one kernel
  invocation: one per layer and pass (forward, backward, replay), times the ring size for a ring.
  The MXU term: a systolic array of width ``mxu_dim`` runs a contraction of width ``head_dim``
  at ``head_dim / mxu_dim`` of its rate when ``head_dim`` is smaller.
- linear layers: ``linear FLOPs / (F * linear_efficiency)``.
- a collective: ``bytes / (bandwidth * ici_efficiency) + count * collective_latency_s``; a ring
  hop the same over one link at ``ring_link_efficiency``; an all-to-all whose device group splits
  a physical torus axis (:mod:`lcx.cost.topology`) ``+ split_all_to_all_s`` each.
- exposure: ring hops hide behind ``ring_overlap`` of the attention compute, parameter
  all-gathers and gradient reductions behind the linear compute; the K/V all-gather and the
  Ulysses all-to-alls count in full; host transfers hide behind all compute.
- plus ``step_overhead_s`` per step.

:data:`ROOFLINE` (efficiencies 1, no latencies, model FLOPs) reproduces the roofline exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class CalibratedRange:
    """The cases a time model was fitted and checked on; outside them a prediction extrapolates
    (:func:`lcx.reports.timing.outside` says where, in words).

    Attributes:
      seq_len: (lowest, highest) tokens per sequence.
      tokens_per_device: (lowest, highest) tokens one device holds (S B / devices).
      strategies: context strategies the measured steps used.
      kernels: attention kernels the measured steps used.
    """

    seq_len: tuple[int, int] = (0, 0)
    tokens_per_device: tuple[int, int] = (0, 0)
    strategies: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TimeModel:
    """Achieved rates of one hardware preset (see the module docstring for the formulas).

    Attributes:
      attention_efficiency: achieved fraction of peak of the attention kernel on its executed
        FLOPs, by kernel name (``splash``, ``tokamax``, ``xla``); a kernel not listed runs at
        ``default_attention_efficiency``.
      default_attention_efficiency: the fraction for kernels not in the mapping.
      linear_efficiency: achieved fraction of peak of the projections, MLP and output head.
      mxu_dim: width of the matrix unit (None: no head-dim penalty).
      kernel_call_s: seconds each attention kernel call costs beyond its FLOPs (launch,
        pipeline fill, the ring step's synchronisation).
      collective_latency_s: seconds each collective or ring hop costs beyond its bytes.
      ici_efficiency: achieved fraction of the interconnect's datasheet bandwidth in the
        collectives over every link (all-gather, reduce-scatter, all-to-all).
      ring_link_efficiency: achieved fraction of one link's datasheet bandwidth in a ring hop
        (a neighbour-to-neighbour transfer on one link).
      replay_efficiency: the rate of a replayed attention forward (remat without the saved
        output and logsumexp) as a fraction of the kernel's own; MaxText's v5p steps that replay
        the ring forward in the backward run far below the others.
      split_all_to_all_s: seconds each all-to-all costs beyond the above when its device group
        splits a physical torus axis (a degree that is no product of whole torus axes, e.g. 8 or
        2 on a 4x4x4 slice; :mod:`lcx.cost.topology`).
      skipped_tile_s: seconds each visit of a grid tile that the mask skips whole costs (0: free,
        the roofline's assumption). A balanced causal layout visits one skipped tile per computed
        one and an unbalanced (contiguous) one's busiest device almost none, so this decides what
        the imbalance costs; it is a time per tile, so smaller blocks pay it more often.
      ring_overlap: fraction of the attention compute ring transfers hide behind (1: all).
      step_overhead_s: fixed seconds per step (optimizer update, host loop).
      executed_flops: price the kernel's executed FLOPs (backward score recompute, causal block
        waste) instead of the model count (False: the roofline's count).
      calibrated: the range the fit covered (None: not calibrated).
      error_median, error_max: held-out |predicted / measured - 1|, median and largest (None:
        not measured).
      source: where the values come from (a fit and its rows, or a public figure).
    """

    attention_efficiency: Mapping[str, float] = dataclasses.field(default_factory=dict)
    default_attention_efficiency: float = 1.0
    linear_efficiency: float = 1.0
    mxu_dim: int | None = None
    kernel_call_s: float = 0.0
    collective_latency_s: float = 0.0
    ici_efficiency: float = 1.0
    ring_link_efficiency: float = 1.0
    replay_efficiency: float = 1.0
    split_all_to_all_s: float = 0.0
    skipped_tile_s: float = 0.0
    ring_overlap: float = 1.0
    step_overhead_s: float = 0.0
    executed_flops: bool = True
    calibrated: CalibratedRange | None = None
    error_median: float | None = None
    error_max: float | None = None
    source: str = ""

    def __post_init__(self):
        effs = {**dict(self.attention_efficiency), "default": self.default_attention_efficiency}
        effs.update(
            linear=self.linear_efficiency,
            ici=self.ici_efficiency,
            ring_link=self.ring_link_efficiency,
            replay=self.replay_efficiency,
        )
        for name, v in effs.items():
            if not 0 < float(v) <= 1:
                raise ValueError(f"hardware.time_model: efficiency {name}={v} must be a fraction of peak in (0, 1]")
        if not 0 <= self.ring_overlap <= 1:
            raise ValueError(f"hardware.time_model.ring_overlap={self.ring_overlap} must be in [0, 1]")
        for name in (
            "kernel_call_s",
            "collective_latency_s",
            "split_all_to_all_s",
            "skipped_tile_s",
            "step_overhead_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"hardware.time_model.{name}={getattr(self, name)} must be >= 0 seconds")
        if self.mxu_dim is not None and self.mxu_dim < 1:
            raise ValueError(f"hardware.time_model.mxu_dim={self.mxu_dim} must be a positive width or null")
        object.__setattr__(self, "attention_efficiency", dict(self.attention_efficiency))

    @property
    def is_roofline(self) -> bool:
        return self == ROOFLINE

    def attention_rate(self, kernel: str, head_dim: int) -> float:
        """Achieved fraction of peak of ``kernel`` at ``head_dim``."""
        e = self.attention_efficiency.get(kernel, self.default_attention_efficiency)
        return e * (1.0 if self.mxu_dim is None else min(1.0, head_dim / self.mxu_dim))

    def time(self, w: StepWork, peak: float) -> StepTime:
        """Seconds of one step of work ``w`` at ``peak`` FLOP/s per device."""
        if self.executed_flops:
            # the kernel's backward recomputes the scores: 2.5 forwards executed where the model
            # counts 2 (FlashAttention-2); diagonal blocks run whole
            att_flops = w.attention_flops * 3.5 / 3 * w.block_waste
            replay = w.attention_replay_flops * w.block_waste / self.replay_efficiency
        else:
            att_flops, replay = w.attention_flops, w.attention_replay_flops
        rate = peak * self.attention_rate(w.kernel, w.head_dim)
        t_att = (
            (att_flops + replay) / rate + w.kernel_calls * self.kernel_call_s + w.skipped_tiles * self.skipped_tile_s
        )
        t_lin = w.linear_flops / (peak * self.linear_efficiency)
        lat = self.collective_latency_s
        t_ring = _transfer_s(w.ring_bytes, w.p2p_bandwidth * self.ring_link_efficiency, w.ring_hops, lat)
        coll = w.collective_bandwidth * self.ici_efficiency
        t_params = _transfer_s(w.param_bytes, coll, w.param_collectives, lat)
        t_kv = _transfer_s(w.kv_gather_bytes, coll, w.kv_collectives, lat)
        t_a2a = _transfer_s(w.all_to_all_bytes, coll, w.a2a_collectives, lat)
        if w.a2a_split_axis:
            t_a2a += w.a2a_collectives * self.split_all_to_all_s
        exposed = max(0.0, t_ring - self.ring_overlap * t_att) + max(0.0, t_params - t_lin) + t_kv + t_a2a
        t_host = w.host_bytes / w.host_bandwidth if w.host_bandwidth else 0.0
        exposed_host = max(0.0, t_host - (t_att + t_lin))
        return StepTime(
            attention=t_att,
            linear=t_lin,
            comm=t_ring + t_params + t_kv + t_a2a,
            exposed_comm=exposed,
            host=t_host,
            exposed_host=exposed_host,
            overhead=self.step_overhead_s,
        )


def _transfer_s(nbytes: float, bandwidth: float, count: int, latency: float) -> float:
    """Seconds to move ``nbytes`` bytes in ``count`` collectives at ``bandwidth`` bytes/s, each
    paying ``latency`` seconds (alpha-beta model: Hockney, Parallel Computing 20(3), 1994); 0
    when nothing moves."""
    return nbytes / bandwidth + count * latency if nbytes else 0.0


ROOFLINE = TimeModel(executed_flops=False)
"""Peak FLOP/s, datasheet bandwidth, no latencies, model FLOPs: the ledger's upper bound."""


@dataclasses.dataclass(frozen=True)
class StepWork:
    """What one device does in one step, as :func:`lcx.cost.estimate` counts it.

    Attributes:
      attention_flops: model attention FLOPs (forward + 2x backward, causal-halved), with the
        layout's imbalance; attention_replay_flops: a replayed forward's (remat).
      linear_flops: projections, MLP and head, with their recomputation.
      block_waste: executed / visible attention tiles (``1 + block_kv / S`` causal, else 1).
      kernel, head_dim: the attention kernel's name and head width.
      kernel_calls: attention kernel invocations per step.
      ring_bytes, ring_hops: ring transfer bytes and hops; p2p_bandwidth: one link's bytes/s.
      param_bytes, param_collectives: parameter all-gathers + gradient reductions and their
        count; kv_gather_bytes, kv_collectives: the allgather strategy's; all_to_all_bytes,
        a2a_collectives: Ulysses'; collective_bandwidth: bytes/s per device over all links.
      host_bytes, host_bandwidth: host offload bytes and the device's share of the host link
        (0: not priced).
      a2a_split_axis: the all-to-all's device group is not a whole sub-torus of the slice (its
        degree is no product of whole torus axes, :func:`lcx.cost.topology.is_subtorus`).
      skipped_tiles: visits per step of grid tiles the causal mask skips whole, on the busiest
        device, in the dK/dV backward (:func:`lcx.cost.work.skipped_tiles`; 0: not priced).
    """

    attention_flops: float
    attention_replay_flops: float
    linear_flops: float
    block_waste: float
    kernel: str
    head_dim: int
    kernel_calls: int
    ring_bytes: float
    ring_hops: int
    p2p_bandwidth: float
    param_bytes: float
    param_collectives: int
    kv_gather_bytes: float
    kv_collectives: int
    all_to_all_bytes: float
    a2a_collectives: int
    collective_bandwidth: float
    host_bytes: float
    host_bandwidth: float
    a2a_split_axis: bool = False
    skipped_tiles: float = 0.0


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds of one step by part (see :meth:`TimeModel.time`)."""

    attention: float
    linear: float
    comm: float
    exposed_comm: float
    host: float
    exposed_host: float
    overhead: float

    @property
    def compute(self) -> float:
        return self.attention + self.linear

    @property
    def total(self) -> float:
        return self.compute + self.exposed_comm + self.exposed_host + self.overhead


def time_model_from_config(node: Any) -> TimeModel | None:
    """:class:`TimeModel` from a hardware preset's ``time_model`` node (None: no node).

    Raises:
      ValueError: an unknown key (the message lists the known ones), or a value out of range.
    """
    if node is None:
        return None
    d = dict(node.items()) if hasattr(node, "items") else dict(node)
    known = {f.name for f in dataclasses.fields(TimeModel)}
    bad = sorted(set(d) - known)
    if bad:
        raise ValueError(f"hardware.time_model: unknown key(s) {bad}; known: {sorted(known)}")
    cal = d.pop("calibrated", None)
    if cal is not None:
        c = dict(cal.items()) if hasattr(cal, "items") else dict(cal)
        ckeys = {f.name for f in dataclasses.fields(CalibratedRange)}
        if set(c) - ckeys:
            raise ValueError(
                f"hardware.time_model.calibrated: unknown key(s) {sorted(set(c) - ckeys)}; known: {sorted(ckeys)}"
            )
        cal = CalibratedRange(
            seq_len=_pair(c.get("seq_len", (0, 0))),
            tokens_per_device=_pair(c.get("tokens_per_device", (0, 0))),
            strategies=tuple(str(x) for x in c.get("strategies", ())),
            kernels=tuple(str(x) for x in c.get("kernels", ())),
        )
    eff = d.pop("attention_efficiency", None) or {}
    eff = {
        str(k): _number(f"attention_efficiency.{k}", v)
        for k, v in (eff.items() if hasattr(eff, "items") else dict(eff).items())
    }
    floats = {
        k: _number(k, v) for k, v in d.items() if k not in ("mxu_dim", "executed_flops", "source") and v is not None
    }
    return TimeModel(
        attention_efficiency=eff,
        mxu_dim=None if d.get("mxu_dim") is None else int(d["mxu_dim"]),
        executed_flops=bool(d.get("executed_flops", True)),
        source=str(d.get("source", "")),
        calibrated=cal,
        **{k: v for k, v in floats.items() if k not in ("error_median", "error_max")},
        error_median=floats.get("error_median"),
        error_max=floats.get("error_max"),
    )


def _number(key: str, v: Any) -> float:
    # YAML reads 1e-4 (no dot) as a string: a string that is a number is one
    if not isinstance(v, bool):
        with contextlib.suppress(TypeError, ValueError):
            return float(v)
    raise ValueError(f"hardware.time_model.{key}={v!r}: must be a number")


def _pair(v: Any) -> tuple[int, int]:
    lo, hi = (int(x) for x in v)
    return lo, hi
