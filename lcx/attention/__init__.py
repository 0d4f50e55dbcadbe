"""Context-parallel attention: masks, per-device kernels, strategies (allgather, a2a, ring, usp, halo).

Support matrix (``plan.attention.strategy``; every mask -- causal, document, sliding window,
full, and combinations -- in every strategy, both layouts, forward and backward):

============  ===================================  ===========================================
strategy      heads                                per-device memory / communication
============  ===================================  ===========================================
allgather     any N, K                             O(S) K/V; all-gather K/V (K heads, not N)
a2a           U | N; U | K or K | U (kv heads      O(S N / U); 2 all-to-alls each way
              replicated U/K times if allowed)
ring          any N, K                             O(S / P); P-1 K/V hops (fwd), custom VJP
usp           U | N; U | K or K | U                O(S / P); all-to-all over U, ring over R
halo          any N, K; causal sliding-window or   O(S / P + W); only the W - 1 keys before each
              chunked masks, W - 1 <= a layout     layout chunk, ppermute from their holder
              chunk (refuses global layers)
============  ===================================  ===========================================

U: Ulysses degree, P: context degree, S: sequence length, N/K: query/kv heads per device (after
any tensor sharding of heads). Sequence length must be divisible by P (by 2P for zigzag, checked
by the plan). Refusals are ValueErrors raised before compiling. Every strategy and kernel takes
optional per-head attention sinks (``attention(..., sinks=...)``, :mod:`lcx.attention.sinks`),
returns the logsumexp on request (``attention(..., return_lse=True)``) and treats a negative
segment id as padding (:mod:`lcx.attention.masks`).

Public API:

- :func:`attention`: context-parallel attention on global arrays, strategy chosen by the plan
  for the mask's layer kind (``plan.attention.strategy_for(mask.kind)``).
- :func:`check_layer_kinds`: a plan refused, before compiling, for a layer kind it cannot run.
- :class:`Mask`, :data:`CAUSAL`, :data:`FULL`: mask predicates on global positions/segment ids.
- :func:`reference_attention`: dense single-device float32 reference.
- :func:`flash_attention` (and :func:`flash_blocks`, its form on blocks): local blockwise
  attention with a custom VJP.
- :class:`QueryBlock`, :class:`KVBlock`, :class:`Cotangent`: the arrays kernels and strategies
  take together (queries / keys and values with their positions and segment ids; the output's
  cotangent).
- :func:`merge_sinks`, :func:`sinks_grad`: the attention-sink merge and its gradient.
- :func:`merge_partials`: merge two partial ``(out, lse)`` results over disjoint key sets (e.g.
  ``attention(..., return_lse=True)`` with a block of the caller's own).
- :class:`AbstractKernel` (alias ``Kernel``), :class:`XlaKernel`, :func:`make_kernel`,
  :class:`BlockSizes`, :data:`KERNELS` / :func:`get_kernel`: per-device kernels.
- :class:`AbstractStrategy` (alias ``Strategy``) and the final strategies :class:`AllGather`,
  :class:`Ulysses`, :class:`Ring`, :class:`USP`, :class:`Halo`, registered by plan name in :data:`STRATEGIES`
  (:func:`get_strategy`).
"""

from lcx.attention.api import attention, build_strategy
from lcx.attention.blocks import Cotangent, KVBlock, QueryBlock
from lcx.attention.flash import flash_attention, flash_blocks
from lcx.attention.kernels import (
    KERNELS,
    AbstractKernel,
    BlockSizes,
    Kernel,
    KernelNotAvailableError,
    XlaKernel,
    get_kernel,
    make_kernel,
)
from lcx.attention.masks import CAUSAL, FULL, Mask
from lcx.attention.plan_kinds import check_layer_kinds
from lcx.attention.reference import reference_attention
from lcx.attention.sinks import merge_sinks, sinks_grad
from lcx.attention.strategies import (
    STRATEGIES,
    USP,
    AbstractStrategy,
    AllGather,
    Halo,
    Ring,
    Strategy,
    Ulysses,
    get_strategy,
    merge_partials,
)

__all__ = [
    "AbstractKernel",
    "AbstractStrategy",
    "AllGather",
    "attention",
    "BlockSizes",
    "build_strategy",
    "check_layer_kinds",
    "CAUSAL",
    "Cotangent",
    "flash_attention",
    "flash_blocks",
    "FULL",
    "get_kernel",
    "get_strategy",
    "Halo",
    "Kernel",
    "KernelNotAvailableError",
    "KERNELS",
    "KVBlock",
    "make_kernel",
    "Mask",
    "merge_partials",
    "merge_sinks",
    "QueryBlock",
    "reference_attention",
    "Ring",
    "sinks_grad",
    "STRATEGIES",
    "Strategy",
    "Ulysses",
    "USP",
    "XlaKernel",
]
