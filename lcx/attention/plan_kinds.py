"""A plan meets a model's layer kinds: each kind's strategy asked, before anything compiles,
whether it can run that kind (:func:`check_layer_kinds`).

A plan names one strategy for every layer or one per layer kind
(:meth:`lcx.sharding.AttentionConfig.strategy_for`); a model has one mask per layer kind
(``global``, ``sliding``: a window of W tokens, ``chunked``: aligned chunks of C tokens). The
run is refused when a kind has no strategy, or its strategy's
:meth:`~lcx.attention.strategies.AbstractStrategy.check_layer` refuses it (a global layer given
to a strategy for windowed layers; a window its exchange cannot reach).
"""

from __future__ import annotations

from collections.abc import Iterable

from lcx.attention.masks import Mask
from lcx.attention.strategies import get_strategy
from lcx.sharding import Plan


def check_layer_kinds(masks: Iterable[Mask], plan: Plan, n_devices: int, seq_len: int) -> None:
    """Refuse, before compiling, a plan that cannot run every layer kind of a model.

    Args:
      masks: the model's layer masks (one per layer or one per kind; repeats are checked once).
      plan: the plan that would run them.
      n_devices: devices of the mesh (resolves a ``-1`` mesh axis).
      seq_len: S, tokens of one sequence before the context split.

    Raises:
      PlanError: a kind the plan gives no strategy (``plan.attention.strategy`` is a mapping
        without it; the message says what to add), or the kind's strategy refuses it (its
        ``check_layer`` names the kind, the numbers and the fix).
    """
    shape = plan.mesh_shape(n_devices)
    for mask in dict.fromkeys(masks):
        get_strategy(plan.attention.strategy_for(mask.kind)).check_layer(mask, plan, shape, seq_len)
