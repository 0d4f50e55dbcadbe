"""Context-parallel attention: masks, per-device kernels, strategies (allgather, a2a, ring, usp).

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
============  ===================================  ===========================================

U: Ulysses degree, P: context degree, S: sequence length, N/K: query/kv heads per device (after
any tensor sharding of heads). Sequence length must be divisible by P (by 2P for zigzag, checked
by the plan). Refusals are ValueErrors raised before compiling. Every strategy and kernel takes
optional per-head attention sinks (``attention(..., sinks=...)``, :mod:`lcx.attention.sinks`),
returns the logsumexp on request (``attention(..., return_lse=True)``) and treats a negative
segment id as padding (:mod:`lcx.attention.masks`).

Public API:

- :func:`attention`: context-parallel attention on global arrays, strategy chosen by the plan.
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
  :class:`Ulysses`, :class:`Ring`, :class:`USP`, registered by plan name in :data:`STRATEGIES`
  (:func:`get_strategy`).
"""

from lcx.attention.api import attention as attention
from lcx.attention.api import build_strategy as build_strategy
from lcx.attention.blocks import Cotangent as Cotangent
from lcx.attention.blocks import KVBlock as KVBlock
from lcx.attention.blocks import QueryBlock as QueryBlock
from lcx.attention.flash import flash_attention as flash_attention
from lcx.attention.flash import flash_blocks as flash_blocks
from lcx.attention.kernels import KERNELS as KERNELS
from lcx.attention.kernels import AbstractKernel as AbstractKernel
from lcx.attention.kernels import BlockSizes as BlockSizes
from lcx.attention.kernels import Kernel as Kernel
from lcx.attention.kernels import KernelNotAvailableError as KernelNotAvailableError
from lcx.attention.kernels import XlaKernel as XlaKernel
from lcx.attention.kernels import get_kernel as get_kernel
from lcx.attention.kernels import make_kernel as make_kernel
from lcx.attention.masks import CAUSAL as CAUSAL
from lcx.attention.masks import FULL as FULL
from lcx.attention.masks import Mask as Mask
from lcx.attention.reference import reference_attention as reference_attention
from lcx.attention.sinks import merge_sinks as merge_sinks
from lcx.attention.sinks import sinks_grad as sinks_grad
from lcx.attention.strategies import STRATEGIES as STRATEGIES
from lcx.attention.strategies import USP as USP
from lcx.attention.strategies import AbstractStrategy as AbstractStrategy
from lcx.attention.strategies import AllGather as AllGather
from lcx.attention.strategies import Ring as Ring
from lcx.attention.strategies import Strategy as Strategy
from lcx.attention.strategies import Ulysses as Ulysses
from lcx.attention.strategies import get_strategy as get_strategy
from lcx.attention.strategies import merge_partials as merge_partials
