"""MaxText's published long-context recipes and the like-with-like comparison ``python -m lcx.plan``
prints after its recommendation (AI-Hypercomputer/tpu-recipes,
``training/{v5p,ironwood}/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md``).

The ledger prices each recipe itself (its mesh, ring with load balancing, and its whole policy)
at the published length, batch and chip count, so its roofline faces the measured step.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MaxTextRecipe:
    """One row of MaxText's published long-context tables (AI-Hypercomputer/tpu-recipes,
    ``training/{v5p,ironwood}/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md``):
    Llama 3.1 8B variant, 64 chips, ring attention with load balancing, weights sharded over
    fsdp and context, num_vocab_tiling 16.

    Attributes:
      hardware: preset name; seq_len: tokens; global_batch: sequences (pdbs x devices);
      context, fsdp: ``ici_context_parallelism`` and ``ici_fsdp_parallelism`` (lcx: the
        ``context`` and ``data`` mesh axes, parameters ZeRO-3 over both);
      policy: the recipe's remat_policy, decoder_layer_input / context placements, optimizer /
        parameter host offload and vocab tiling as keyword arguments of
        :class:`lcx.cost.ActivationPolicy`; flags: the same in MaxText's words;
      step_s: measured seconds per step; mfu: measured MFU as published (a range where several
        runs were).
    """

    hardware: str
    seq_len: int
    global_batch: int
    context: int
    fsdp: int
    policy: tuple[tuple[str, Any], ...]
    flags: str
    step_s: float
    mfu: str


def _recipe(hw, S, B, cp, fsdp, flags, step_s, mfu, **pol) -> MaxTextRecipe:
    return MaxTextRecipe(hw, S, B, cp, fsdp, tuple(sorted({"vocab_tiling": 16, **pol}.items())), flags, step_s, mfu)


_C = dict(remat="custom", qkv="remat")  # MaxText's custom: query/key/value_proj recomputed (its default)
_MAXTEXT: tuple[MaxTextRecipe, ...] = (
    _recipe(
        "tpu_v5p",
        65536,
        32,
        4,
        16,
        "remat custom, context=device, decoder_layer_input=device",
        10.25,
        "67.3%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu_v5p",
        262144,
        8,
        16,
        4,
        "remat custom, context=offload, decoder_layer_input=offload",
        26.31,
        "68.1%",
        **_C,
        context="offload",
        decoder_layer_input="offload",
    ),
    _recipe(
        "tpu_v5p",
        1048576,
        2,
        64,
        1,
        "remat custom, context=offload, decoder_layer_input=device",
        95.73,
        "64.9-68.7%",
        **_C,
        context="offload",
    ),
    _recipe(
        "tpu_v5p",
        2097152,
        2,
        64,
        1,
        "remat custom, context=offload, decoder_layer_input=offload",
        357.68,
        "67.6-69.9%",
        **_C,
        context="offload",
        decoder_layer_input="offload",
    ),
    _recipe(
        "tpu_v5p",
        4194304,
        2,
        64,
        1,
        "remat custom, context=offload, decoder_layer_input=offload",
        1373.73,
        "69.5-70.3%",
        **_C,
        context="offload",
        decoder_layer_input="offload",
    ),
    _recipe("tpu_v5p", 10485760, 1, 64, 1, "remat full", 8056.40, "36.7%", remat="full"),
    _recipe(
        "tpu_v5p",
        14680064,
        1,
        64,
        1,
        "remat custom, context=remat, decoder_layer_input=offload",
        15623.09,
        "37.1%",
        **_C,
        context="remat",
        decoder_layer_input="offload",
    ),
    _recipe(
        "tpu7",
        65536,
        64,
        2,
        64,
        "remat custom, context=device, decoder_layer_input=device",
        5.31,
        "51.7%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu7",
        262144,
        16,
        8,
        16,
        "remat custom, context=device, decoder_layer_input=device",
        14.08,
        "50.7%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu7",
        1048576,
        4,
        32,
        4,
        "remat custom, context=device, decoder_layer_input=device",
        49.58,
        "50.0-50.9%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu7",
        2097152,
        2,
        64,
        2,
        "remat custom, context=device, decoder_layer_input=device",
        94.60,
        "50.8-51.0%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu7",
        4194304,
        1,
        128,
        1,
        "remat custom, context=device, decoder_layer_input=device",
        186.48,
        "50.9%",
        **_C,
        context="device",
    ),
    _recipe(
        "tpu7",
        10485760,
        1,
        128,
        1,
        "remat custom, context=device, decoder_layer_input=device, optimizer_memory_host_offload",
        1124.12,
        "52.1-52.5%",
        **_C,
        context="device",
        offload_optimizer=True,
    ),
    _recipe(
        "tpu7",
        14680064,
        1,
        128,
        1,
        "remat custom, context=offload, decoder_layer_input=offload, "
        "optimizer_memory_host_offload, parameter_memory_host_offload",
        2361.05,
        "48.7-48.8%",
        **_C,
        context="offload",
        decoder_layer_input="offload",
        offload_optimizer=True,
        offload_params=True,
    ),
    _recipe(
        "tpu7",
        16777216,
        1,
        128,
        1,
        "remat custom, context=offload, decoder_layer_input=offload, "
        "optimizer_memory_host_offload, parameter_memory_host_offload",
        3082.71,
        "48.8%",
        **_C,
        context="offload",
        decoder_layer_input="offload",
        offload_optimizer=True,
        offload_params=True,
    ),
)
"""MaxText's published long-context runs, each with its whole policy, so that a comparison
prices the same thing MaxText measured (the tpu-recipes tables above)."""


def recipes() -> tuple[MaxTextRecipe, ...]:
    """MaxText's published long-context recipe rows (the tpu-recipes tables)."""
    return _MAXTEXT


