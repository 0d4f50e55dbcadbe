"""The advice of ``train.check_memory``: the fixes it names when a run does not fit, each priced
before it is offered and printed as an override Hydra accepts.

:func:`memory_fixes` is what :func:`lcx.training.memory.fit_step` appends to its refusal
(vocabulary tiling, host offload, parameter sharding, remat, shorter sequences, a smaller model);
it reprices candidate policies through the function it is given and reads the
:class:`~lcx.training.memory.estimate.MemoryCheck` values it gets back. It reads the estimate
(:mod:`~lcx.training.memory.estimate`) and is read by the refusal (:mod:`~lcx.training.memory.fit`).
"""

from __future__ import annotations

import dataclasses

from lcx.cost.planner import divisors
from lcx.models import ModelConfig
from lcx.training.memory.estimate import MemoryCheck, largest, memory_parts


def memory_fixes(
    model_cfg: ModelConfig,
    plan,
    m,
    state_min: float,
    state_alone: bool,
    gib,
    *,
    on_cpu: bool,
    n: int,
    k: int,
    check: MemoryCheck | None = None,
    reprice=None,
    local_seq: int | None = None,
) -> str:
    """The advice of :func:`lcx.training.memory.fit_step`: only changes that lower the estimate it compared.

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
            return (
                f"the parameters, gradients and AdamW state alone need {gib(state_min * k)} of host RAM (summed "
                f"over the {k} simulated devices, however they are sharded), so model={model_cfg.name} cannot fit "
                f"on this machine" + (f": use {smaller}" if smaller else "")
            )
        alone = (
            f"the parameters, gradients and AdamW state alone need {gib(state_min)} per device even sharded over "
            f"all {n} devices"
        )
        state_fix = _offload_fix(check, reprice, gib) if check is not None and reprice is not None else None
        return (
            alone
            + ": use "
            + (f"{state_fix}, or " if state_fix else "")
            + (f"{smaller} or " if smaller else "")
            + "more devices"
        )
    opts = []
    parts = memory_parts(m)
    big = largest(parts)
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
        fixes += (
            "; more simulated devices or more context parallelism do not help here: the devices share this "
            "machine's RAM, and the sum over them stays the same"
        )
        if tiny:
            fixes += "; model=tiny is the smallest preset: if none of these fit, the step cannot fit on this machine"
    return fixes


def _tiling_fix(check: MemoryCheck, reprice, local_seq: int, gib) -> str | None:
    """``vocabulary tiling (memory.vocab_tiling=N ...)`` with the smallest N > the current one
    that divides ``local_seq`` and makes the step fit; else the smallest at which the logits are
    no longer the largest part; None if no tile count lowers the estimate."""
    cur = check.policy.vocab_tiling
    divs = [d for d in divisors(local_seq) if d > cur]
    first_not_largest = None
    for d in divs:
        c = reprice(dataclasses.replace(check.policy, vocab_tiling=d))
        if c.fits:
            return _tiling_text(d, local_seq, check, c, gib, fits=True)
        if first_not_largest is None and largest(memory_parts(c.breakdown)) != "logits":
            first_not_largest = (d, c)
    if first_not_largest is not None:
        return _tiling_text(*first_not_largest[:1], local_seq, check, first_not_largest[1], gib, fits=False)
    return None


def _tiling_text(d: int, local_seq: int, check: MemoryCheck, c: MemoryCheck, gib, *, fits: bool) -> str:
    return (
        f"vocabulary tiling (memory.vocab_tiling={d}: the logits in {d} tiles of {local_seq // d:,} tokens, "
        f"{gib(c.breakdown.logits)} instead of {gib(check.breakdown.logits)} per device"
        + ("; then it fits" if fits else "")
        + ")"
    )


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
    return (
        f"host offload of the {' and '.join(f.split('_')[1].replace('params', 'parameters') for f in helped)} "
        f"({overrides}: {gib(c.need)} instead of {gib(check.need)} per device"
        + ("; then it fits" if c.fits else "")
        + ")"
    )


def _remat_full_fix(model_cfg: ModelConfig, check: MemoryCheck | None, reprice) -> str | None:
    """``remat (model.remat=full ...)`` when it lowers the estimate (always offered without a
    pricing function); the ``remat_*`` placements are reset, ModelConfig refuses them otherwise."""
    placed = [
        f"model.{f}={ModelConfig.__dataclass_fields__[f].default}"
        for f in ("remat_layer_input", "remat_context", "remat_qkv")
        if getattr(model_cfg, f) != ModelConfig.__dataclass_fields__[f].default
    ]
    text = "remat (model.remat=full" + "".join(" " + p for p in placed) + " keeps only each block's input)"
    if check is None or reprice is None:
        return text
    c = reprice(
        dataclasses.replace(check.policy, remat="full", decoder_layer_input="device", context="remat", qkv="remat")
    )
    return text if c.need < check.need else None
