"""Context-parallel attention strategies and their registry.

A fifth strategy is one new file with a final :class:`AbstractStrategy` subclass (its program,
its plan rules, its price) plus one line in :data:`STRATEGIES`. Everything else in lcx finds it
here: the plan accepts its name and runs its rules (through the one plug-in lookup of the
bottom layer, :func:`lcx.sharding.attention_config.strategy_class`, a function-local import of
:func:`get_strategy`), the cost ledger prices it and the planner tries its meshes; nothing else
branches on a strategy's name.
"""

from __future__ import annotations

from lcx.attention.strategies.a2a import Ulysses
from lcx.attention.strategies.allgather import AllGather
from lcx.attention.strategies.base import AbstractContextStrategy, AbstractStrategy, Strategy
from lcx.attention.strategies.halo import Halo
from lcx.attention.strategies.pricing import AttentionShard, RingHop, SearchMesh, Traffic
from lcx.attention.strategies.ring import Ring, merge_partials
from lcx.attention.strategies.usp import USP
from lcx.sharding.attention_config import lookup

STRATEGIES: dict[str, type[AbstractStrategy]] = {
    "allgather": AllGather,
    "ring": Ring,
    "a2a": Ulysses,
    "usp": USP,
    "halo": Halo,
}
"""``plan.attention.strategy`` name -> final strategy class. The planner tries them in this order
(a tie in its ranking goes to the earlier one)."""


def get_strategy(name: str) -> type[AbstractStrategy]:
    """The final strategy class registered as ``name``.

    Raises:
      ValueError: no strategy of that name (the message lists the registered ones).
    """
    return lookup(STRATEGIES, name, "strategy")


__all__ = [
    "AbstractContextStrategy",
    "AbstractStrategy",
    "AllGather",
    "AttentionShard",
    "Halo",
    "merge_partials",
    "Ring",
    "RingHop",
    "SearchMesh",
    "Strategy",
    "Traffic",
    "Ulysses",
    "USP",
]
