"""Plan search: the smallest context-parallel degree that fits, then the fastest strategy at it.

MaxText's advice for long context (FIELD_NOTES section 2) made a procedure: enumerate every
valid (data x context) mesh, strategy (all-gather, ring, Ulysses A2A, USP splits), parameter
sharding (replicated or ZeRO-3 over all devices) and activation policy (remat, host offload);
price each with :func:`lcx.cost.ledger.estimate`; keep those whose per-device memory fits; take
the smallest context degree among them, and at that degree the shortest predicted step.
Pure arithmetic: nothing is compiled, no device is touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lcx.cost.hardware import Hardware
from lcx.cost.ledger import Estimate, estimate
from lcx.cost.memory import ActivationPolicy
from lcx.sharding import Plan, PlanError
from lcx.sharding.plan import AttentionConfig

LCX_REMAT: tuple[str, ...] = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "custom")
"""Remat policies ``lcx.models`` implements today (``model.remat``; ``custom`` with its
``model.remat_*`` placements, host offload included)."""


def default_policies(host_offload: bool = True) -> list[ActivationPolicy]:
    """Activation policies the planner tries, cheapest recompute first.

    With ``host_offload`` (hardware with known host memory) also MaxText's offload recipes:
    the block input and the attention context to host, then optimizer and parameters as well.
    """
    out = [
        ActivationPolicy("none"),
        ActivationPolicy("dots_with_no_batch_dims_saveable"),
        ActivationPolicy("custom", context="device"),
        ActivationPolicy("full"),
    ]
    if host_offload:
        out += [
            ActivationPolicy("custom", decoder_layer_input="offload", context="offload"),
            ActivationPolicy("full", decoder_layer_input="offload"),
            ActivationPolicy("custom", decoder_layer_input="offload", context="offload",
                             offload_optimizer=True, offload_params=True),
            ActivationPolicy("full", decoder_layer_input="offload", offload_optimizer=True, offload_params=True),
        ]
    # MaxText computes the output head and loss in vocabulary tiles (num_vocab_tiling=16 in its
    # long-context recipes): the float32 logits of a long local sequence are otherwise the largest
    # transient of the step
    out += [dataclasses.replace(p, vocab_tiling=16) for p in out]
    return out


def missing_in_lcx(policy: ActivationPolicy) -> list[str]:
    """What ``lcx.train`` lacks to run ``policy`` (empty: it runs it today).

    ``lcx.models`` runs its remat policies (:data:`LCX_REMAT`), with activation offload only
    through ``custom`` (``full`` with the block input offloaded is ``custom`` with every other
    placement ``remat``); ``lcx.train`` runs vocabulary tiling (``memory.vocab_tiling``: N must
    divide the local sequence, and the planner prices only such N, :func:`valid_tiling`) and
    optimizer and parameter host offload (``memory.offload_optimizer`` /
    ``memory.offload_params``). What it still lacks: a remat policy outside :data:`LCX_REMAT`,
    and the block input offloaded under any policy but ``full`` / ``custom``.
    """
    p = policy
    out = []
    if p.remat not in LCX_REMAT:
        out.append(f"remat={p.remat}")
    elif p.decoder_layer_input == "offload" and p.remat not in ("full", "custom"):
        out.append(f"block-input offload under remat={p.remat}")
    return out


def valid_tiling(n: int, local_seq: int) -> int:
    """The vocabulary tile count ``lcx.train`` accepts nearest to ``n``: a divisor of the local
    sequence ``local_seq`` (tokens per device), the smaller one on a tie (the rule of
    ``lcx.training.memory.MemoryOptions.check_tiling``'s advice). 16 for 114,688 (14,680,064
    tokens / 128) and 65,536; 14 for ``n=15`` at 114,688."""
    if local_seq % n == 0:
        return n
    return min(divisors(local_seq), key=lambda d: (abs(d - n), d))


def train_overrides(policy: ActivationPolicy) -> list[str]:
    """The ``lcx.train`` overrides that train ``policy``: ``model.remat`` and its placements,
    and every ``memory.*`` option (explicit: an experiment may set them otherwise).

    ``full`` with the block input offloaded is ``custom`` with the context and q/k/v
    recomputed. For any other non-``custom`` policy the ``model.remat_*`` placements are set to
    their defaults: the model refuses others without ``custom``, and the experiment these are
    added to may set them.

    Raises:
      ValueError: a policy :func:`missing_in_lcx` says lcx.train cannot run.
    """
    p = policy
    miss = missing_in_lcx(p)
    if miss:
        raise ValueError(f"policy {p.label}: lcx.train cannot run it ({', '.join(miss)})")
    defaults = {"remat_layer_input": "device", "remat_context": "remat", "remat_qkv": "remat"}
    if p.remat == "custom" or p.decoder_layer_input == "offload":
        custom = p.remat == "custom"
        out = ["model.remat=custom", f"model.remat_layer_input={p.decoder_layer_input}",
               f"model.remat_context={p.context if custom else 'remat'}",
               f"model.remat_qkv={p.qkv if custom else 'remat'}"]
    else:
        # the placements back to their defaults: the experiment a user adds these to may set them
        out = [f"model.remat={p.remat}"] + [f"model.{k}={v}" for k, v in defaults.items()]
    out += [f"memory.vocab_tiling={p.vocab_tiling}", f"memory.offload_optimizer={str(p.offload_optimizer).lower()}",
            f"memory.offload_params={str(p.offload_params).lower()}"]
    return out


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One priced configuration.

    Attributes:
      plan: the sharding plan (mesh sizes explicit).
      policy: activation policy.
      est: its :class:`~lcx.cost.ledger.Estimate`.
      param_sharding: ``replicated`` or ``zero3`` (parameters split over every mesh axis).
    """

    plan: Plan
    policy: ActivationPolicy
    est: Estimate
    param_sharding: str

    @property
    def context_degree(self) -> int:
        return self.est.n_devices // _data(self.plan)

    @property
    def runnable_in_lcx(self) -> bool:
        """``lcx.train`` runs it today (:func:`missing_in_lcx` is empty)."""
        return not missing_in_lcx(self.policy)

    @property
    def mesh_label(self) -> str:
        return "x".join(f"{n}={s}" for n, s in self.plan.mesh)

    def as_dict(self) -> dict[str, Any]:
        e = self.est
        return {
            "plan": self.plan.to_config(),
            "strategy": self.plan.attention.strategy,
            "mesh": dict(self.plan.mesh),
            "context_degree": self.context_degree,
            "param_sharding": self.param_sharding,
            "policy": dataclasses.asdict(self.policy),
            "policy_label": self.policy.label,
            "runnable_in_lcx": self.runnable_in_lcx,
            "memory_bytes_per_device": e.memory.as_dict(),
            "comm_bytes_per_device": dataclasses.asdict(e.comm),
            "model_flops_per_step": e.flops.total,
            "attention_flops_per_step": e.flops.attention,
            "recompute_flops_per_step": e.recompute_flops,
            "compute_time_s": e.compute_time,
            "comm_time_s": e.comm_time,
            "exposed_comm_time_s": e.exposed_comm_time,
            "host_bytes_per_device": e.host_bytes,
            "host_time_s": e.host_time,
            "exposed_host_time_s": e.exposed_host_time,
            "step_time_s": e.step_time,
            "ring_block_tokens": e.ring_block,
            "ring_min_block_tokens": e.ring_min_block,
            "overlap": e.overlap,
            "fits": e.fits,
            "fits_hbm": e.fits_hbm,
            "fits_host": e.fits_host,
            "predicted_mfu": e.mfu,
            "tokens_per_sec": e.tokens_per_sec,
        }


