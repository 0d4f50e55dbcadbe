"""The report of ``python -m lcx.plan``: the cost ledger of the given plan and the plan search.

:func:`run` prints the ``describe()`` table of the given plan (parameters from the model's logical
axes, activations by kind), the ledger of that plan, then the search table (every valid strategy
x context degree x parameter sharding, with the fastest fitting activation policy of each), the
recommendation with its reasons and the comparison with MaxText's published recipe
(:mod:`lcx.reports.maxtext`), and writes ``plan.json``. Pure arithmetic: no device is initialised
beyond JAX's default CPU backend for one abstract ``eval_shape`` of the model, nothing is
compiled, and no array of the sequence length exists, so 14M tokens take seconds.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

from lcx.cost.search import estimate_dict
from lcx.reports.candidates import table
from lcx.reports.config import PlanQuery
from lcx.reports.maxtext import compare_with_maxtext, recipe_differences, recipe_of
from lcx.reports.planner import no_candidates_reason, reasons
from lcx.reports.timing import kind_lines, time_words


def _model_arrays(model_cfg, param_dtype: str):
    """ArrayInfo of every parameter kind from the abstract model's logical axes (no device
    memory: ``eqx.filter_eval_shape``); the ledger's own shape list if lcx.models is unusable."""
    from lcx.cost.memory import DTYPE_BYTES, param_arrays
    from lcx.sharding.describe import ArrayInfo

    try:
        import equinox as eqx
        import jax

        from lcx.models import init_model, logical_axes

        abstract = eqx.filter_eval_shape(init_model, model_cfg, key=jax.random.key(0))
        leaves = jax.tree_util.tree_leaves_with_path(abstract)
        axes = jax.tree_util.tree_leaves(logical_axes(abstract), is_leaf=lambda x: isinstance(x, tuple))
        arrays = [l for l in leaves if hasattr(l[1], "shape")]
        out = []
        for (path, leaf), names in zip(arrays, axes):
            name = jax.tree_util.keystr(path).replace(".weight", "").lstrip(".").replace("blocks.", "")
            out.append(ArrayInfo(name, "param", tuple(names), tuple(leaf.shape), DTYPE_BYTES[str(leaf.dtype)]))
        return out, "lcx.models.logical_axes(abstract model)"
    except Exception as e:  # pragma: no cover - the ledger's mirror of the same shapes
        return param_arrays(model_cfg, param_dtype, tie_embeddings=model_cfg.tie_embeddings), f"ledger shapes ({e})"


def _check_kernel(att) -> None:
    """Refuse, before pricing, the kernel block sizes lcx.train would refuse: the kernel's own
    check (:func:`lcx.attention.kernels.make_kernel`; splash: ``block_q`` a multiple of 8, the
    other blocks multiples of 128, up to 16384), not a copy of it. Building the kernel object
    compiles nothing. Where splash's Pallas module is missing, its block sizes have already
    passed (the kernel checks them first) and the planner needs no kernel to price them.

    Raises:
      ValueError: an unknown kernel or block sizes it cannot tile; the message names the fix.
    """
    from lcx.attention.kernels import KernelNotAvailableError, make_kernel

    try:
        make_kernel(att.kernel, att.block_q, att.block_kv, att.block_q_dkv, att.block_kv_dkv)
    except KernelNotAvailableError:
        pass


@dataclasses.dataclass(frozen=True)
class _Job:
    """What one ``lcx.plan`` call prices, read and checked from the config (:func:`_job`).

    Attributes:
      model: the model; hw: the hardware preset for ``n`` devices (on cpu, ``hbm_bytes`` is each
        simulated device's share of the available host RAM, when it can be read); chips: chips in
        the slice (``hardware.chips``, or ``hardware.cpu_devices``; which one is ``chips_key``);
      devices_per_chip, n: devices per chip and in all; S: tokens per sequence; B: sequences per
        step; policy: the activation policy priced; rows: ``planner.rows`` (best | all);
      placeholder: the peak FLOP/s is cpu's placeholder (no probe); host_ram: (bytes, source) of
        the available host RAM on cpu, else None; packed: ``planner.packed_documents`` (rows
        pack several documents: each layout's measured imbalance, :mod:`lcx.cost.balance`).
    """

    model: Any
    hw: Any
    chips: int
    chips_key: str
    devices_per_chip: int
    n: int
    S: int
    B: int
    policy: Any
    rows: str
    placeholder: bool
    host_ram: tuple[float, str] | None
    packed: bool = False


SLICE_CHIPS: tuple[int, ...] = tuple(2**k for k in range(14))
"""Slice sizes :func:`smallest_slice` tries, in chips: 1, 2, 4, ..., 8,192."""