def fitted_in_calibration(r: MaxTextRecipe) -> bool:
    """Whether ``experiments/ledger_calibration.py`` fits the time model on row ``r``: in each
    hardware's table, rows sorted by length, the 1st, 3rd, ... are fitted and the others held out."""
    own = sorted((x for x in _MAXTEXT if x.hardware == r.hardware), key=lambda x: x.seq_len)
    return own.index(r) % 2 == 0


def recipe_of(hardware: str, step_s: float) -> MaxTextRecipe | None:
    """The published recipe row of ``hardware`` measured at ``step_s`` seconds (None: none)."""
    return next((r for r in _MAXTEXT if r.hardware == hardware and abs(r.step_s - step_s) < 5e-3), None)


def recipe_differences(r: MaxTextRecipe, plan, policy, n: int, S: int, B: int) -> list[str]:
    """How a run of ``plan`` and ``policy`` on ``n`` devices at ``S`` tokens x ``B`` differs from
    recipe ``r`` as lcx prices it (:func:`recipe_plan`; block sizes aside): empty when it is the
    recipe, so that comparing its step time with the published one is like with like."""
    from lcx.cost import ActivationPolicy

    if (n, S, B) != (r.context * r.fsdp, r.seq_len, r.global_batch):
        return [f"{n} devices at {S:,} tokens x {B}, not {r.context * r.fsdp} at {r.seq_len:,} x {r.global_batch}"]
    want, a, pol = recipe_plan(r, plan.attention), plan.attention, ActivationPolicy(**dict(r.policy))
    checks = (
        ("mesh", plan.mesh_shape(n), want.mesh_shape(n)),
        ("parameter sharding", plan.param_rules, want.param_rules),
        ("activation sharding", plan.activation_rules, want.activation_rules),
        *((k, getattr(a, k), getattr(want.attention, k)) for k in ("strategy", "layout", "kernel")),
        ("policy", policy.label, pol.label),
    )
    return [f"{what} {got}, not {exp}" for what, got, exp in checks if got != exp]


def recipe_plan(r: MaxTextRecipe, attention):
    """The lcx plan of recipe ``r``: its fsdp x context mesh, weights ZeRO-3 over both, ring with
    load balancing (zigzag) on the splash kernel (what MaxText runs on TPU), at ``attention``'s
    blocks."""
    from lcx.sharding import Plan

    return Plan(
        mesh=(("data", r.fsdp), ("context", r.context)),
        params=(("embed", ("data", "context")),),
        activations=(("batch", "data"), ("seq", "context")),
        attention=dataclasses.replace(attention, strategy="ring", layout="zigzag", kernel="splash"),
        name=f"maxtext_{r.seq_len}",
    )


