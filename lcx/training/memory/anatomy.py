"""The dry run's memory anatomy (``train.dry_run=true``): the cost ledger's estimate of one step
by component, on device and on host, against the hardware's memory (:func:`memory_anatomy`).
"""

from __future__ import annotations

from lcx.models import ModelConfig
from lcx.training.config import TrainConfig
from lcx.training.memory.estimate import MemoryCheck, format_count, largest


def memory_anatomy(chk: MemoryCheck, model_cfg: ModelConfig, plan, train: TrainConfig) -> tuple[str, dict[str, int]]:
    """The dry run's text: the run, then the ledger's memory of one step by component, GiB per
    device (MiB for a step under 1 GiB on cpu), on device or on host, and what it is compared with.

    Args:
      chk: the estimate (:func:`lcx.training.memory.memory_check`) of the run.
      model_cfg: the model it priced.
      plan: the (unbound) plan it priced.
      train: the ``train`` section (``seq_len``, ``global_batch``).

    Returns:
      ``(text, host parts)``: the parts in host memory in bytes per device (``parameters``,
      ``optimizer``, ``activations``).
    """
    m, pol, hw, n = chk.breakdown, chk.policy, chk.hardware, chk.n_devices
    S, B = train.seq_len, train.global_batch
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
