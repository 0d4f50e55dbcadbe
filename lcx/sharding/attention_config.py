"""The attention part of a plan: :class:`AttentionConfig` and the plug-in lookup it uses.

A plan names its context-parallel strategy (one for every layer, or one per layer kind:
:class:`KindStrategies`) and per-device kernel; the names it accepts and the rules each one adds
are the registered classes' (:data:`lcx.attention.strategies.STRATEGIES`,
:data:`lcx.attention.kernels.KERNELS`), looked up here, in ONE place of the bottom layer.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from lcx.sharding.blocks import BlockSizes
from lcx.sharding.errors import PlanError
from lcx.sharding.layout import LAYOUTS

T = TypeVar("T")

# The ONE plug-in lookup of the bottom layer. Strategies and kernels register in
# lcx.attention.strategies.STRATEGIES / lcx.attention.kernels.KERNELS, and a plan asks them for
# their names and their rules (mesh axes, head divisibility) through _registry: an import at
# call time, because lcx.attention itself imports lcx.sharding.
_REGISTRIES = {"strategy": ("lcx.attention.strategies", "STRATEGIES"), "kernel": ("lcx.attention.kernels", "KERNELS")}


def _registry(kind: str) -> Mapping[str, Any]:
    module, attr = _REGISTRIES[kind]
    return getattr(importlib.import_module(module), attr)


def lookup(registry: Mapping[str, T], name: str, kind: str) -> T:
    """``registry[name]`` (the ``plan.attention.<kind>`` named ``name``).

    Raises:
      ValueError: no such name; the message lists the registered ones.
    """
    try:
        return registry[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention {kind} {name!r}; choose one of {tuple(registry)}") from None


def strategy_class(name: str):
    """The registered final strategy class of ``plan.attention.strategy`` ``name``.

    Raises:
      PlanError: unknown name (the message lists the registered ones).
    """
    return _plan_lookup("strategy", name)


def kernel_class(name: str):
    """The registered final kernel class of ``plan.attention.kernel`` ``name``.

    Raises:
      PlanError: unknown name (the message lists the registered ones).
    """
    return _plan_lookup("kernel", name)


def _plan_lookup(kind: str, name: str):
    try:
        return lookup(_registry(kind), name, kind)
    except ValueError as e:
        raise PlanError(str(e)) from None


class _RegistryNames(Sequence):
    """The names a registry holds, read when used (so a registered plug-in is a name here too)."""

    def __init__(self, kind: str):
        self._kind = kind

    def _names(self) -> tuple[str, ...]:
        return tuple(_registry(self._kind))

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other) -> bool:
        return self._names() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


LAYER_KINDS = ("global", "sliding", "chunked")
"""The layer kinds a plan names strategies by (``lcx.attention.Mask.kind``): ``global`` (no window),
``sliding`` (a sliding window) and ``chunked`` (aligned chunks)."""


class KindStrategies(Mapping[str, str]):
    """``plan.attention.strategy`` given per layer kind: an immutable, hashable mapping from a kind
    of :data:`LAYER_KINDS` to a registered strategy name (YAML ``{global: ring, sliding: halo}``).

    Kinds are kept in :data:`LAYER_KINDS` order, so equal mappings compare, hash and print equal.

    Raises:
      PlanError: an empty mapping, a kind not in :data:`LAYER_KINDS` or a strategy that is not
        registered (the message names the value and the choices).
    """

    __slots__ = ("_items",)

    def __init__(self, strategies: Mapping[str, str]):
        if not strategies:
            raise PlanError(
                f"plan.attention.strategy is an empty mapping; give one strategy name, or one per layer kind "
                f"of {LAYER_KINDS} (e.g. {{global: ring, sliding: halo}})"
            )
        for kind, name in strategies.items():
            if kind not in LAYER_KINDS:
                raise PlanError(f"unknown layer kind {kind!r} in plan.attention.strategy; the kinds are {LAYER_KINDS}")
            if not isinstance(name, str):
                raise PlanError(
                    f"plan.attention.strategy.{kind} is {name!r}; it must be one strategy name of {tuple(STRATEGIES)}"
                )
            try:
                strategy_class(name)
            except PlanError as e:
                raise PlanError(f"plan.attention.strategy.{kind}: {e}") from None
        self._items = tuple((k, str(strategies[k])) for k in LAYER_KINDS if k in strategies)

    def __getitem__(self, kind: str) -> str:
        for k, name in self._items:
            if k == kind:
                return name
        raise KeyError(kind)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k}: {n}" for k, n in self._items) + "}"


STRATEGIES: Sequence[str] = _RegistryNames("strategy")
"""Strategy names a plan accepts: those of :data:`lcx.attention.strategies.STRATEGIES`."""
KERNELS: Sequence[str] = _RegistryNames("kernel")
"""Kernel names a plan accepts: those of :data:`lcx.attention.kernels.KERNELS`."""


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Context-parallel attention configuration (``plan.attention`` in Hydra).

    Attributes:
      strategy: ``allgather`` (K/V all-gathered, Llama 3 style), ``a2a`` (DeepSpeed-Ulysses
        all-to-all from sequence to head sharding), ``ring`` (K/V rotate peer to peer with
        logsumexp merge), ``usp`` (A2A over ``ulysses_axis``, ring over ``ring_axis``;
        Fang & Zhao 2024, arXiv:2405.07719), or any other registered name: one name for every
        layer, or a mapping from layer kind (:data:`LAYER_KINDS`) to a name, e.g.
        ``{"global": "ring", "sliding": "halo"}`` (held as :class:`KindStrategies`; read it
        through :meth:`strategy_for`). The strategies of one plan share its mesh.
      kernel: per-device kernel, ``xla`` (blockwise flash attention in plain JAX) or ``splash``
        (Pallas splash attention; interpret mode off TPU).
      layout: sequence layout applied once in the data pipeline, ``contiguous``, ``zigzag`` or
        ``balanced`` (per row, from its positions and segment ids: packed documents).
      ulysses_axis: USP only: the mesh axis of the all-to-all.
      ring_axis: USP only: the mesh axis of the ring.
      allow_kv_replication: A2A/USP: when the Ulysses degree exceeds the number of KV heads and is
        a multiple of it, replicate each KV head only as many times as needed. If False, refuse.
      block_q: query block in tokens for the blockwise kernels.
      block_kv: key/value block in tokens for the blockwise kernels.
      block_q_dkv: query block in tokens of the backward pass (None: ``block_q``); named after
        splash's ``BlockSizes.block_q_dkv`` (MaxText's ``sa_block_q_dkv``). The xla kernel uses
        it in its one fused dQ/dK/dV pass, splash in its dK/dV pass.
      block_kv_dkv: key/value block in tokens of the backward pass (None: ``block_kv``). The
        xla kernel's backward holds three float32 ``[B, K, block_kv_dkv, G * block_q_dkv]``
        tiles at once (the forward about one), so smaller backward blocks shrink that fixed
        cost (128 instead of 256 keys halves it) while the forward keeps its own blocks.

    The four block fields are the Hydra keys; code downstream takes them as one value,
    :attr:`blocks` (:class:`~lcx.sharding.blocks.BlockSizes`, which checks them).
    """

    strategy: str | Mapping[str, str] = "allgather"  # a Mapping is held as KindStrategies
    kernel: str = "xla"
    layout: str = "zigzag"
    ulysses_axis: str = "ulysses"
    ring_axis: str = "ring"
    allow_kv_replication: bool = True
    block_q: int = 512
    block_kv: int = 512
    block_q_dkv: int | None = None
    block_kv_dkv: int | None = None

    def __post_init__(self):
        if isinstance(self.strategy, Mapping):
            if not isinstance(self.strategy, KindStrategies):
                object.__setattr__(self, "strategy", KindStrategies(self.strategy))
        elif isinstance(self.strategy, str):
            strategy_class(self.strategy)
        else:
            raise PlanError(
                f"plan.attention.strategy is {self.strategy!r}; give one strategy name of {tuple(STRATEGIES)} or a "
                f"mapping from layer kind {LAYER_KINDS} to one (e.g. {{global: ring, sliding: halo}})"
            )
        kernel_class(self.kernel)
        if self.layout not in LAYOUTS:
            raise PlanError(f"unknown sequence layout {self.layout!r}; choose one of {LAYOUTS}")
        try:
            # the four block sizes (>= 1), then the kernel's own tiling rules (splash and tokamax:
            # Mosaic's (8, 128) tiles), so a plan a TPU cannot lower is refused when it is built
            kernel_class(self.kernel).check_blocks(self.blocks)
        except ValueError as e:
            raise PlanError(str(e)) from None
        except NotImplementedError:
            pass  # the kernel's library is missing here: refused by name when the kernel is built

    def strategy_for(self, kind: str) -> str:
        """The strategy name that runs the layers of ``kind`` (a :data:`LAYER_KINDS` name).

        Raises:
          PlanError: an unknown kind, or a kind the per-kind mapping gives no strategy (the
            message says what to add to ``plan.attention.strategy``).
        """
        if kind not in LAYER_KINDS:
            raise PlanError(f"unknown layer kind {kind!r}; the kinds are {LAYER_KINDS}")
        if isinstance(self.strategy, str):
            return self.strategy
        if kind not in self.strategy:
            raise _no_strategy(kind, self.strategy)
        return self.strategy[kind]

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The distinct strategy names the plan uses, in :data:`LAYER_KINDS` order."""
        if isinstance(self.strategy, str):
            return (self.strategy,)
        return tuple(dict.fromkeys(self.strategy.values()))

    def strategy_config(self) -> str | dict[str, str]:
        """``strategy`` as plain values (a name, or a dict kind -> name) for YAML and JSON."""
        return self.strategy if isinstance(self.strategy, str) else dict(self.strategy)

    @property
    def blocks(self) -> BlockSizes:
        """The kernel's forward and backward blocks as one value."""
        return BlockSizes(self.block_q, self.block_kv, self.block_q_dkv, self.block_kv_dkv)


def _no_strategy(kind: str, strategies: Mapping[str, str]) -> PlanError:
    # a suggestion: the strategy the mapping already uses for another windowed kind, else its first
    other = strategies.get("sliding") or strategies.get("chunked") or next(iter(strategies.values()))
    return PlanError(
        f"{kind} layers have no strategy: add {kind}: <name> to plan.attention.strategy {strategies!r} "
        f"(e.g. {kind}: {other}; strategies: {tuple(STRATEGIES)})"
    )
