"""Plan search: the smallest context-parallel degree that fits, then the fastest strategy at it.

MaxText's advice for long context (its context-parallelism docs) made a procedure: enumerate every
valid (data x context) mesh, strategy (all-gather, ring, Ulysses A2A, USP splits: what each
registered strategy proposes), parameter sharding (replicated or ZeRO-3 over all devices) and
activation policy (remat, host offload); price each with :func:`lcx.cost.ledger.estimate`; keep
those whose per-device memory fits; take the smallest context degree among them, and at that
degree the shortest predicted step. Pure arithmetic: nothing is compiled, no device is touched.

:func:`search` composes :mod:`lcx.cost.search` (candidates, prices, the choice; its names are
re-exported here); what would fit when nothing does (:func:`more_chips`, :func:`longest_fit`,
:func:`nearest_with_candidates`) and the memory margin (:func:`near_limit`) are searched here too.
The answer is numbers only: :mod:`lcx.reports.planner` says why in words and
:mod:`lcx.reports.candidates` lays the candidates out as a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from lcx.cost.hardware import Hardware
from lcx.cost.local import StepArgs, StepSizes
from lcx.cost.policy import ActivationPolicy
from lcx.cost.search import (
    LCX_REMAT as LCX_REMAT,
)
from lcx.cost.search import (
    Candidate as Candidate,
)
from lcx.cost.search import (
    Choice as Choice,
)
from lcx.cost.search import (
    Query as Query,
)
from lcx.cost.search import (
    Recommendation as Recommendation,
)
from lcx.cost.search import (
    candidate_plans as candidate_plans,
)
from lcx.cost.search import (
    choose as choose,
)
from lcx.cost.search import (
    default_policies as default_policies,
)
from lcx.cost.search import (
    divisors as divisors,
)
from lcx.cost.search import (
    fits as fits,
)
from lcx.cost.search import (
    missing_in_lcx as missing_in_lcx,
)
from lcx.cost.search import (
    price as price,
)
from lcx.cost.search import (
    rank as rank,
)
from lcx.cost.search import (
    train_overrides as train_overrides,
)
from lcx.cost.search import (
    valid_tiling as valid_tiling,
)
from lcx.sharding.plan import AttentionConfig


def search(
    cfg,
    hw: Hardware,
    n_devices: int,
    *,
    attention: AttentionConfig | None = None,
    policies: Sequence[ActivationPolicy] | None = None,
    window: int | None = None,
    **step: Unpack[StepArgs],
) -> Recommendation:
    """Price every candidate and recommend one (see the module docstring for the rule).

    Args:
      cfg: model config (dimensions; ``dims()`` for the plan's head checks).
      hw: hardware preset (peak, bandwidths, HBM and host memory per device).
      n_devices: devices of the step.
      attention: the base attention config (kernel, blocks) every candidate starts from.
      policies: activation policies to try (default :func:`default_policies`).
      window: sliding-window length (tokens) for the attention FLOPs, or None.
      **step: the step's sizes and dtypes (:class:`~lcx.cost.local.StepArgs`: ``seq_len``,
        ``global_batch``, ``dtype``, ``param_dtype``; ``tie_embeddings`` defaults to the
        model's).

    Returns:
      The :class:`Recommendation` (``best`` None when nothing fits; ``choice`` None then too).
    """
    pols = list(policies) if policies is not None else default_policies(hw.host_memory_per_chip is not None)
    sizes = StepSizes(**{"tie_embeddings": bool(getattr(cfg, "tie_embeddings", False)), **step})
    q = Query(cfg, hw, n_devices, sizes, tuple(pols), attention=attention, window=window)
    cands = price(q)
    fitting = [c for c in cands if c.est.fits]
    if not fitting:
        return Recommendation(None, None, tuple(cands), q, None)
    choice = choose(fitting)
    return Recommendation(choice.best, choice.best_runnable, tuple(cands), q, choice)


def recommended_degree(rec: Recommendation) -> int | None:
    return None if rec.best is None else rec.best.context_degree


NEAR_LIMIT = 0.05
"""A fitting plan whose total is within this fraction of the memory limit is near it: the
ledger is 0.92-1.06 of XLA's compiled footprint and counts neither heap packing loss nor
collective buffers (docs/cost_ledger.md: "treat fits with a margin of a few GiB")."""


def near_limit(c: Candidate, hw: Hardware) -> bool:
    """``c`` fits within :data:`NEAR_LIMIT` of the per-device memory limit (never without one)."""
    return hw.hbm_bytes is not None and c.est.memory.total >= (1 - NEAR_LIMIT) * hw.hbm_bytes


MAX_CHIP_FACTOR = 16
"""How far :func:`more_chips` looks for more chips (x2, x4, ... x16) when nothing fits."""


def more_chips(q: Query) -> tuple[int, int, Candidate] | None:
    """The fewest more devices (``k`` = 2, 4, ... :data:`MAX_CHIP_FACTOR` times ``q.n_devices``)
    at which one of ``q.policies`` fits: ``(k, seq_len, candidate)``, the length rounded up to a
    multiple of ``2 n k`` where ``n k`` devices do not split it. None where none fits, and always
    on ``cpu``: simulated devices share one host's RAM, so more of them leave the sum where it is.
    Each probe is one pricing pass (milliseconds)."""
    if q.hw.name == "cpu":
        return None
    n_devices, seq_len = q.n_devices, q.step.seq_len
    k = 2
    while k <= MAX_CHIP_FACTOR:
        # on k times the devices the length must split over them: round up to a multiple of 2 n k
        unit_k = 2 * n_devices * k
        s_k = -(-seq_len // unit_k) * unit_k if seq_len % (n_devices * k) else seq_len
        c = fits(q.at(n_devices=n_devices * k, seq_len=s_k))
        if c is not None:
            return k, s_k, c
        k *= 2
    return None


def longest_fit(q: Query) -> tuple[int, Candidate] | None:
    """The longest sequence shorter than ``q``'s, a multiple of ``2 n_devices`` (zigzag-balanced
    at every context degree of this device count), at which one of ``q.policies`` fits, and the
    candidate that fits there; bisected, at most ~20 pricing passes. None: none fits."""
    unit = 2 * q.n_devices
    hi = (q.step.seq_len - 1) // unit  # the largest multiple below seq_len
    best = fits(q.at(seq_len=unit)) if hi >= 1 else None
    if best is None:
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        c = fits(q.at(seq_len=mid * unit))
        if c is not None:
            lo, best = mid, c
        else:
            hi = mid - 1
    return lo * unit, best


def nearest_with_candidates(
    cfg,
    n_devices: int,
    seq_len: int,
    global_batch: int,
    *,
    devices_per_chip: int = 1,
    attention: AttentionConfig | None = None,
) -> tuple[list[int], list[int]]:
    """Where :func:`candidate_plans` is empty: the nearest chip counts below and above (up to 4x)
    at which it is not, and the nearest sequence lengths (multiples of ``2 n_devices``, the one
    below and the one above ``seq_len``) at which it is not, on these devices.

    Returns:
      ``(chip counts, sequence lengths)``, each ascending, each possibly empty.
    """

    def has(n: int, s: int) -> bool:
        return bool(candidate_plans(cfg, n, s, global_batch, attention=attention))

    chips = n_devices // devices_per_chip
    below = next((c for c in range(chips - 1, 0, -1) if has(c * devices_per_chip, seq_len)), None)
    above = next((c for c in range(chips + 1, 4 * chips + 2) if has(c * devices_per_chip, seq_len)), None)
    unit = 2 * n_devices  # zigzag-balanced at every context degree of this device count
    lo = seq_len // unit * unit
    near_seq = [s for s in dict.fromkeys((lo, lo + unit)) if s > 0 and has(n_devices, s)]
    return [c for c in (below, above) if c is not None], near_seq


__all__ = [
    "Candidate",
    "Recommendation",
    "candidate_plans",
    "default_policies",
    "longest_fit",
    "missing_in_lcx",
    "more_chips",
    "near_limit",
    "nearest_with_candidates",
    "search",
    "recommended_degree",
    "train_overrides",
    "valid_tiling",
]
