"""One training step as the ledger prices it, and what one device of a plan holds of it.

Two small values the ledger's functions share instead of repeating their keywords:

- :class:`StepArgs`, the keywords every pricing function takes (``seq_len=``, ``global_batch=``,
  ``dtype=``, ...), typed once (PEP 692: ``**step: Unpack[StepArgs]``), and :class:`StepSizes`,
  the same values with their defaults filled in;
- :class:`LocalStep`, one device's share of the step under a plan: mesh sizes, local batch and
  tokens, and per layer kind of the model (:class:`KindShare`) the strategy class the plan gives
  it and its attention layer (:class:`AttentionShard`), which the memory
  (:mod:`lcx.cost.breakdown`), communication (:mod:`lcx.cost.comm`) and time
  (:mod:`lcx.cost.ledger`) ledgers all read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable, Mapping
from typing import Any, Required, TypedDict, TypeVar

from lcx.attention.strategies import AbstractStrategy, AttentionShard, get_strategy
from lcx.cost.dtypes import dtype_bytes
from lcx.cost.flops import ModelDims
from lcx.cost.kinds import LayerGroup, layer_groups
from lcx.sharding import Plan
from lcx.sharding import axes as ax

T = TypeVar("T")


class StepArgs(TypedDict, total=False):
    """Keywords of one training step's sizes and dtypes (:class:`StepSizes` has the defaults).

    Keys:
      seq_len: tokens per sequence S (required).
      global_batch: sequences per step B (required).
      dtype: activation (compute) dtype name (default ``bfloat16``).
      param_dtype: parameter, gradient and optimizer-state dtype name (default ``float32``).
      tie_embeddings: the output head is the embedding's transpose (no ``head`` parameter;
        default False).
      packed_documents: rows pack several documents under a causal + document mask, so each
        layout's causal imbalance is its measured one (:mod:`lcx.cost.balance`; default False:
        one document per row).
    """

    seq_len: Required[int]
    global_batch: Required[int]
    dtype: str
    param_dtype: str
    tie_embeddings: bool
    packed_documents: bool


@dataclasses.dataclass(frozen=True)
class StepSizes:
    """:class:`StepArgs` with the defaults filled in (``StepSizes(**step)``)."""

    seq_len: int
    global_batch: int
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    tie_embeddings: bool = False
    packed_documents: bool = False

    @classmethod
    def of_model(cls, cfg: Any, seq_len: int, global_batch: int, *, packed_documents: bool = False) -> StepSizes:
        """``global_batch`` sequences of ``seq_len`` tokens in a model config's dtypes and head
        (``dtype``, ``param_dtype``, ``tie_embeddings`` of :class:`lcx.models.ModelConfig`);
        ``packed_documents``: rows pack several documents under a document mask (the model's
        ``document_mask`` must be on for it to count)."""
        packed = bool(packed_documents and getattr(cfg, "document_mask", False))
        return cls(seq_len, global_batch, cfg.dtype, cfg.param_dtype, bool(cfg.tie_embeddings), packed)

    def args(self) -> StepArgs:
        """The keywords again (to pass on as ``**step``)."""
        return StepArgs(
            seq_len=self.seq_len,
            global_batch=self.global_batch,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            tie_embeddings=self.tie_embeddings,
            packed_documents=self.packed_documents,
        )


@dataclasses.dataclass(frozen=True)
class KindShare:
    """The layers of one kind (one mask) on one device under a plan.

    Attributes:
      group: the layers' mask and count (:class:`~lcx.cost.kinds.LayerGroup`).
      strategy: the registered strategy class the plan gives the kind
        (``plan.attention.strategy_for(kind)``).
      attention: one such attention layer on this device (U from that strategy's all-to-all
        degree).
    """

    group: LayerGroup
    strategy: type[AbstractStrategy]
    attention: AttentionShard

    @property
    def kind(self) -> str:
        return self.group.kind

    @property
    def layers(self) -> int:
        return self.group.layers


@dataclasses.dataclass(frozen=True)
class LocalStep:
    """One device's share of a training step under a plan.

    Attributes:
      shape: mesh axis sizes for the step's device count (``plan.mesh_shape``).
      context_degree: P, devices the sequence is split over.
      local_batch: b = max(1, B / data degree), sequences per device.
      tensor_degree: devices the heads are split over (the ``heads`` activation rule).
      kinds: the model's layers by kind, each with its strategy and attention layer, in the
        order the kinds first appear (one for a uniform model).
    """

    shape: Mapping[str, int]
    context_degree: int
    local_batch: int
    tensor_degree: int
    kinds: tuple[KindShare, ...]

    @classmethod
    def of(cls, cfg: ModelDims, plan: Plan, n_devices: int, step: StepSizes, *, window: int | None = None) -> LocalStep:
        """The share of ``step`` one device of ``plan`` on ``n_devices`` holds; ``window``: the
        sliding window (tokens) of a uniform model without ``layer_kinds``
        (:func:`~lcx.cost.kinds.layer_groups`).

        Raises:
          PlanError: the plan's mesh does not fit ``n_devices``, or gives a kind of the model
            no strategy.
          ValueError: an unknown strategy or dtype.
        """
        return _local_step(cls, cfg, plan, n_devices, step, window)

    @property
    def strategy(self) -> type[AbstractStrategy]:
        """The first kind's strategy class (a uniform model's one)."""
        return self.kinds[0].strategy

    @property
    def attention(self) -> AttentionShard:
        """The first kind's attention layer (every kind's has the same local tokens)."""
        return self.kinds[0].attention

    @property
    def tokens(self) -> int:
        """b T, tokens per device (T = S / P)."""
        return self.local_batch * self.attention.local_len


def frozen_cache(fn: Callable[..., T]) -> Callable[..., T]:
    """``functools.lru_cache`` for a function of frozen arguments (the ledger's config, plan and
    step sizes): the planner prices one plan under many policies, and what depends on the plan
    alone is computed once. An unhashable argument (a plain namespace standing in for
    :class:`~lcx.cost.flops.ModelDims`) is computed uncached, with the same result."""
    cached = functools.lru_cache(maxsize=256)(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:
            return fn(*args, **kwargs)
        return cached(*args, **kwargs)

    return call


@frozen_cache
def _local_step(
    cls: type[LocalStep], cfg: ModelDims, plan: Plan, n_devices: int, step: StepSizes, window: int | None
) -> LocalStep:
    # cached: the ledger asks for one step's share three times per estimate, and the planner
    # prices one plan under many policies (every argument is frozen)
    shape = plan.mesh_shape(n_devices)
    P = plan.context_degree(n_devices)
    data = math.prod(shape[m] for m in plan.batch_axes)
    tp = math.prod(shape[m] for m in plan.activation_rules.get(ax.HEADS, ()))
    b = max(1, step.global_batch // data)
    kinds = []
    for g in layer_groups(cfg, window=window):
        strategy = get_strategy(plan.attention.strategy_for(g.kind))
        s = AttentionShard.from_model(
            cfg,
            seq_len=step.seq_len,
            local_batch=b,
            context_degree=P,
            ulysses_degree=strategy.all_to_all_degree(plan.attention, shape),
            tensor_degree=tp,
            act_bytes=dtype_bytes(step.dtype),
        )
        # the layer kind and the layout, which a strategy pricing kinds differently reads (halo)
        a = plan.attention
        m = g.mask
        s = dataclasses.replace(
            s,
            window=m.window,
            chunk=m.chunk,
            documents=m.document,
            layout=a.layout,
            layout_block=max(a.block_q, a.block_kv),
        )
        kinds.append(KindShare(g, strategy, s))
    return cls(types.MappingProxyType(shape), P, b, tp, tuple(kinds))  # shared: read-only