def smallest_slice(q: PlanQuery) -> int:
    """Chips of the smallest slice (a power of two, :data:`SLICE_CHIPS`) on which some plan fits
    the model at ``q.seq_len`` x ``q.global_batch`` in device memory: what ``lcx.plan`` prices when
    ``hardware.chips`` is not set (it says so).

    Raises:
      ValueError: nothing fits even on the largest slice (names it and the fix).
    """
    from lcx.cost import hardware_from_config, search
    from lcx.cost.local import StepSizes

    hwc, m = q.hardware, q.model
    step = StepSizes.of_model(m, q.seq_len, q.global_batch, packed_documents=q.planner.packed_documents).args()
    for chips in SLICE_CHIPS:
        n = chips * hwc.devices_per_chip
        hw = hardware_from_config(hwc, n, probe=False, probe_time_model=False)
        rec = search(m, hw, n, attention=dataclasses.replace(q.plan.attention), window=m.sliding_window, **step)
        if rec.best is not None:
            print(
                f"hardware.chips not set: pricing the smallest slice on which a plan fits, {chips} chips "
                f"(set hardware.chips=<chips> for another)",
                file=sys.stderr,
            )
            return chips
    raise ValueError(
        f"hardware={hwc.name}: no slice of up to {SLICE_CHIPS[-1]} chips fits model={m.name} at train.seq_len="
        f"{q.seq_len} x train.global_batch={q.global_batch}; set hardware.chips, or a shorter sequence"
    )


def _job(q: PlanQuery) -> _Job:
    """The checked settings of ``q`` (errors as :func:`run`'s, in the order a reader meets them)."""
    from lcx.cost import ActivationPolicy, hardware_from_config, host_memory_available

    model_cfg, hwc = q.model, q.hardware
    devices_per_chip = hwc.devices_per_chip
    chips = hwc.chips if hwc.chips is not None else hwc.cpu_devices
    chosen = chips is None
    if chips is None:
        chips = smallest_slice(q)
    n = chips * devices_per_chip
    probe = q.planner.probe_cpu
    hw = hardware_from_config(hwc, n, probe=probe, probe_time_model=probe)
    host_ram = None
    if hw.name == "cpu" and hw.hbm_bytes is None:
        # the simulated devices share this machine's RAM (what lcx.train's memory check compares
        # with): each device's share is its limit, so "fits" here means lcx.train would not refuse it
        host_ram = host_memory_available()
        if host_ram is not None:
            hw = dataclasses.replace(hw, hbm_bytes=host_ram[0] / n)
    S, B, mem = q.seq_len, q.global_batch, q.memory
    # the model's own remat policy and placements, unless the memory section prices another
    placed = {k: getattr(mem, k) for k in ("remat", "decoder_layer_input", "context", "qkv")}
    policy = ActivationPolicy.from_model(
        model_cfg,
        **{k: v for k, v in placed.items() if v is not None},
        offload_optimizer=mem.offload_optimizer,
        offload_params=mem.offload_params,
        vocab_tiling=mem.vocab_tiling,
    )
    return _Job(
        model=model_cfg,
        hw=hw,
        chips=chips,
        chips_key="hardware.chips" if hwc.chips is not None or chosen else "hardware.cpu_devices",
        devices_per_chip=devices_per_chip,
        n=n,
        S=S,
        B=B,
        policy=policy,
        rows=q.planner.rows,
        placeholder=hwc.peak_flops_per_device is None and not probe,  # cpu without the probe
        host_ram=host_ram,
        packed=q.planner.packed_documents,
    )


def _header(job: _Job, kv: int) -> list[str]:
    """The opening lines: model, devices, tokens per step, peak FLOP/s, memory per device and the
    KV bytes per token (``kv``)."""
    from lcx.training.memory import format_count

    m, hw, n, S, B, host_ram = job.model, job.hw, job.n, job.S, job.B, job.host_ram
    lines = [
        f"lcx.plan: {m.name} ({format_count(m.n_params)} parameters), {hw.name} x {job.chips} chips = {n} "
        f"devices, {S:,} tokens x {B} sequence{'s' * (B > 1)} per step"
    ]
    tf = hw.peak_flops_per_device / 1e12
    if hw.name == "cpu":
        mem_line = (
            f"memory: {host_ram[0] / 2**30:,.2f} GiB of host RAM available ({host_ram[1]}), shared by the {n} "
            f"simulated devices: {hw.hbm_bytes / 2**30:,.2f} GiB each, the limit 'fits' is judged against"
            if host_ram is not None
            else "memory: this machine's available RAM cannot be read, so 'fits' is not checked on cpu"
        )
    else:
        mem_line = f"HBM {'unlimited' if hw.hbm_bytes is None else f'{hw.hbm_bytes / 2**30:,.1f} GiB'} per device"
    lines.append(
        f"  peak {f'{tf:,.1f}' if tf >= 0.1 else f'{tf:.3g}'} TFLOP/s per device"
        + (" (a placeholder: planner.probe_cpu=true measures this machine)" if job.placeholder else "")
        + (f"\n  {mem_line}" if hw.name == "cpu" else f", {mem_line}")
    )
    lines.append(
        f"  KV per token (16-bit, all layers): {kv:,} bytes = {kv / 2**20:.4g} MiB; {kv * S / 2**30:,.1f} GiB "
        f"for the whole sequence"
    )
    return lines


