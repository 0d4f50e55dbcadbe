"""The cost ledger of one training step: FLOPs, memory, communication, time, MFU.

:func:`estimate` combines :mod:`lcx.cost.flops`, :mod:`lcx.cost.breakdown` and
:mod:`lcx.cost.comm` with a :class:`~lcx.cost.hardware.Hardware` preset into an
:class:`Estimate`. Times are at the hardware preset's calibrated rates
(:class:`~lcx.cost.timing.TimeModel`: achieved kernel and matmul efficiency, collective latency,
exposed transfers) where the preset has them, and the roofline (compute at peak FLOP/s, links at
their datasheet bandwidth) is kept beside them as the upper bound (docs/time_model.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Unpack

from lcx.attention.strategies import Traffic
from lcx.cost.balance import causal_imbalance
from lcx.cost.breakdown import MemoryBreakdown, memory_breakdown
from lcx.cost.comm import CommBytes, comm_bytes, kind_traffic, ring_overlap_min_block
from lcx.cost.flops import ModelDims, StepFlops, kind_attention_flops, recompute_flops, training_flops
from lcx.cost.hardware import Hardware
from lcx.cost.local import KindShare, LocalStep, StepArgs, StepSizes
from lcx.cost.policy import ActivationPolicy
from lcx.cost.timing import ROOFLINE, StepTime, StepWork
from lcx.cost.topology import is_subtorus
from lcx.cost.work import attention_only, skipped_tiles, step_work, total_work
from lcx.sharding import Plan


@dataclasses.dataclass(frozen=True)
class KindCost:
    """One layer kind's share of a step on one device, as ``lcx.plan`` prints it per kind.

    Attributes:
      kind: ``global``, ``sliding`` or ``chunked``; span: its window or chunk in tokens (None:
        global).
      layers: the model's layers of this kind.
      strategy: the strategy the plan gives the kind (``plan.attention.strategy_for(kind)``).
      attention_flops: the kind's model attention FLOPs on this device per step (fwd + bwd,
        with the layout's imbalance).
      comm_bytes: bytes one device sends per step for the kind's attention (its strategy's
        all-gathers, all-to-alls and ring hops over its layers).
      time: seconds of the kind's attention per step: its compute (kernel calls, replay) plus
        its attention communication not hidden behind that compute, priced alone by the
        hardware's time model (the roofline without one).
    """

    kind: str
    span: int | None
    layers: int
    strategy: str
    attention_flops: float
    comm_bytes: float
    time: float


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One plan, one activation policy: what a training step costs per device.

    Attributes:
      flops: model FLOPs of the step (whole batch).
      recompute_flops: FLOPs the remat policy and vocabulary tiling's head replay add (whole
        batch; not in MFU).
      memory: per-device memory breakdown.
      comm: per-device communication bytes.
      compute_time: seconds of compute per step per device (with causal imbalance), at the
        calibrated rates when ``calibrated``, else at peak.
      comm_time: seconds the communication takes if nothing overlaps.
      exposed_comm_time: seconds of communication not hidden behind compute.
      host_bytes: bytes one device moves between HBM and host memory per step (host offload;
        :func:`host_transfer_bytes`).
      host_time: seconds those transfers take over the device's share of the host link
        (0 when the hardware's ``host_bandwidth_per_chip`` is unknown).
      exposed_host_time: seconds of host transfer not hidden behind compute.
      ring_block: K/V tokens per ring hop (0 if no ring).
      ring_min_block: tokens per hop needed to hide the hop (:func:`ring_overlap_min_block`).
      fits: per-device total <= HBM and host bytes <= host memory.
      n_devices: devices of the step.
      peak_flops_per_device: FLOP/s used for times and MFU.
      hbm_bytes, host_bytes_per_device: capacities (None: unlimited).
      overhead_time: the time model's fixed seconds per step.
      roofline_step_time: the step at peak FLOP/s and datasheet links (the upper bound).
      calibrated: the times use the hardware's :class:`~lcx.cost.timing.TimeModel`.
      time: the step's seconds by part (:class:`~lcx.cost.timing.StepTime`).
      work: what one device does (:class:`~lcx.cost.timing.StepWork`), which any
        :class:`~lcx.cost.timing.TimeModel` prices (``TimeModel.time(work, peak)``).
      kinds: the step per layer kind of the model (:class:`KindCost`; one for a uniform model).
    """

    flops: StepFlops
    recompute_flops: float
    memory: MemoryBreakdown
    comm: CommBytes
    compute_time: float
    comm_time: float
    exposed_comm_time: float
    ring_block: int
    ring_min_block: float
    n_devices: int
    peak_flops_per_device: float
    hbm_bytes: float | None
    host_bytes_per_device: float | None
    tokens_per_step: int
    host_bytes: float = 0.0
    host_time: float = 0.0
    exposed_host_time: float = 0.0
    overhead_time: float = 0.0
    roofline_step_time: float = 0.0
    calibrated: bool = False
    time: StepTime | None = None
    work: StepWork | None = None
    kinds: tuple[KindCost, ...] = ()

    @property
    def step_time(self) -> float:
        """Predicted seconds per step: compute plus the communication and host transfers that do
        not overlap it, plus the fixed per-step overhead; at the hardware's calibrated rates
        (:class:`~lcx.cost.timing.TimeModel`) when it has them, else the roofline."""
        return self.compute_time + self.exposed_comm_time + self.exposed_host_time + self.overhead_time

    @property
    def roofline_mfu(self) -> float:
        """MFU at the roofline step time (peak FLOP/s, datasheet links): an upper bound."""
        return mfu(self.flops.total, self.roofline_step_time, self.peak_flops_per_device, self.n_devices)

    @property
    def overlap(self) -> bool | None:
        """Ring overlap condition ``c >= c_min`` (None when the plan has no ring)."""
        return None if self.ring_block == 0 else self.ring_block >= self.ring_min_block

    @property
    def fits_hbm(self) -> bool:
        return self.hbm_bytes is None or self.memory.total <= self.hbm_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes_per_device is None or self.memory.host <= self.host_bytes_per_device

    @property
    def fits(self) -> bool:
        return self.fits_hbm and self.fits_host

    @property
    def mfu(self) -> float:
        """Predicted model FLOPs utilisation at :attr:`step_time` (calibrated where the hardware
        is, else the roofline upper bound)."""
        return mfu(self.flops.total, self.step_time, self.peak_flops_per_device, self.n_devices)

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_per_step / self.step_time if self.step_time > 0 else math.inf


