"""Context-parallel attention strategies and their registry.

A fifth strategy is one new file with a final :class:`Strategy` subclass plus one line in
:data:`STRATEGIES` (and its name in ``lcx.sharding.plan.STRATEGIES`` so plans accept it).
"""

from __future__ import annotations

from lcx.attention.strategies.a2a import Ulysses as Ulysses
from lcx.attention.strategies.allgather import AllGather as AllGather
from lcx.attention.strategies.base import Strategy as Strategy
from lcx.attention.strategies.ring import Ring as Ring
from lcx.attention.strategies.ring import merge_partials as merge_partials
from lcx.attention.strategies.ring import ring_attention as ring_attention
from lcx.attention.strategies.usp import USP as USP

STRATEGIES: dict[str, type[Strategy]] = {
    "allgather": AllGather,
    "a2a": Ulysses,
    "ring": Ring,
    "usp": USP,
}
"""``plan.attention.strategy`` name -> final strategy class."""