def _given(job: _Job, given, arrays, source: str, say) -> tuple[dict[str, Any], Any]:
    """Describe and price the given plan (``say`` each line); its report entry and estimate (None
    when the plan does not apply here: the entry says why)."""
    from lcx.attention import check_layer_kinds
    from lcx.cost import estimate
    from lcx.cost.kinds import layer_groups
    from lcx.cost.local import StepSizes
    from lcx.cost.memory import activation_arrays
    from lcx.sharding import PlanError
    from lcx.sharding.describe import describe
    from lcx.training.memory import MemoryOptions, check_tiling

    m, hw, n, S, B, policy = job.model, job.hw, job.n, job.S, job.B, job.policy
    report: dict[str, Any] = {"plan": given.to_config(), "policy": dataclasses.asdict(policy)}
    try:
        given.validate(n, dims=m.dims(), seq_len=S, global_batch=B)
        check_layer_kinds((g.mask for g in layer_groups(m, window=m.sliding_window)), given, n, S)
        # the tile count lcx.train would refuse (it must divide the local sequence) is not priced
        P = given.context_degree(n)
        check_tiling(MemoryOptions(vocab_tiling=policy.vocab_tiling), S // P, seq_len=S, context_degree=P)
        say(f"== describe(): the given plan (plan={given.name}); parameters from {source}")
        say(describe(given, n, [*arrays, *activation_arrays(m, S, B, m.dtype)]))
        step = StepSizes.of_model(m, S, B, packed_documents=job.packed).args()
        e = estimate(m, given, hw, n, policy=policy, window=m.sliding_window, **step)
    except (PlanError, ValueError) as err:
        say(f"== the given plan (plan={given.name}) does not apply here: {err}")
        report["error"] = str(err)
        return report, None
    say("")
    say(f"== ledger of the given plan with {policy.label}")
    say(
        f"  model FLOPs/step {e.flops.total:.4e} (linear {e.flops.linear:.3e}, attention {e.flops.attention:.3e} = "
        f"{100 * e.flops.attention_fraction:.1f}%), recompute {e.recompute_flops:.3e} (not in MFU)"
    )
    say("  per device: " + ", ".join(f"{k} {v / 2**30:,.2f} GiB" for k, v in e.memory.as_dict().items()))
    say(
        "  communication per device: "
        + ", ".join(
            f"{k} {v / 2**30:,.2f} GiB" for k, v in e.comm.as_dict().items() if k not in ("ring_hops", "ring_hop_bytes")
        )
    )
    plan = given
    say(
        f"  compute {e.compute_time:,.2f} s, communication {e.comm_time:,.2f} s ({e.exposed_comm_time:,.2f} s exposed), "
        f"step {e.step_time:,.2f} s, fits {e.fits}"
    )
    say("  " + time_words(e, hw, seq_len=S, strategy=plan.attention.strategy, kernel=plan.attention.kernel))
    say("  per layer kind (attention only):")
    for line in kind_lines(e):
        say("  " + line)
    if e.host_bytes:
        say(
            f"  host offload: {e.host_bytes / 2**30:,.2f} GiB per device per step over the host link, "
            + (
                f"{e.host_time:,.2f} s ({e.exposed_host_time:,.2f} s not hidden behind compute)"
                if hw.host_bandwidth_per_chip
                else "not priced (hardware.host_bandwidth_per_chip is null)"
            )
        )
    if e.overlap is not None:
        say(
            f"  ring: {e.ring_block:,} tokens per hop, overlap needs >= {e.ring_min_block:,.0f}: "
            f"{'holds' if e.overlap else 'FAILS'}"
        )
    report["estimate"] = estimate_dict(e)
    return report, e


def _search(job: _Job, given, arrays, say) -> dict[str, Any]:
    """Search every plan (``say`` the table, the recommendation, the MaxText comparison and the
    recommended plan's ``describe()``); the report's search entries.

    Raises:
      PlanError: no candidate (the message says which split fails and what would work).
    """
    from lcx.cost import search
    from lcx.cost.local import StepSizes
    from lcx.cost.memory import activation_arrays
    from lcx.sharding import PlanError
    from lcx.sharding.describe import describe

    m, hw, n, S, B = job.model, job.hw, job.n, job.S, job.B
    attention = dataclasses.replace(given.attention)
    step = StepSizes.of_model(m, S, B, packed_documents=job.packed).args()
    rec = search(m, hw, n, attention=attention, window=m.sliding_window, **step)
    if not rec.candidates:
        # an empty table and a blank recommendation say nothing: say which split failed
        raise PlanError(
            no_candidates_reason(
                m,
                n,
                S,
                B,
                devices_per_chip=job.devices_per_chip,
                chips_key=job.chips_key,
                attention=dataclasses.replace(given.attention),
            )
        )
    say(f"== search: {len(rec.candidates)} candidates (strategy x mesh x param sharding x activation policy)")
    say(table(rec, per_group=job.rows != "all"))
    say("")
    say("== recommendation")
    why = reasons(rec)
    for r in why:
        say("  " + r)
    say("")
    say("  " + compare_with_maxtext(rec, m, hw, n, S, B, attention=given.attention).replace("\n", "\n  "))
    if rec.best is not None:
        say("")
        say(f"== describe(): the recommended plan ({rec.best.plan.name})")
        say(describe(rec.best.plan, n, [*arrays, *activation_arrays(m, S, B, m.dtype)]))
    return {
        "recommendation": None if rec.best is None else rec.best.as_dict(),
        "recommended_runnable_in_lcx": None if rec.best_runnable is None else rec.best_runnable.as_dict(),
        "reasons": list(why),
        "candidates": [c.as_dict() for c in rec.candidates],
    }


def run(q: PlanQuery, out_dir: str | pathlib.Path | None = None) -> dict[str, Any]:
    """Price the plan ``q`` gives, search all plans, print, and write ``plan.json``.

    Returns:
      The JSON-able report (also written to ``out_dir/plan.json`` when ``out_dir`` is given).

    Raises:
      ValueError / PlanError: a hardware preset without ``chips`` on which nothing fits up to
        8,192 chips (without ``chips`` the smallest slice that fits is priced); chips,
        sequence length or batch not a whole number >= 1; ``planner.rows`` not best/all; kernel
        block sizes lcx.train refuses (splash: ``block_q`` a multiple of 8, the others of 128); no
        candidate plan for this length, batch and device count (the message says which split fails
        and what would work).
    """
    from lcx.cost.memory import kv_cache_bytes_per_token

    job = _job(q)
    m, hw, n = job.model, job.hw, job.n
    kv = kv_cache_bytes_per_token(m.n_layers, m.n_kv_heads, m.head_dim, 2)
    lines = [*_header(job, kv), ""]
    say = lines.append

    given = q.plan
    _check_kernel(given.attention)
    arrays, source = _model_arrays(m, m.param_dtype)
    given_report, e = _given(job, given, arrays, source, say)
    pub = q.published
    recipe = recipe_of(hw.name, pub.step_time_s) if pub and e is not None else None
    differs = recipe_differences(recipe, given, job.policy, n, job.S, job.B) if recipe else []
    if differs and pub is not None:
        # an override changed the experiment's recipe: its published step is not this run's
        say(f"  published: {pub.step_time_s:,.2f} s/step, but this run is not that one ({'; '.join(differs)})")
    elif pub and e is not None:
        # the published step is the experiment's own recipe, the given plan and policy priced above
        say(
            f"  published (MaxText tpu-recipes, this plan and policy): {pub.step_time_s:,.2f} s/step, MFU "
            f"{100 * pub.mfu:.2f}%; the ledger's MFU of that step time: "
            f"{100 * e.flops.total / (pub.step_time_s * hw.peak_flops_per_device * n):.2f}%; measured / "
            f"roofline = {pub.step_time_s / e.roofline_step_time:.2f}"
            + (
                f"; the calibrated {e.step_time:,.1f} s is {100 * (e.step_time / pub.step_time_s - 1):+.1f}% "
                "from the published step"
                if e.calibrated
                else ""
            )
        )
    say("")

    report: dict[str, Any] = {
        "model": m.to_dict(),
        "hardware": dataclasses.asdict(hw),
        "chips": int(job.chips),
        "n_devices": n,
        "seq_len": job.S,
        "global_batch": job.B,
        "kv_bytes_per_token": kv,
        "given": given_report,
    }
    if q.planner.search:
        report.update(_search(job, given, arrays, say))
    print("\n".join(lines))
    if out_dir is not None:
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"\nwrote {out / 'plan.json'}", file=sys.stderr)
    return report
