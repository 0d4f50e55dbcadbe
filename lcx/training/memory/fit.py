"""The memory check of a training step: :func:`fit_step` (the one entry the training loop calls)
refuses, before anything compiles, a step whose tiles do not divide its sequence or that the cost
ledger says cannot fit, naming the fixes (:mod:`lcx.training.memory.fixes`).
"""

from __future__ import annotations

import logging

from lcx.cost.memory import DTYPE_BYTES
from lcx.cost.planner import divisors
from lcx.models import ModelConfig
from lcx.training.config import HardwareConfig, MemoryOptions, TrainConfig
from lcx.training.memory.estimate import MemoryCheck, host_parts, largest, memory_check, memory_parts
from lcx.training.memory.fixes import memory_fixes

log = logging.getLogger("lcx.training.loop")


def fit_step(
    model_cfg: ModelConfig,
    plan,
    n_devices: int,
    *,
    train: TrainConfig,
    memory: MemoryOptions,
    hardware: HardwareConfig,
    local_devices: int | None = None,
    check: bool = True,
) -> MemoryCheck | None:
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

    First, whatever ``check``: ``memory.vocab_tiling`` must divide the local sequence
    (:func:`check_tiling`).

    Args:
      model_cfg: the model.
      plan: the (unbound) plan.
      n_devices: devices of the run (all processes together; a dry run has only the count).
      train: the ``train`` section (``seq_len``, ``global_batch``).
      memory: the ``memory:`` options.
      hardware: the ``hardware`` preset.
      local_devices: devices of this process (None: all of them).
      check: ``train.check_memory``; False: only the tiling is checked.

    Returns:
      The :class:`MemoryCheck` (``fits`` None where this machine's RAM cannot be read), or None
      when ``check`` is off.

    Raises:
      ValueError: a tile count that does not divide the local sequence (names the nearest valid
        one); the estimate exceeds the limit (names both, the largest part and the fixes, each
        an override Hydra accepts).
    """
    n, S, B = n_devices, train.seq_len, train.global_batch
    P = plan.context_degree(n)
    check_tiling(memory, S // P, seq_len=S, context_degree=P)
    if not check:
        return None
    chk = memory_check(
        model_cfg, plan, n, seq_len=S, global_batch=B, hardware=hardware, memory=memory, local_devices=local_devices
    )
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
        what = (
            f"{gib(m.total + m.host)} per device x {k} simulated CPU devices = {gib(chk.need)} of host RAM, "
            f"but this machine has {gib(chk.limit)} available ({chk.limit_source})"
        )
        assert chk.limit is not None  # fits is known (False), so the RAM was read
        state_alone = state_min * k > chk.limit
    else:
        what = (
            f"{gib(m.total)} of HBM per device, but hardware.hbm_bytes is {gib(hw.hbm_bytes)}"
            if chk.over_hbm
            else f"{gib(m.host)} of offloaded bytes per device, but its share of host memory is {gib(chk.host_limit)}"
        )
        state_alone = chk.over_hbm and state_min > hw.hbm_bytes
    parts = memory_parts(m) if chk.on_cpu or chk.over_hbm else host_parts(m, chk.policy)
    big = largest(parts)
    fixes = memory_fixes(
        model_cfg,
        plan,
        m,
        state_min,
        state_alone,
        gib,
        on_cpu=chk.on_cpu,
        n=n,
        k=k,
        check=chk,
        reprice=lambda pol: memory_check(
            model_cfg, plan, n, seq_len=S, global_batch=B, hardware=hardware, local_devices=k, policy=pol
        ),
        local_seq=S // P,
    )
    raise ValueError(
        f"model={model_cfg.name} does not fit: the cost ledger estimates {what}; the largest part is {big} "
        f"({gib(parts[big])} per device); {fixes}. train.check_memory=false skips this check"
    )


def check_tiling(
    memory: MemoryOptions, local_seq_len: int, *, seq_len: int | None = None, context_degree: int | None = None
) -> None:
    """Refuse a ``memory.vocab_tiling`` that does not divide the local sequence ``local_seq_len``
    (tokens per device; ``seq_len`` and ``context_degree`` only name where it comes from).

    Raises:
      ValueError: names the value, the local sequence and the nearest valid tile counts.
    """
    n, t = memory.vocab_tiling, local_seq_len
    if t % n == 0:
        return
    divs = divisors(t)
    best = min(divs, key=lambda d: (abs(d - n), d))
    lower = max((d for d in divs if d < n), default=None)
    upper = min((d for d in divs if d > n), default=None)
    near = sorted({x for x in (lower, upper) if x is not None})
    where = (
        f" (train.seq_len={seq_len:,} / context degree {context_degree})"
        if seq_len is not None and context_degree is not None
        else ""
    )
    raise ValueError(
        f"memory.vocab_tiling={n} does not divide the local sequence of {t:,} tokens{where}: each tile is "
        f"{t:,} / N tokens of every device's shard; the nearest valid N is {best}"
        + (f" (valid neighbours: {', '.join(map(str, near))})" if len(near) > 1 else "")
        + f": use memory.vocab_tiling={best}"
    )
