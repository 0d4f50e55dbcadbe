"""What one device does in one training step, as the time model prices it.

:func:`step_work` turns the ledger's counts (FLOPs, communication bytes, the plan's attention
configuration) into a :class:`~lcx.cost.timing.StepWork`: kernel calls, collectives per kind,
the causal kernels' block waste. :func:`lcx.cost.estimate` calls it once per priced step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lcx.cost.balance import causal_imbalance
from lcx.cost.comm import CommBytes
from lcx.cost.timing import StepWork


def step_work(
    cfg,
    a,
    com: CommBytes,
    seq_len,
    window,
    n,
    imb,
    model_attention,
    replay,
    P,
    *,
    linear_flops: float,
    ring_size: int,
    p2p_bandwidth: float,
    collective_bandwidth: float,
    host_bytes: float,
    host_bandwidth: float,
    a2a_split_axis: bool,
    skipped_per_tile: float = 0.0,
    layers: int | None = None,
) -> StepWork:
    """The per-device :class:`~lcx.cost.timing.StepWork` of one step (``ring_size``: the ring's
    devices, 1 without a ring; a kernel call per ring step, layer and pass). ``window``: the
    tokens a query's keys span (a sliding window or a chunk; None: the sequence). ``layers``:
    the attention layers ``com``'s attention traffic and ``model_attention`` cover (one layer
    kind's; None: all ``cfg.n_layers``); the parameter collectives are always every layer's.

    Block waste under a causal mask: the diagonal tiles run whole, ``1 + block / S``; but a tile
    longer than the layout's chunk (zigzag ``S / 2P``, balanced ``S / kP``) holds tokens of two
    distant chunks, so the kernels' block test skips nothing and every pair runs: 2x."""
    L = cfg.n_layers
    La = L if layers is None else layers
    passes = 2 + (replay > 0)
    block = a.block_kv or a.block_q or 512
    span = min(seq_len, window) if window else seq_len
    return StepWork(
        attention_flops=model_attention / n * imb,
        attention_replay_flops=replay,
        linear_flops=linear_flops,
        block_waste=block_waste(a.layout, block, seq_len, span, P),
        kernel=a.kernel or "xla",
        head_dim=cfg.head_dim,
        kernel_calls=La * passes * ring_size,
        ring_bytes=com.ring,
        ring_hops=com.ring_hops,
        p2p_bandwidth=p2p_bandwidth,
        param_bytes=com.param_gather + com.grad_reduction,
        param_collectives=L * ((2 if com.param_gather else 0) + (1 if com.grad_reduction else 0)),
        kv_gather_bytes=com.all_gather,
        kv_collectives=La * passes if com.all_gather else 0,
        all_to_all_bytes=com.all_to_all,
        a2a_collectives=4 * La * passes if com.all_to_all else 0,
        collective_bandwidth=collective_bandwidth,
        host_bytes=host_bytes,
        host_bandwidth=host_bandwidth,
        a2a_split_axis=a2a_split_axis,
        # one visit per skipped tile and step, in the dK/dV backward (see skipped_tiles): the
        # forward's computed (head, tile) pairs are its FLOPs (a third of the model count) over
        # one tile's 4 bq bkv head_dim
        skipped_tiles=skipped_per_tile
        * (model_attention / n * imb / 3)
        / (4.0 * (a.block_q or block) * block * cfg.head_dim),
    )


def total_work(works: Sequence[StepWork]) -> StepWork:
    """The step's work from its layer kinds' (:func:`step_work` per kind, the linear, parameter
    and host parts in one of them): counts, FLOPs and bytes summed; the block waste the
    attention-FLOP-weighted mean (the time model multiplies the attention and replay FLOPs by it,
    and a kind's replay is proportional to its attention), so the attention time is the kinds'
    sum. Ring transfers then hide behind all kinds' attention together."""
    if len(works) == 1:
        return works[0]
    att = sum(w.attention_flops for w in works)
    waste = sum(w.attention_flops * w.block_waste for w in works) / att if att else 1.0
    summed = {
        f: sum(getattr(w, f) for w in works)
        for f in (
            "attention_flops",
            "attention_replay_flops",
            "linear_flops",
            "kernel_calls",
            "ring_bytes",
            "ring_hops",
            "param_bytes",
            "param_collectives",
            "kv_gather_bytes",
            "kv_collectives",
            "all_to_all_bytes",
            "a2a_collectives",
            "host_bytes",
            "skipped_tiles",
        )
    }
    return dataclasses.replace(
        works[0], block_waste=waste, a2a_split_axis=any(w.a2a_split_axis for w in works), **summed
    )


def attention_only(w: StepWork) -> StepWork:
    """``w`` without its linear, parameter and host parts: one layer kind's attention alone."""
    return dataclasses.replace(w, linear_flops=0.0, param_bytes=0.0, param_collectives=0, host_bytes=0.0)


def block_waste(layout: str, block: int, seq_len: int, span: int, P: int) -> float:
    """Executed / visible attention tiles of a causal kernel (see :func:`step_work`)."""
    from lcx.sharding.layout import balanced_chunks

    if P > 1 and layout != "contiguous":
        chunk = seq_len // (2 * P) if layout == "zigzag" else seq_len // (balanced_chunks(seq_len, P, block) * P)
        if block > chunk:
            return 2.0
    return 1.0 + min(block, span) / span


def skipped_tiles(layout: str, degree: int, seq_len: int, window: int | None) -> float:
    """Grid tiles a causal kernel visits but skips whole (the mask hides every pair), per computed
    tile, on the busiest of ``degree`` devices (:func:`step_work` turns it into visits).

    The splash kernels' dK/dV backward runs a static grid over the whole rectangle of its queries
    and keys, skipping a masked tile's FLOPs but not its grid step, while their forward runs a
    dynamic grid of the active tiles only (MaxText's tokamax splash,
    ``kernels/tokamax_splash_attention/splash_attention_mask_info.py``: ``process_mask`` defaults
    to ``return_dynamic_grid=True``, the dK/dV mask takes it only with ``dq_reduction_steps=3``).
    The model prices one visit per skipped tile and step, in that backward. Under a causal mask a
    device visits two tiles per computed one on average. The busiest device computes
    ``imbalance`` times the mean (:func:`lcx.cost.balance.causal_imbalance`, one document per row)
    and skips the rest of its rectangle: ``(2 - imbalance) / imbalance`` (1 balanced; ``1 / (2P -
    1)`` contiguous). A sliding window shorter than the sequence narrows the grid to its band: 0.
    Packed documents skip more tiles than this one-document count."""
    if window and window < seq_len:
        return 0.0
    imb = causal_imbalance(layout, degree)
    return max(0.0, 2.0 - imb) / imb
