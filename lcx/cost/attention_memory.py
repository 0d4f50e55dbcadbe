"""Per-device memory of one attention layer: the strategy's buffers and the kernel's call.

Every number comes from the registered classes themselves (:data:`lcx.attention.STRATEGIES`,
:data:`lcx.attention.KERNELS`): the strategy gives its kernel call's shape, its own buffers and
the residuals it makes the kernel save (:class:`~lcx.attention.strategies.AbstractStrategy`'s
pricing methods), the kernel its forward, backward and prologue bytes on that call
(:class:`~lcx.attention.kernels.AbstractKernel`'s). Both are pure arithmetic; nothing here
branches on a name, so a new strategy or kernel is priced the moment it is registered.

With ``T = S / P`` local tokens, ``b`` local sequences, ``a`` activation bytes, ``Nl = N / tp``,
``Kl = K / tp`` (at least 1):

- ``allgather``: the gathered K/V ``2 b S Kl H a`` and positions and segment ids (``2 b S``
  int32); the kernel on ``T`` queries x ``S`` keys (its dK/dV are full-length before the
  reduce-scatter); it saves the gathered K/V, ``2 b (S - T) Kl H a + 2 b S 4`` more than local;
- ``a2a`` (Ulysses, degree U = P): q/k/v of ``N/U`` heads over all S tokens (kv heads
  replicated up to U) and the gathered positions and segment ids (``4 b S`` int32); the kernel
  on S x S tokens of ``N/U`` heads;
- ``ring``: the K/V (+ positions, segment ids) in flight to the next step and, in the backward,
  the next hop of the float32 dK/dV accumulators (``2 b T Kl H 4``); the kernel on T x T, whose
  dQ and dK/dV accumulators are the ring's; it saves nothing beyond the local q, k, v;
- ``usp``: the all-to-all over U as for a2a (over ``L = U T`` tokens), then the ring's buffers on
  blocks of ``L`` tokens of ``Kr / U`` kv heads; the kernel on L x L.
"""

from __future__ import annotations

from lcx.attention.kernels import AbstractKernel, BlockSizes, KernelCall, get_kernel
from lcx.attention.strategies import AbstractStrategy, AttentionShard, get_strategy

DEFAULT_BLOCKS = BlockSizes()
"""The blocks the by-name functions price when given none: 512 x 512, the backward's the same."""


def kernel_call(strategy: type[AbstractStrategy], s: AttentionShard) -> KernelCall:
    """The shape of ``strategy``'s kernel call on the device ``s``."""
    tq, tk, nq, nk = strategy.kernel_call(s)
    return KernelCall(s.local_batch, tq, tk, nq, nk, s.head_dim, s.act_bytes)


def layer_forward_bytes(
    strategy: type[AbstractStrategy], kernel: type[AbstractKernel], s: AttentionShard, blocks: BlockSizes
) -> int:
    """Peak transient bytes of one attention layer's forward: the strategy's buffers plus the
    kernel's forward on the shape it is called with."""
    return int(strategy.buffer_bytes(s, backward=False) + kernel.forward_bytes(kernel_call(strategy, s), blocks))


def layer_backward_bytes(
    strategy: type[AbstractStrategy], kernel: type[AbstractKernel], s: AttentionShard, blocks: BlockSizes
) -> int:
    """Peak transient bytes of one attention layer's backward beyond the residuals it reads: the
    strategy's buffers plus the kernel's backward (on its backward blocks)."""
    return int(strategy.buffer_bytes(s, backward=True) + kernel.backward_bytes(kernel_call(strategy, s), blocks))


def layer_prologue_bytes(strategy: type[AbstractStrategy], kernel: type[AbstractKernel], s: AttentionShard) -> int:
    """The kernel's cotangent-independent backward buffers on ``strategy``'s call: the part of
    the attention phase already live in the MLP phase of the same block's backward."""
    return kernel.prologue_bytes(kernel_call(strategy, s))


# -------------------------------------------------------------------------- by name (public)
def attention_kernel_residual_bytes(strategy: str, s: AttentionShard) -> int:
    """Bytes a strategy's attention residuals exceed the local q, k, v (which the layer's saved
    set already counts): what the kernel's custom VJP saves is the K/V it was CALLED with
    (:meth:`~lcx.attention.strategies.AbstractStrategy.residual_bytes`; module docstring).

    Raises:
      ValueError: unknown strategy.
    """
    return get_strategy(strategy).residual_bytes(s)


def kernel_backward_bytes(kernel: str, call: KernelCall, blocks: BlockSizes = DEFAULT_BLOCKS) -> int:
    """Bytes one attention kernel's backward call holds besides its inputs (q, k, v, out, lse),
    on its backward blocks: :meth:`~lcx.attention.kernels.XlaKernel.backward_bytes` and the like.

    Raises:
      ValueError: unknown kernel.
    """
    return get_kernel(kernel).backward_bytes(call, blocks)


def kernel_backward_prologue_bytes(kernel: str, call: KernelCall) -> int:
    """Bytes of an attention kernel's backward that do not depend on the incoming cotangent, so
    XLA creates them as soon as their inputs exist -- during the MLP's backward, before
    attention's own phase (its schedulers start independent work early: XLA:CPU's default
    concurrency-optimised one does, as the buffer assignment of the compiled train step shows).

    Raises:
      ValueError: unknown kernel.
    """
    return get_kernel(kernel).prologue_bytes(call)


def kernel_forward_bytes(kernel: str, call: KernelCall, blocks: BlockSizes = DEFAULT_BLOCKS) -> int:
    """Bytes one attention kernel's forward call holds besides its inputs, on its forward blocks
    (:meth:`~lcx.attention.kernels.XlaKernel.forward_bytes` and the like).

    Raises:
      ValueError: unknown kernel.
    """
    return get_kernel(kernel).forward_bytes(call, blocks)


def attention_prologue_bytes(strategy: str, kernel: str, s: AttentionShard) -> int:
    """:func:`kernel_backward_prologue_bytes` of ``strategy``'s kernel call on the device ``s``
    (:func:`layer_prologue_bytes`).

    Raises:
      ValueError: unknown strategy or kernel.
    """
    return layer_prologue_bytes(get_strategy(strategy), get_kernel(kernel), s)


def attention_forward_bytes(strategy: str, kernel: str, s: AttentionShard, blocks: BlockSizes = DEFAULT_BLOCKS) -> int:
    """Peak transient bytes of ONE attention layer's forward on the device ``s``
    (:func:`layer_forward_bytes`). Its phase matters when the forward's blocks are larger than
    the backward's (``plan.attention.block_*_dkv``).

    Raises:
      ValueError: unknown strategy or kernel.
    """
    return layer_forward_bytes(get_strategy(strategy), get_kernel(kernel), s, blocks)


def attention_working_bytes(strategy: str, kernel: str, s: AttentionShard, blocks: BlockSizes = DEFAULT_BLOCKS) -> int:
    """Peak transient bytes of ONE attention layer's backward on the device ``s``, beyond the
    residuals it reads (q, k, v, flash output and logsumexp of the local tokens: see
    :func:`~lcx.cost.activations.attention_residual_bytes_per_token`): the strategy's buffers
    (module docstring) plus the kernel's own backward on the shapes it is called with, whose
    tiles are those of its backward blocks (:attr:`BlockSizes.backward`).

    Raises:
      ValueError: unknown strategy or kernel.
    """
    return layer_backward_bytes(get_strategy(strategy), get_kernel(kernel), s, blocks)
