"""Plan search: the smallest context-parallel degree that fits, then the fastest strategy at it.

MaxText's advice for long context (its context-parallelism docs) made a procedure: enumerate every
valid (data x context) mesh, strategy (all-gather, ring, Ulysses A2A, USP splits: what each
registered strategy proposes), parameter sharding (replicated or ZeRO-3 over all devices) and
activation policy (remat, host offload); price each with :func:`lcx.cost.ledger.estimate`; keep
those whose per-device memory fits; take the smallest context degree among them, and at that
degree the shortest predicted step. Pure arithmetic: nothing is compiled, no device is touched.

:func:`search` composes :mod:`lcx.cost.search` (candidates, prices, the choice) and
:mod:`lcx.cost.report` (the reasons in words, the table); their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from lcx.cost.hardware import Hardware
from lcx.cost.local import StepArgs, StepSizes
from lcx.cost.policy import ActivationPolicy
from lcx.cost.report import (
    MAX_CHIP_FACTOR as MAX_CHIP_FACTOR,
)
from lcx.cost.report import (
    NEAR_LIMIT as NEAR_LIMIT,
)
from lcx.cost.report import (
    FitHint as FitHint,
)
from lcx.cost.report import (
    explain as explain,
)
from lcx.cost.report import (
    no_candidates_reason as no_candidates_reason,
)
from lcx.cost.report import (
    nothing_fits as nothing_fits,
)
from lcx.cost.report import (
    recommended_degree as recommended_degree,
)
from lcx.cost.report import (
    table as table,
)
from lcx.cost.report import (
    what_would_fit as what_would_fit,
)
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
      The :class:`Recommendation` (``best`` None when nothing fits; ``reasons`` say why).
    """
    pols = list(policies) if policies is not None else default_policies(hw.host_memory_per_chip is not None)
    sizes = StepSizes(**{"tie_embeddings": bool(getattr(cfg, "tie_embeddings", False)), **step})
    q = Query(cfg, hw, n_devices, sizes, tuple(pols), attention=attention, window=window)
    cands = price(q)
    fitting = [c for c in cands if c.est.fits]
    if not fitting:
        return Recommendation(None, None, tuple(cands), tuple(nothing_fits(q, cands)))
    choice = choose(fitting)
    reasons = explain(q, cands, choice)
    return Recommendation(choice.best, choice.best_runnable, tuple(cands), tuple(reasons))


__all__ = [
    "Candidate",
    "Recommendation",
    "candidate_plans",
    "default_policies",
    "missing_in_lcx",
    "search",
    "table",
    "recommended_degree",
    "train_overrides",
    "valid_tiling",
]