def _data(plan: Plan) -> int:
    return dict(plan.mesh).get("data", 1)


def divisors(n: int) -> list[int]:
    """Every divisor of ``n >= 1``, ascending (O(sqrt n)): tile counts, device counts."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def candidate_plans(cfg, n_devices: int, seq_len: int, global_batch: int, *, attention: AttentionConfig | None = None,
                    kernel: str | None = None) -> list[tuple[Plan, str]]:
    """Every valid (plan, param sharding) for this model, length, batch and device count.

    Meshes ``{data: d, context: P}`` (``d`` divides the batch, ``d P = n``) for all-gather,
    ring and A2A, and ``{data: d, ulysses: U, ring: P/U}`` for USP with ``1 < U < P``; each with
    parameters replicated or ZeRO-3 sharded along ``embed`` over every mesh axis. Plans that
    :meth:`~lcx.sharding.Plan.validate` refuses (heads, divisibility, layout) are dropped.
    """
    base = attention or AttentionConfig()
    kern = kernel or base.kernel
    out: list[tuple[Plan, str]] = []
    for d in divisors(n_devices):
        if global_batch % d:
            continue
        P = n_devices // d
        meshes: list[tuple[tuple[tuple[str, int], ...], Any, str, dict]] = []
        for strat in ("allgather", "ring", "a2a"):
            meshes.append(((("data", d), ("context", P)), "context", strat, {}))
        for U in divisors(P):
            if 1 < U < P:
                meshes.append(((("data", d), ("ulysses", U), ("ring", P // U)), ("ulysses", "ring"), "usp",
                               {"ulysses_axis": "ulysses", "ring_axis": "ring"}))
        for mesh, seq_rule, strat, extra in meshes:
            names = tuple(n for n, _ in mesh)
            for sharding in ("zero3", "replicated"):
                params = (("embed", names if len(names) > 1 else names[0]),) if sharding == "zero3" else ()
                name = f"{strat}" + (f"{dict(mesh)['ulysses']}x{dict(mesh)['ring']}" if strat == "usp" else "")
                # zigzag balances causal work; when S is not a multiple of 2P, fall back to the
                # contiguous layout (priced with its causal imbalance) rather than drop the plan
                for layout in ("zigzag", "contiguous"):
                    att = dataclasses.replace(base, strategy=strat, kernel=kern, layout=layout, **extra)
                    try:
                        plan = Plan(mesh=mesh, params=params, activations=(("batch", "data"), ("seq", seq_rule)),
                                    attention=att, name=name if layout == "zigzag" else f"{name}(contig)")
                        plan.validate(n_devices, dims=cfg.dims() if hasattr(cfg, "dims") else None,
                                      seq_len=seq_len, global_batch=global_batch)
                    except PlanError:
                        continue
                    out.append((plan, sharding))
                    break
    return out


def no_candidates_reason(cfg, n_devices: int, seq_len: int, global_batch: int, *, devices_per_chip: int = 1,
                         chips_key: str = "hardware.chips", attention: AttentionConfig | None = None) -> str:
    """Why :func:`candidate_plans` is empty here, and the nearest chip counts and sequence lengths
    at which it is not (for an error message; call it only when there is no candidate).

    The context degree P of a mesh is the device count over the data degree, which must divide
    the batch; the sequence must split into P (contiguous) or 2P (zigzag) chunks; A2A and USP
    need a Ulysses degree that the heads allow; ZeRO-3 needs ``embed`` divisible by the devices.
    Each candidate check is a :meth:`~lcx.sharding.Plan.validate` call (microseconds).
    """
    dims = cfg.dims() if hasattr(cfg, "dims") else {}
    chips = n_devices // devices_per_chip
    degrees = [n_devices // d for d in divisors(n_devices) if global_batch % d == 0]
    why = []
    for P in degrees:
        if seq_len % P:
            why.append(f"P={P}: {seq_len:,} tokens is not a multiple of P={P} (contiguous layout) nor of 2P={2 * P} "
                       f"(zigzag)")
            continue
        # the sequence splits; then every strategy failed for its own reason: collect them
        errs = set()
        for strat in ("allgather", "ring", "a2a"):
            for layout in ("zigzag", "contiguous"):
                att = dataclasses.replace(attention or AttentionConfig(), strategy=strat, layout=layout)
                try:
                    Plan(mesh=(("data", n_devices // P), ("context", P)), activations=(("batch", "data"),
                         ("seq", "context")), attention=att).validate(
                        n_devices, dims=dims or None, seq_len=seq_len, global_batch=global_batch)
                except PlanError as e:
                    errs.add(f"{strat}/{layout}: {e}")
        why.append(f"P={P}: " + "; ".join(sorted(errs)))
    if len(degrees) < len(divisors(n_devices)):
        why.append(f"no other context degree: the data degree ({n_devices} devices / P) must divide "
                   f"train.global_batch={global_batch}")

    def has(n: int, s: int) -> bool:
        return bool(candidate_plans(cfg, n, s, global_batch, attention=attention))

    below = next((c for c in range(chips - 1, 0, -1) if has(c * devices_per_chip, seq_len)), None)
    above = next((c for c in range(chips + 1, 4 * chips + 2) if has(c * devices_per_chip, seq_len)), None)
    near_chips = [c for c in (below, above) if c is not None]
    unit = 2 * n_devices  # zigzag-balanced at every context degree of this device count
    lo = seq_len // unit * unit
    near_seq = [s for s in dict.fromkeys((lo, lo + unit)) if s > 0 and has(n_devices, s)]
    fixes = []
    if near_chips:
        fixes.append(f"{chips_key}=" + " or ".join(str(c) for c in near_chips))
    if near_seq:
        fixes.append("train.seq_len=" + " or ".join(f"{s}" for s in near_seq)
                     + f" (multiples of 2 x {n_devices} devices)")
    return (f"no plan applies to {seq_len:,} tokens x {global_batch} sequence{'s' * (global_batch > 1)} on {chips} "
            f"chips = {n_devices} devices: " + "; ".join(why)
            + (f"; use {', or '.join(fixes)}" if fixes else ""))


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """The planner's answer.

    Attributes:
      best: the recommended candidate (None: nothing fits).
      best_runnable: the best candidate ``lcx.train`` can run today (may equal ``best``).
      candidates: every priced candidate.
      reasons: sentences explaining the choice.
    """

    best: Candidate | None
    best_runnable: Candidate | None
    candidates: tuple[Candidate, ...]
    reasons: tuple[str, ...]


def search(cfg, hw: Hardware, n_devices: int, *, seq_len: int, global_batch: int, dtype: str = "bfloat16",
           param_dtype: str = "float32", attention: AttentionConfig | None = None,
           policies: Sequence[ActivationPolicy] | None = None,
           window: int | None = None) -> Recommendation:
    """Price every candidate and recommend one (see the module docstring for the rule)."""
    pols = list(policies) if policies is not None else default_policies(hw.host_memory_per_chip is not None)
    kw = dict(dtype=dtype, param_dtype=param_dtype, attention=attention, window=window)
    cands = _price(cfg, hw, n_devices, seq_len, global_batch, pols, **kw)
    fitting = [c for c in cands if c.est.fits]
    reasons: list[str] = []
    if not fitting:
        smallest = min(cands, key=lambda c: c.est.memory.total) if cands else None
        if smallest is not None:
            reasons.append(
                f"nothing fits: the smallest footprint is {_gib(smallest.est.memory.total)} per device "
                f"({_where(smallest)}, {smallest.policy.label}; largest part: {_largest_part(smallest)}) against "
                f"{_gib(hw.hbm_bytes)} of {_limit_name(hw)}; "
                + _what_would_fit(cfg, hw, n_devices, seq_len, global_batch, pols, what="any plan", **kw))
            runnable_pols = [p for p in pols if not missing_in_lcx(p)]
            if "which lcx.train lacks" in reasons[-1] and runnable_pols:
                # a hint lcx.train cannot run needs its runnable counterpart next to it
                reasons.append(_what_would_fit(cfg, hw, n_devices, seq_len, global_batch, runnable_pols,
                                               what="a plan lcx.train runs today", **kw))
        return Recommendation(None, None, tuple(cands), tuple(reasons))
    p_min = min(c.context_degree for c in fitting)
    at = sorted((c for c in fitting if c.context_degree == p_min), key=_rank)
    best = at[0]
    runnable = sorted((c for c in fitting if c.runnable_in_lcx), key=lambda c: (c.context_degree, *_rank(c)))
    degrees = sorted({c.context_degree for c in cands})
    smaller = [P for P in degrees if P < p_min]
    reasons.append(
        f"smallest context degree that fits: {p_min}"
        + (f" (degrees {smaller} do not fit in {_gib(hw.hbm_bytes)} per device with any strategy or policy)"
           if smaller else " (the only degree this batch and device count allow)" if len(degrees) == 1 else "")
    )
    e = best.est
    reasons.append(
        f"fastest at degree {p_min}: {best.plan.name} on {best.mesh_label}, params {best.param_sharding}, "
        f"{best.policy.label}: predicted {e.step_time:,.1f} s/step ({e.compute_time:,.1f} s compute, "
        f"{e.exposed_comm_time:,.2f} s exposed communication"
        + (f", {e.exposed_host_time:,.2f} s exposed host transfer" if e.exposed_host_time else "")
        + f"), {_gib(e.memory.total)} per device, "
        f"roofline MFU {100 * e.mfu:.1f}%")
    near = _near_limit(best, hw)
    if near:
        roomy = next((c for c in at if not _near_limit(c, hw)), None)
        reasons.append(
            near + (f"; the fastest plan at this degree with that margin: {_where(roomy)}, {roomy.policy.label}: "
                    f"{roomy.est.step_time:,.1f} s/step, {_gib(roomy.est.memory.total)} per device"
                    + (f" (it needs {_lacks(roomy)})" if _lacks(roomy) else "") if roomy else ""))
    if e.overlap is not None:
        reasons.append(
            f"ring overlap {'holds' if e.overlap else 'FAILS'}: {e.ring_block:,} tokens per hop vs c_min = "
            f"{e.ring_min_block:,.0f} (F/B with the GQA factor"
            + (", causal zigzag: half the pairs per hop)" if best.plan.attention.layout == "zigzag" else ")"))
    if best.plan.attention.layout == "contiguous" and best.plan.attention.strategy != "a2a" and p_min > 1:
        lo = seq_len // (2 * p_min) * (2 * p_min)
        reasons.append(
            f"{seq_len:,} tokens is not a multiple of 2P = {2 * p_min}, so the zigzag layout is impossible and the "
            f"contiguous layout costs a causal imbalance of up to (2P-1)/P; use train.seq_len={lo:,} or "
            f"{lo + 2 * p_min:,} to balance the work")
    if e.host_bytes:
        reasons.append(
            f"host offload moves {_gib(e.host_bytes)} per device per step: {e.host_time:,.2f} s over the host link"
            + (f" ({e.exposed_host_time:,.2f} s not hidden behind compute)" if hw.host_bandwidth_per_chip
               else " (not priced: hardware.host_bandwidth_per_chip is unknown)"))
    # one line per (strategy, param sharding): two rows that differ only in how the parameters
    # are sharded must be told apart
    others: dict[tuple[str, str], Candidate] = {}
    for c in at[1:]:
        others.setdefault((c.plan.name, c.param_sharding), c)
    for c in list(others.values())[:4]:
        reasons.append(f"  vs {c.plan.name}, params {c.param_sharding} ({c.policy.label}): "
                       f"{c.est.step_time:,.1f} s/step, {_gib(c.est.memory.total)}")
    rb = runnable[0] if runnable else None
    if best.runnable_in_lcx:
        reasons.append(f"lcx.train trains it with: {' '.join(train_overrides(best.policy))} (on the mesh and "
                       f"parameter sharding above)")
    if rb is not None and rb is not best:
        reasons.append(
            f"the recommendation needs {', '.join(missing_in_lcx(best.policy))}, which lcx.train lacks; the best "
            f"plan lcx.train runs today: {_where(rb)}, {rb.policy.label} (context degree {rb.context_degree}): "
            f"{rb.est.step_time:,.1f} s/step, {_gib(rb.est.memory.total)} per device, roofline MFU "
            f"{100 * rb.est.mfu:.1f}%")
    elif rb is None:
        runnable_pols = [p for p in pols if not missing_in_lcx(p)]
        own = [c for c in cands if c.runnable_in_lcx]
        line = (f"the recommendation needs {', '.join(missing_in_lcx(best.policy))}, which lcx.train lacks, and no "
                f"plan lcx.train runs today fits")
        if not own:
            line += " (no policy it runs was priced)"
        else:
            sm = min(own, key=lambda c: c.est.memory.total)
            line += (f": its smallest footprint is {_gib(sm.est.memory.total)} per device ({_where(sm)}, "
                     f"{sm.policy.label}; largest part: {_largest_part(sm)}) against {_gib(hw.hbm_bytes)} of {_limit_name(hw)}; "
                     + _what_would_fit(cfg, hw, n_devices, seq_len, global_batch, runnable_pols,
                                       what="a plan lcx.train runs", **kw))
        reasons.append(line)
    return Recommendation(best, rb, tuple(cands), tuple(reasons))


def _price(cfg, hw: Hardware, n_devices: int, seq_len: int, global_batch: int, pols: Sequence[ActivationPolicy], *,
           dtype: str, param_dtype: str, attention: AttentionConfig | None, window: int | None) -> list[Candidate]:
    cands: list[Candidate] = []
    for plan, sharding in candidate_plans(cfg, n_devices, seq_len, global_batch, attention=attention):
        # lcx.train tiles the local sequence: a tile count that does not divide it becomes the
        # nearest that does (a policy that then repeats another is priced once)
        T = seq_len // plan.context_degree(n_devices)
        own: list[ActivationPolicy] = []
        for pol in pols:
            if pol.vocab_tiling > 1 and T % pol.vocab_tiling:
                pol = dataclasses.replace(pol, vocab_tiling=valid_tiling(pol.vocab_tiling, T))
            if pol not in own:
                own.append(pol)
        for pol in own:
            est = estimate(cfg, plan, hw, n_devices, seq_len=seq_len, global_batch=global_batch, policy=pol,
                           dtype=dtype, param_dtype=param_dtype, window=window,
                           tie_embeddings=bool(getattr(cfg, "tie_embeddings", False)))
            cands.append(Candidate(plan, pol, est, sharding))
    return cands


def _fits(cfg, hw, n_devices, seq_len, global_batch, pols, **kw) -> Candidate | None:
    """The fitting candidate with the smallest context degree, then the fastest (None: none fits)."""
    fit = [c for c in _price(cfg, hw, n_devices, seq_len, global_batch, pols, **kw) if c.est.fits]
    return min(fit, key=lambda c: (c.context_degree, *_rank(c))) if fit else None


MAX_CHIP_FACTOR = 16
"""How far :func:`search` looks for more chips (x2, x4, ... x16) when nothing fits."""


def _what_would_fit(cfg, hw: Hardware, n_devices: int, seq_len: int, global_batch: int,
                    pols: Sequence[ActivationPolicy], *, what: str, **kw) -> str:
    """A sentence: the fewest more chips (doubling up to x :data:`MAX_CHIP_FACTOR`) and the
    longest sequence (a multiple of ``2 n_devices``, bisected) at which one of ``pols`` fits.
    Each probe is one pricing pass (milliseconds); at most ~30 of them."""
    chips = n_devices // hw.devices_per_chip
    parts = []
    # simulated CPU devices share one host's RAM: more of them leave the sum where it is
    k = 2 if hw.name != "cpu" else MAX_CHIP_FACTOR + 1
    while k <= MAX_CHIP_FACTOR:
        # on k times the devices the length must split over them: round up to a multiple of 2 n k
        unit_k = 2 * n_devices * k
        s_k = -(-seq_len // unit_k) * unit_k if seq_len % (n_devices * k) else seq_len
        c = _fits(cfg, hw, n_devices * k, s_k, global_batch, pols, **kw)
        if c is not None:
            parts.append(f"{k}x the chips (hardware.chips={chips * k}"
                         + (f", train.seq_len={s_k:,}" if s_k != seq_len else "")
                         + f": {_where(c)}, {c.policy.label}, {c.est.step_time:,.1f} s/step, "
                         f"{_gib(c.est.memory.total)} per device" + (f"; it needs {_lacks(c)}" if _lacks(c) else "") + ")")
            break
        k *= 2
    unit = 2 * n_devices  # zigzag-balanced at every context degree of this device count
    lo, hi = 0, (seq_len - 1) // unit  # lo: fits (0 = none known); hi: largest multiple below seq_len
    best_lo = _fits(cfg, hw, n_devices, unit, global_batch, pols, **kw) if hi >= 1 else None
    if best_lo is not None:
        lo = 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            c = _fits(cfg, hw, n_devices, mid * unit, global_batch, pols, **kw)
            if c is not None:
                lo, best_lo = mid, c
            else:
                hi = mid - 1
    if lo:
        parts.append(f"train.seq_len <= {lo * unit:,} on {chips} chips"
                     + (f" (it needs {_lacks(best_lo)})" if _lacks(best_lo) else ""))
    if not parts:
        if hw.name == "cpu":
            return (f"{what} fits at no shorter sequence on this machine's {chips} simulated devices (more of them "
                    "share the same RAM): use a smaller model")
        return (f"{what} fits neither on up to {MAX_CHIP_FACTOR}x the chips nor at a shorter sequence on {chips} "
                "chips: use a smaller model")
    return f"{what} fits with " + " or with ".join(parts)


NEAR_LIMIT = 0.05
"""A fitting plan whose total is within this fraction of the memory limit gets a warning: the
ledger is 0.92-1.06 of XLA's compiled footprint and counts neither heap packing loss nor
collective buffers (docs/cost_ledger.md: "treat fits with a margin of a few GiB")."""


def _near_limit(c: Candidate, hw: Hardware) -> str:
    """A warning sentence when ``c`` fits within :data:`NEAR_LIMIT` of the limit; empty otherwise."""
    if hw.hbm_bytes is None or c.est.memory.total < (1 - NEAR_LIMIT) * hw.hbm_bytes:
        return ""
    return (f"warning: {_gib(c.est.memory.total)} per device is within {_gib(hw.hbm_bytes - c.est.memory.total)} of "
            f"the {_gib(hw.hbm_bytes)} of {_limit_name(hw)} (less than a {100 * NEAR_LIMIT:.0f}% margin); the ledger does not count "
            f"XLA's heap packing loss or collective buffers, so it may not fit in practice")


def _lacks(c: Candidate) -> str:
    """``..., which lcx.train lacks`` for a hint whose policy lcx.train cannot run; empty if it can."""
    miss = missing_in_lcx(c.policy)
    return f"{', '.join(miss)}, which lcx.train lacks" if miss else ""


def _limit_name(hw: Hardware) -> str:
    # lcx.plan gives hardware=cpu each simulated device's share of the host RAM as its limit
    return "host RAM per simulated device" if hw.name == "cpu" else "HBM"


def _where(c: Candidate) -> str:
    return f"{c.plan.name} on {c.mesh_label}, params {c.param_sharding}"


def _largest_part(c: Candidate) -> str:
    m = c.est.memory
    parts = {"parameter+gradient+optimizer state": m.state, "saved activations": m.activations,
             "block backward": m.layer_working, "attention": m.attention, "logits": m.logits}
    k = max(parts, key=parts.get)
    return f"{k} {_gib(parts[k])}"


def _rank(c: Candidate) -> tuple:
    # host transfers hidden behind compute cost no time, so among equal step times prefer fewer
    # offloads (less host memory, less PCIe traffic), then less HBM
    p = c.policy
    offloads = (p.decoder_layer_input == "offload") + (p.context == "offload") + p.offload_optimizer + p.offload_params
    return (round(c.est.step_time, 6), offloads, p.vocab_tiling, c.est.memory.total)


def _gib(n: float | None) -> str:
    return "unlimited" if n is None else f"{n / 2**30:,.2f} GiB"


def table(rec: Recommendation, *, per_group: bool = True) -> str:
    """The candidates as a text table: per (strategy, mesh, param sharding) the fastest fitting
    policy (or the smallest footprint if none fits), sorted by context degree then step time."""
    groups: dict[tuple, Candidate] = {}
    for c in rec.candidates:
        key = (c.plan.name, c.mesh_label, c.param_sharding)
        cur = groups.get(key)
        if cur is None or _better(c, cur):
            groups[key] = c
    rows = sorted(groups.values() if per_group else rec.candidates,
                  key=lambda c: (c.context_degree, not c.est.fits, c.est.step_time))
    hdr = ("strategy", "mesh", "params", "policy", "P", "state", "acts", "work", "total", "host", "compute s",
           "exp.comm s", "exp.host s", "overlap", "fits", "MFU")
    body = []
    for c in rows:
        e, m = c.est, c.est.memory
        body.append((
            c.plan.name + ("*" if c is rec.best else ""), c.mesh_label, c.param_sharding, c.policy.label,
            str(c.context_degree), _g(m.state), _g(m.activations), _g(m.working),
            _g(m.total), _g(m.host), f"{e.compute_time:,.2f}", f"{e.exposed_comm_time:,.2f}",
            f"{e.exposed_host_time:,.2f}",
            {None: "-", True: "yes", False: "NO"}[e.overlap], "yes" if e.fits else "NO", f"{100 * e.mfu:.1f}%",
        ))
    w = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(hdr)]
    lines = ["  ".join(h.ljust(x) for h, x in zip(hdr, w)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(v.ljust(x) for v, x in zip(b, w)) for b in body]
    lines.append("memory in GiB per device: state = params + grads + optimizer on device; acts = saved "
                 "activations; work = block backward + attention + logits transients; host = offloaded. "
                 "exp.comm / exp.host: seconds of communication / host transfer not hidden behind compute. "
                 "* = recommended. MFU: roofline (model FLOPs / peak), an upper bound.")
    return "\n".join(lines)


def _better(c: Candidate, cur: Candidate) -> bool:
    if c.est.fits != cur.est.fits:
        return c.est.fits
    if c.est.fits:
        return _rank(c) < _rank(cur)
    return c.est.memory.total < cur.est.memory.total


def _g(n: float) -> str:
    return f"{n / 2**30:,.2f}"


def recommended_degree(rec: Recommendation) -> int | None:
    return None if rec.best is None else rec.best.context_degree


__all__ = ["Candidate", "Recommendation", "candidate_plans", "default_policies", "missing_in_lcx", "search", "table",
           "recommended_degree", "train_overrides", "valid_tiling"]