def mfu(model_flops_per_step: float, step_time_s: float, peak_flops_per_device: float, n_devices: int) -> float:
    """Model FLOPs utilisation: ``model FLOPs / (step time * peak FLOP/s * devices)``.

    Model FLOPs only (MaxText ``calculate_tflops_training_per_device``): recomputation is not
    credited. Returns 0 for a non-positive step time.
    """
    if step_time_s <= 0:
        return 0.0
    return model_flops_per_step / (step_time_s * peak_flops_per_device * n_devices)


def step_metrics(
    cfg: ModelDims,
    seq_len: int,
    global_batch: int,
    step_time_s: float,
    hw: Hardware,
    n_devices: int,
    *,
    window: int | None = None,
) -> dict[str, float]:
    """The trainer's throughput metrics for a measured step time.

    Returns:
      ``{"tokens_per_sec": tokens/s, "mfu": fraction, "model_flops_per_step": FLOPs}``.
    """
    f = training_flops(cfg, seq_len, global_batch, window=window)
    tokens = seq_len * global_batch
    return {
        "tokens_per_sec": tokens / step_time_s if step_time_s > 0 else 0.0,
        "mfu": mfu(f.total, step_time_s, hw.peak_flops_per_device, n_devices),
        "model_flops_per_step": f.total,
    }


def host_transfer_bytes(mem: MemoryBreakdown, policy: ActivationPolicy) -> float:
    """Bytes one device moves between HBM and host memory in one training step.

    From the program ``lcx.training.step.make_steps`` compiles and ``lcx.models`` remat
    placements (``p`` = parameter bytes per device = ``mem.grads``; gradients stay on device):

    - offloaded activations (block inputs, attention context): written to the host in the
      forward and read back in the backward, twice their bytes;
    - offloaded parameters: one ``jax.device_put`` to the device at the start of the step (the
      device copy serves the forward, the backward and the update) and the updated parameters
      back to the step's ``pinned_host`` output: ``2 p``;
    - offloaded optimizer state (AdamW's two tensors per parameter, as
      :func:`~lcx.cost.breakdown.memory_breakdown` counts it): put on the device right before the
      update, the new state back to the host output: ``2 x 2 p``.

    These are the copies a compiler that honours memory kinds makes (TPU, GPU); XLA:CPU strips
    the placements and copies nothing (``memory_breakdown(..., memory_kinds=False)``).
    """
    p = mem.grads
    state_on_host = (p if policy.offload_params else 0) + (2 * p if policy.offload_optimizer else 0)
    activations_on_host = max(0, mem.host - state_on_host)
    return (
        2.0 * activations_on_host
        + (2.0 * p if policy.offload_params else 0.0)
        + (2.0 * 2 * p if policy.offload_optimizer else 0.0)
    )


