"""The planner's reasons in words: why it chose what it chose, or why nothing fits.

Text only, from the numbers :func:`lcx.cost.planner.search` returns (a
:class:`~lcx.cost.search.Recommendation`: the candidates, the query, the
:class:`~lcx.cost.search.Choice`) and the searches of :mod:`lcx.cost.planner` for what would fit;
:func:`reasons` is the entry. Where a sentence depends on another (a hint that needs a policy
lcx.train lacks is followed by its runnable counterpart) it reads a structured value
(:class:`FitHint`), never the text of the sentence. The candidates' table is
:mod:`lcx.reports.candidates`; the time model's words are :mod:`lcx.reports.timing`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lcx.attention.strategies import get_strategy
from lcx.cost.hardware import Hardware
from lcx.cost.planner import MAX_CHIP_FACTOR, NEAR_LIMIT, longest_fit, more_chips, near_limit, nearest_with_candidates
from lcx.cost.search import (
    Candidate,
    Choice,
    Query,
    Recommendation,
    divisors,
    missing_in_lcx,
    strategy_meshes,
    train_overrides,
)
from lcx.reports.timing import time_words, versus_words
from lcx.sharding import Plan, PlanError
from lcx.sharding.plan import AttentionConfig


def reasons(rec: Recommendation) -> tuple[str, ...]:
    """Sentences explaining ``rec``: the choice and its runners-up (:func:`explain`), or, when
    nothing fits, the smallest footprint and what would fit (:func:`nothing_fits`)."""
    if rec.choice is None:
        return tuple(nothing_fits(rec.query, rec.candidates))
    return tuple(explain(rec.query, rec.candidates, rec.choice))


def no_candidates_reason(
    cfg,
    n_devices: int,
    seq_len: int,
    global_batch: int,
    *,
    devices_per_chip: int = 1,
    chips_key: str = "hardware.chips",
    attention: AttentionConfig | None = None,
) -> str:
    """Why :func:`~lcx.cost.search.candidate_plans` is empty here, and the nearest chip counts and
    sequence lengths at which it is not (:func:`~lcx.cost.planner.nearest_with_candidates`), for an
    error message; call it only when there is no candidate.

    The context degree P of a mesh is the device count over the data degree, which must divide
    the batch; the sequence must split into P (contiguous) or 2P (zigzag) chunks; A2A and USP
    need a Ulysses degree that the heads allow; ZeRO-3 needs ``embed`` divisible by the devices.
    The strategies and meshes tried are those of :func:`~lcx.cost.search.candidate_plans`.
    Each candidate check is a :meth:`~lcx.sharding.Plan.validate` call (microseconds).
    """
    dims = cfg.dims() if hasattr(cfg, "dims") else {}
    chips = n_devices // devices_per_chip
    degrees = [n_devices // d for d in divisors(n_devices) if global_batch % d == 0]
    why = []
    for P in degrees:
        if seq_len % P:
            why.append(
                f"P={P}: {seq_len:,} tokens is not a multiple of P={P} (contiguous layout) nor of 2P={2 * P} (zigzag)"
            )
            continue
        # the sequence splits; then every strategy failed for its own reason: collect them
        errs = set()
        for strat, sm in strategy_meshes(n_devices // P, P):
            for layout in ("zigzag", "contiguous"):
                att = dataclasses.replace(
                    attention or AttentionConfig(), strategy=strat, layout=layout, **dict(sm.attention)
                )
                try:
                    Plan(mesh=sm.mesh, activations=(("batch", "data"), ("seq", sm.seq)), attention=att).validate(
                        n_devices, dims=dims or None, seq_len=seq_len, global_batch=global_batch
                    )
                except PlanError as e:
                    errs.add(f"{sm.name}/{layout}: {e}")
        why.append(f"P={P}: " + "; ".join(sorted(errs)))
    if len(degrees) < len(divisors(n_devices)):
        why.append(
            f"no other context degree: the data degree ({n_devices} devices / P) must divide "
            f"train.global_batch={global_batch}"
        )

    near_chips, near_seq = nearest_with_candidates(
        cfg, n_devices, seq_len, global_batch, devices_per_chip=devices_per_chip, attention=attention
    )
    fixes = []
    if near_chips:
        fixes.append(f"{chips_key}=" + " or ".join(str(c) for c in near_chips))
    if near_seq:
        fixes.append(
            "train.seq_len=" + " or ".join(f"{s}" for s in near_seq) + f" (multiples of 2 x {n_devices} devices)"
        )
    return (
        f"no plan applies to {seq_len:,} tokens x {global_batch} sequence{'s' * (global_batch > 1)} on {chips} "
        f"chips = {n_devices} devices: " + "; ".join(why) + (f"; use {', or '.join(fixes)}" if fixes else "")
    )


def nothing_fits(q: Query, cands: Sequence[Candidate]) -> list[str]:
    """Sentences for a search where no candidate fits: the smallest footprint, and what would fit
    (for lcx.train's own policies too, when the first hint needs one it lacks)."""
    hw = q.hw
    out: list[str] = []
    smallest = min(cands, key=lambda c: c.est.memory.total) if cands else None
    if smallest is not None:
        hint = what_would_fit(q, what="any plan")
        out.append(
            f"nothing fits: the smallest footprint is {_gib(smallest.est.memory.total)} per device "
            f"({_where(smallest)}, {smallest.policy.label}; largest part: {_largest_part(smallest)}) against "
            f"{_gib(hw.hbm_bytes)} of {_limit_name(hw)}; " + hint.text
        )
        runnable = _runnable(q)
        if hint.needs_missing and runnable.policies:
            # a hint lcx.train cannot run needs its runnable counterpart next to it
            out.append(what_would_fit(runnable, what="a plan lcx.train runs today").text)
    return out


def explain(q: Query, cands: Sequence[Candidate], choice: Choice) -> list[str]:
    """Sentences explaining ``choice`` among ``cands`` (what :func:`~lcx.cost.search.choose`
    picked): the degree, the plan and its numbers, margins, ring overlap, layout, host offload,
    the runners-up and what lcx.train needs to run it."""
    hw, seq_len = q.hw, q.step.seq_len
    best, at, p_min = choice.best, choice.at, choice.context_degree
    out: list[str] = []
    degrees = sorted({c.context_degree for c in cands})
    smaller = [P for P in degrees if P < p_min]
    out.append(
        f"smallest context degree that fits: {p_min}"
        + (
            f" (degrees {smaller} do not fit in {_gib(hw.hbm_bytes)} per device with any strategy or policy)"
            if smaller
            else " (the only degree this batch and device count allow)"
            if len(degrees) == 1
            else ""
        )
    )
    e = best.est
    out.append(
        f"fastest at degree {p_min}: {best.plan.name} on {best.mesh_label}, params {best.param_sharding}, "
        f"{best.policy.label}: predicted {e.step_time:,.1f} s/step ({e.compute_time:,.1f} s compute, "
        f"{e.exposed_comm_time:,.2f} s exposed communication"
        + (f", {e.exposed_host_time:,.2f} s exposed host transfer" if e.exposed_host_time else "")
        + f"), {_gib(e.memory.total)} per device; "
        + time_words(e, hw, seq_len=seq_len, strategy=best.plan.attention.strategy, kernel=best.plan.attention.kernel)
    )
    if near_limit(best, hw):
        roomy = next((c for c in at if not near_limit(c, hw)), None)
        out.append(
            _near_limit_words(best, hw)
            + (
                f"; the fastest plan at this degree with that margin: {_where(roomy)}, {roomy.policy.label}: "
                f"{roomy.est.step_time:,.1f} s/step, {_gib(roomy.est.memory.total)} per device"
                + (f" (it needs {_lacks(roomy)})" if _lacks(roomy) else "")
                if roomy
                else ""
            )
        )
    if e.overlap is not None:
        out.append(
            f"ring overlap {'holds' if e.overlap else 'FAILS'}: {e.ring_block:,} tokens per hop vs c_min = "
            f"{e.ring_min_block:,.0f} (F/B with the GQA factor"
            + (", causal zigzag: half the pairs per hop)" if best.plan.attention.layout == "zigzag" else ")")
        )
    a = best.plan.attention
    imbalanced = any(
        (st := get_strategy(name)).imbalance_degree(p_min, st.all_to_all_degree(a, dict(best.plan.mesh))) > 1
        for name in a.strategy_names
    )
    if a.layout == "contiguous" and imbalanced:
        lo = seq_len // (2 * p_min) * (2 * p_min)
        out.append(
            f"{seq_len:,} tokens is not a multiple of 2P = {2 * p_min}, so the zigzag layout is impossible and the "
            f"contiguous layout costs a causal imbalance of up to (2P-1)/P; use train.seq_len={lo:,} or "
            f"{lo + 2 * p_min:,} to balance the work"
        )
    if e.host_bytes:
        out.append(
            f"host offload moves {_gib(e.host_bytes)} per device per step: {e.host_time:,.2f} s over the host link"
            + (
                f" ({e.exposed_host_time:,.2f} s not hidden behind compute)"
                if hw.host_bandwidth_per_chip
                else " (not priced: hardware.host_bandwidth_per_chip is unknown)"
            )
        )
    # one line per (strategy, param sharding): two rows that differ only in how the parameters
    # are sharded must be told apart
    others: dict[tuple[str, str], Candidate] = {}
    for c in at[1:]:
        others.setdefault((c.plan.name, c.param_sharding), c)
    ties, runners_up = 0, list(others.values())
    for i, c in enumerate(runners_up):
        a = c.plan.attention
        words, tie = versus_words(
            c.est,
            e,
            hw,
            seq_len=seq_len,
            strategy=a.strategy,
            kernel=a.kernel,
            best_strategy=best.plan.attention.strategy,
            best_kernel=best.plan.attention.kernel,
        )
        ties += tie
        if i < 4:
            out.append(
                f"  vs {c.plan.name}, params {c.param_sharding} ({c.policy.label}): "
                f"{c.est.step_time:,.1f} s/step ({words}), {_gib(c.est.memory.total)}"
            )
    tm = hw.time_model
    if ties and tm is not None and tm.error_median is not None:  # a tie needs the median error
        out.append(
            f"  {ties} of the {len(runners_up)} runners-up{' (4 shown)' if len(runners_up) > 4 else ''} "
            f"{'is' if ties == 1 else 'are'} 'a tie': closer to the recommendation than the {hw.name} time "
            f"model's held-out median error ({100 * tm.error_median:.1f}%), an order the calibrated time cannot "
            "resolve (docs/time_model.md, 'Strategy ranking'); choose among them by memory, or measure them"
        )
    rb = choice.best_runnable
    if best.runnable_in_lcx:
        out.append(
            f"lcx.train trains it with: {' '.join(train_overrides(best.policy))} (on the mesh and "
            f"parameter sharding above)"
        )
    if rb is not None and rb is not best:
        out.append(
            f"the recommendation needs {', '.join(missing_in_lcx(best.policy))}, which lcx.train lacks; the best "
            f"plan lcx.train runs today: {_where(rb)}, {rb.policy.label} (context degree {rb.context_degree}): "
            f"{rb.est.step_time:,.1f} s/step, {_gib(rb.est.memory.total)} per device, MFU "
            f"{100 * rb.est.mfu:.1f}% (roofline {100 * rb.est.roofline_mfu:.1f}%)"
        )
    elif rb is None:
        own = [c for c in cands if c.runnable_in_lcx]
        line = (
            f"the recommendation needs {', '.join(missing_in_lcx(best.policy))}, which lcx.train lacks, and no "
            f"plan lcx.train runs today fits"
        )
        if not own:
            line += " (no policy it runs was priced)"
        else:
            sm = min(own, key=lambda c: c.est.memory.total)
            line += (
                f": its smallest footprint is {_gib(sm.est.memory.total)} per device ({_where(sm)}, "
                f"{sm.policy.label}; largest part: {_largest_part(sm)}) against {_gib(hw.hbm_bytes)} of {_limit_name(hw)}; "
                + what_would_fit(_runnable(q), what="a plan lcx.train runs").text
            )
        out.append(line)
    return out


@dataclasses.dataclass(frozen=True)
class FitHint:
    """What would fit, in words, and whether a plan it names needs what lcx.train lacks.

    Attributes:
      text: the sentence.
      needs_missing: a hinted plan's policy is one :func:`~lcx.cost.search.missing_in_lcx`
        says lcx.train cannot run (its runnable counterpart should follow).
    """

    text: str
    needs_missing: bool = False


def what_would_fit(q: Query, *, what: str) -> FitHint:
    """What would fit, in words: the fewest more chips (:func:`~lcx.cost.planner.more_chips`,
    doubling up to x :data:`~lcx.cost.planner.MAX_CHIP_FACTOR`) and the longest sequence
    (:func:`~lcx.cost.planner.longest_fit`) at which one of ``q.policies`` fits."""
    hw, n_devices, seq_len = q.hw, q.n_devices, q.step.seq_len
    chips = n_devices // hw.devices_per_chip
    parts = []
    needs = False
    more = more_chips(q)
    if more is not None:
        k, s_k, c = more
        parts.append(
            f"{k}x the chips (hardware.chips={chips * k}"
            + (f", train.seq_len={s_k:,}" if s_k != seq_len else "")
            + f": {_where(c)}, {c.policy.label}, {c.est.step_time:,.1f} s/step, "
            f"{_gib(c.est.memory.total)} per device" + (f"; it needs {_lacks(c)}" if _lacks(c) else "") + ")"
        )
        needs = needs or bool(_lacks(c))
    shorter = longest_fit(q)
    if shorter is not None:
        s_max, c = shorter
        parts.append(f"train.seq_len <= {s_max:,} on {chips} chips" + (f" (it needs {_lacks(c)})" if _lacks(c) else ""))
        needs = needs or bool(_lacks(c))
    if not parts:
        if hw.name == "cpu":
            return FitHint(
                f"{what} fits at no shorter sequence on this machine's {chips} simulated devices (more "
                "of them share the same RAM): use a smaller model"
            )
        return FitHint(
            f"{what} fits neither on up to {MAX_CHIP_FACTOR}x the chips nor at a shorter sequence on "
            f"{chips} chips: use a smaller model"
        )
    return FitHint(f"{what} fits with " + " or with ".join(parts), needs)


def _near_limit_words(c: Candidate, hw: Hardware) -> str:
    """The warning sentence for ``c``, which fits within :data:`~lcx.cost.planner.NEAR_LIMIT` of
    the limit (:func:`~lcx.cost.planner.near_limit`)."""
    assert hw.hbm_bytes is not None  # near_limit is False without a limit
    return (
        f"warning: {_gib(c.est.memory.total)} per device is within {_gib(hw.hbm_bytes - c.est.memory.total)} of "
        f"the {_gib(hw.hbm_bytes)} of {_limit_name(hw)} (less than a {100 * NEAR_LIMIT:.0f}% margin); the ledger does not count "
        f"XLA's heap packing loss or collective buffers, so it may not fit in practice"
    )


def _runnable(q: Query) -> Query:
    """``q`` with only the policies lcx.train runs today."""
    return q.with_policies([p for p in q.policies if not missing_in_lcx(p)])


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
    parts = {
        "parameter+gradient+optimizer state": m.state,
        "saved activations": m.activations,
        "block backward": m.layer_working,
        "attention": m.attention,
        "logits": m.logits,
    }
    k = max(parts, key=lambda name: parts[name])
    return f"{k} {_gib(parts[k])}"


def _gib(n: float | None) -> str:
    return "unlimited" if n is None else f"{n / 2**30:,.2f} GiB"