def compare_with_maxtext(rec, model_cfg, hw, n: int, S: int, B: int, attention=None) -> str:
    """A paragraph comparing the recommendation with MaxText's published recipe for the nearest
    case (same hardware and device count, the published length closest to ``S``), like with
    like: the ledger prices the recipe itself (its mesh, ring with load balancing, and its whole
    policy: remat placements, vocabulary tiling, optimizer / parameter offload) at the published
    length, batch and chip count, so its roofline faces the measured step; then the recipe's
    policy at this run's length where that differs, beside the recommendation.

    Args:
      attention: the given plan's :class:`~lcx.sharding.AttentionConfig` (blocks of the hardware
        preset); the recipe runs it as ring + zigzag on the splash kernel, whatever the given one.
    """
    from lcx.cost import ActivationPolicy, estimate
    from lcx.cost.local import StepSizes
    from lcx.sharding import AttentionConfig, PlanError

    if rec.best is None:
        return "MaxText comparison: nothing fits, so there is nothing to compare."
    cases = [r for r in _MAXTEXT if r.hardware == hw.name and r.context * r.fsdp == n]
    if not cases or "longctx" not in model_cfg.name:
        return (
            "MaxText comparison: MaxText publishes long-context recipes only for the llama3_1_8b_longctx variant "
            "on 64 tpu_v5p chips (64 devices) and 64 tpu7 chips (128 devices); none matches this case."
        )
    r = min(cases, key=lambda c: abs(c.seq_len - S))
    att = attention or AttentionConfig()
    pol = ActivationPolicy(**dict(r.policy))
    gib = lambda b: f"{b / 2**30:,.2f} GiB"  # noqa: E731

    def priced(seq, batch):
        try:
            plan = recipe_plan(r, att)
            plan.validate(n, dims=model_cfg.dims(), seq_len=seq, global_batch=batch)
            step = StepSizes.of_model(model_cfg, seq, batch).args()
            return estimate(model_cfg, plan, hw, n, policy=pol, window=model_cfg.sliding_window, **step)
        except (PlanError, ValueError):
            return None

    def mem(e):
        return f"{gib(e.memory.total)} HBM + {gib(e.memory.host)} host per device, " + (
            "fits" if e.fits else "does NOT fit"
        )

    same = (r.seq_len, r.global_batch) == (S, B)
    lines = [
        f"MaxText comparison (like with like): its published {r.hardware} recipe at {r.seq_len:,} tokens x "
        f"{r.global_batch} sequence{'s' * (r.global_batch > 1)}"
        + ("" if same else f" (nearest to {S:,} x {B})")
        + f" on {n // hw.devices_per_chip} chips: ring with load balancing at context {r.context} x fsdp {r.fsdp}, "
        f"{r.flags}, num_vocab_tiling 16 (lcx: {pol.label}); measured {r.step_s:,.2f} s/step, MFU {r.mfu} "
        "(tpu-recipes README)."
    ]
    e_pub = priced(r.seq_len, r.global_batch)
    if e_pub is not None:
        lines.append(
            f"The ledger on that same run (mesh, strategy and policy): roofline {e_pub.roofline_step_time:,.1f} s/step "
            f"(MFU {100 * e_pub.roofline_mfu:.1f}%), {mem(e_pub)}; measured / roofline = "
            f"{r.step_s / e_pub.roofline_step_time:.2f}"
            + (
                f"; at the calibrated rates {e_pub.step_time:,.1f} s/step (MFU {100 * e_pub.mfu:.1f}%), "
                f"{100 * (e_pub.step_time / r.step_s - 1):+.1f}% from the measured {r.step_s:,.2f} s, a row the "
                + ("fit used" if fitted_in_calibration(r) else "fit held out")
                + " (docs/time_model.md)."
                if e_pub.calibrated
                else f": attention is {100 * e_pub.flops.attention_fraction:.1f}% of the model FLOPs, so that factor "
                "is the kernel's efficiency on the chip, which the roofline does not model."
            )
        )
    e_here = e_pub if same else priced(S, B)
    b = rec.best
    e = b.est
    rp = b.policy
    line = f"lcx recommends {b.plan.name} on {b.mesh_label}, params {b.param_sharding}, {rp.label}: " + (
        "the same strategy and context degree"
        if (b.plan.attention.strategy == "ring" and b.context_degree == r.context)
        else f"context degree {b.context_degree} (the recipe's: {r.context})"
    )
    diff = _policy_difference(rp, pol)
    line += f"; {'the same policy' if not diff else 'its policy differs from the recipe: ' + diff}"
    if e_here is not None:
        line += (
            f". At {S:,} x {B}: the recommendation {e.step_time:,.1f} s/step, {gib(e.memory.total)} HBM + "
            f"{gib(e.memory.host)} host per device; the recipe's policy on its mesh {e_here.step_time:,.1f} "
            f"s/step, {mem(e_here)}"
        )
    else:
        line += (
            f". At {S:,} x {B} the recipe's mesh does not apply; its measured step scaled by (S / {r.seq_len:,})^2 "
            f"would take about {r.step_s * (S / r.seq_len) ** 2:,.0f} s"
        )
    lines.append(line + ".")
    return "\n".join(lines)


def _policy_difference(p, q) -> str:
    """What policy ``p`` does differently from ``q``, in words (empty: the same)."""
    out = []
    if p.remat != q.remat:
        out.append(f"remat {p.remat} (recipe: {q.remat})")
    for f, name in (("decoder_layer_input", "block input"), ("context", "context"), ("qkv", "q/k/v")):
        if getattr(p, f) != getattr(q, f) and (f == "decoder_layer_input" or "custom" in (p.remat, q.remat)):
            out.append(f"{name} {getattr(p, f)} (recipe: {getattr(q, f)})")
    for f, name in (("offload_optimizer", "optimizer host offload"), ("offload_params", "parameter host offload")):
        if getattr(p, f) != getattr(q, f):
            out.append(("with " if getattr(p, f) else "without ") + name)
    if p.vocab_tiling != q.vocab_tiling:
        out.append(f"vocab tiling {p.vocab_tiling} (recipe: {q.vocab_tiling})")
    return ", ".join(out)