def estimate(
    cfg: ModelDims,
    plan: Plan,
    hw: Hardware,
    n_devices: int,
    *,
    policy: ActivationPolicy,
    window: int | None = None,
    **step: Unpack[StepArgs],
) -> Estimate:
    """Cost of one training step of ``cfg`` under ``plan`` on ``n_devices`` devices of ``hw``.

    Compute: (model + recompute FLOPs) / devices at peak, the attention part stretched by the
    causal imbalance of the layout (contiguous ring/all-gather: ``(2P-1)/P``). Communication: the
    bytes of :func:`~lcx.cost.comm.comm_bytes` over the collective bandwidth (all-gather,
    all-to-all, gradients) or the ring link (ring hops). Overlap: ring hops hide behind the
    attention compute (issued before each kernel), parameter all-gathers and gradient reductions
    behind the linear compute (asynchronous collectives); the K/V all-gather and the Ulysses
    all-to-alls sit on the critical path and count in full. Host offload: the bytes of
    :func:`host_transfer_bytes` over the device's share of the chip's host link
    (``hardware.host_bandwidth_per_chip``); the copies are asynchronous DMA on their own link,
    so they hide behind the whole compute and only the excess counts. An offload that a long
    sequence hides completely costs nothing; at short sequences it lengthens the step, so the
    planner offloads only where HBM needs it.

    Args:
      cfg: model dimensions; plan: the sharding plan; hw: the hardware preset.
      n_devices: devices of the step.
      policy: remat / offload / vocabulary-tiling choices.
      window: sliding-window length (tokens) for the attention FLOPs, or None.
      **step: the step's sizes and dtypes (:class:`~lcx.cost.local.StepArgs`).

    Raises:
      PlanError: the plan does not fit ``n_devices``.
    """
    st = StepSizes(**step)
    seq_len, global_batch = st.seq_len, st.global_batch
    flops = training_flops(cfg, seq_len, global_batch, window=window)
    rec = recompute_flops(
        cfg,
        seq_len,
        global_batch,
        policy.remat,
        keep_context=policy.keeps_context,
        vocab_tiling=policy.vocab_tiling,
        window=window,
    )
    mem = memory_breakdown(cfg, plan, n_devices, policy=policy, window=window, **step)
    com = comm_bytes(cfg, plan, n_devices, policy=policy, window=window, **step)
    local = LocalStep.of(cfg, plan, n_devices, st, window=window)
    P, a = local.context_degree, plan.attention
    lin_rec = _linear_recompute(cfg, seq_len, global_batch, policy)
    peak = hw.peak_flops_per_device
    coll_bw = hw.collective_bandwidth_per_device or math.inf
    p2p_bw = hw.p2p_bandwidth_per_device or math.inf
    host_bytes = host_transfer_bytes(mem, policy)
    traffic = kind_traffic(local, policy)
    # one ring hop checked for overlap: the first kind's whose strategy has a ring
    hops = (
        k.strategy.ring_hop(seq_len, P, k.attention.ulysses_degree, cfg.n_heads, cfg.n_kv_heads) for k in local.kinds
    )
    hop = next((h for h in hops if h is not None), None)
    if hop is not None:
        block = hop.block
        cmin = ring_overlap_min_block(
            peak,
            p2p_bw,
            n_heads=hop.n_heads,
            n_kv_heads=hop.n_kv_heads,
            bytes_per_element=2 if st.dtype != "float32" else 4,
            causal=a.layout == "zigzag",
        )
    else:
        block, cmin = 0, 0.0
    works = []
    for i, k in enumerate(local.kinds):
        # each kind by its own strategy: Ulysses computes all S tokens of its heads (balanced); a
        # ring (or USP's ring of P/U ranks, each holding U consecutive chunks after the
        # all-to-all) inherits the layout's imbalance. The linear, parameter and host parts ride
        # with the first kind.
        U, strategy, first = k.attention.ulysses_degree, k.strategy, i == 0
        imb = causal_imbalance(
            a.layout, strategy.imbalance_degree(P, U), packed_documents=st.packed_documents, seq_len=seq_len
        )
        att = (
            flops.attention
            if len(local.kinds) == 1
            else 3.0 * kind_attention_flops(cfg, seq_len, global_batch, k.group)
        )
        share = att / flops.attention if flops.attention else 0.0
        span = k.group.mask.window or k.group.mask.chunk
        kcom = (
            dataclasses.replace(com, **dataclasses.asdict(traffic[i]))
            if first
            else CommBytes(**dataclasses.asdict(traffic[i]))
        )
        hops_here = strategy.ring_hop(seq_len, P, U, cfg.n_heads, cfg.n_kv_heads) is not None
        works.append(
            step_work(
                cfg,
                a,
                kcom,
                seq_len,
                span,
                n_devices,
                imb,
                att,
                (rec - lin_rec) * share / n_devices * imb,
                P,
                linear_flops=(flops.linear + lin_rec) / n_devices if first else 0.0,
                ring_size=P // max(U, 1) if hops_here else 1,
                p2p_bandwidth=p2p_bw,
                collective_bandwidth=coll_bw,
                host_bytes=host_bytes if first else 0.0,
                host_bandwidth=hw.host_bandwidth_per_device or 0.0,
                a2a_split_axis=U > 1 and not is_subtorus(U, hw.physical_mesh(n_devices) or (U,)),
                skipped_per_tile=skipped_tiles(a.layout, strategy.imbalance_degree(P, U), seq_len, span),
                layers=k.layers,
            )
        )
    work = total_work(works)
    model = ROOFLINE if hw.time_model is None else hw.time_model
    kinds = tuple(
        _kind_cost(k, a.strategy_for(k.kind), w, t, model.time(attention_only(w), peak))
        for k, w, t in zip(local.kinds, works, traffic)
    )
    roof = ROOFLINE.time(work, peak)
    t = roof if hw.time_model is None else hw.time_model.time(work, peak)
    return Estimate(
        flops=flops,
        recompute_flops=rec,
        memory=mem,
        comm=com,
        compute_time=t.compute,
        comm_time=t.comm,
        exposed_comm_time=t.exposed_comm,
        ring_block=block,
        ring_min_block=cmin,
        n_devices=n_devices,
        peak_flops_per_device=peak,
        hbm_bytes=hw.hbm_bytes,
        host_bytes_per_device=hw.host_memory_per_device,
        tokens_per_step=seq_len * global_batch,
        host_bytes=host_bytes,
        host_time=t.host,
        exposed_host_time=t.exposed_host,
        overhead_time=t.overhead,
        roofline_step_time=roof.total,
        calibrated=hw.time_model is not None,
        time=t,
        work=work,
        kinds=kinds,
    )


def _kind_cost(k: KindShare, strategy: str, w: StepWork, traffic: Traffic, t: StepTime) -> KindCost:
    return KindCost(
        kind=k.kind,
        span=k.group.mask.window or k.group.mask.chunk,
        layers=k.layers,
        strategy=strategy,
        attention_flops=w.attention_flops,
        comm_bytes=traffic.all_gather + traffic.all_to_all + traffic.ring,
        time=t.attention + t.exposed_comm,
    )


def _linear_recompute(cfg, seq_len, global_batch, policy) -> float:
    """The linear part of :func:`~lcx.cost.flops.recompute_flops`: the blocks' replayed
    projections and, under vocabulary tiling, the output head's replay."""
    from lcx.cost.flops import RECOMPUTED_FORWARD_FRACTION, forward_flops, head_replay_flops

    lin, _ = RECOMPUTED_FORWARD_FRACTION[policy.remat]
    f = forward_flops(cfg, seq_len, global_batch)
    head = 2.0 * seq_len * global_batch * cfg.d_model * cfg.vocab_size
    return lin * (f.linear - head) + head_replay_flops(cfg, seq_len, global_batch, policy.vocab_tiling)
