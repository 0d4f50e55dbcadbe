"""The per-device attention kernel interface.

A kernel computes attention of a local query block against ONE key/value block, with every mask
defined on global positions and segment ids. Context-parallel strategies call it once per block
they hold (all-gather: once; ring: once per ring step) and merge partial results through the
logsumexp, which is why the kernel returns it and why its backward takes the GLOBAL logsumexp and
``delta = sum(dout * out)`` (a :class:`~lcx.attention.blocks.Cotangent`; flash-attention
backward, Dao et al. 2022, arXiv:2205.14135, Algorithm 2): with those, the gradient
contributions of disjoint key blocks simply add up. Queries and K/V travel as
:class:`~lcx.attention.blocks.QueryBlock` and :class:`~lcx.attention.blocks.KVBlock`, each with
its global positions and segment ids.

A caller that runs MANY blocks against the same queries (the ring: one block per ring step) uses
the accumulating form instead: ``forward_start`` / ``forward_step`` / ``forward_finish`` and
``backward_start`` / ``backward_step`` / ``backward_finish``. The query side is prepared once
(a kernel may re-lay it out for its GEMMs) and the running results stay in the kernel's own
layout between steps, so no step allocates whole-shard copies of q, dout, its partial output or
its gradient pieces. :class:`~lcx.attention.kernels.composed.AbstractComposedKernel` implements
that form by composing :meth:`AbstractKernel.forward` / :meth:`AbstractKernel.backward` with
:func:`merge_partials` and plain sums, so a kernel that implements only those two still serves
every strategy.

A kernel class also carries what the rest of lcx needs to know about it, as class methods: its
block-size rules (:meth:`AbstractKernel.check_blocks`) and its memory price for the cost ledger
(:meth:`AbstractKernel.forward_bytes`, ``backward_bytes``, ``prologue_bytes``: pure arithmetic on
a :class:`KernelCall`). Equinox's abstract/final pattern: this class declares abstract methods
(and a few final ones no subclass overrides), each kernel is a final class.

Einsum letters (Gemma convention): B batch, T query length, S key length, N query heads,
K kv heads, G = N / K query heads per kv head, H head dim.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.experimental import checkify
from jaxtyping import Array, Float, PyTree

from lcx.attention.blocks import Cotangent, Grads, KVBlock, OutLse, QueryBlock
from lcx.attention.masks import Mask
from lcx.sharding.blocks import BlockSizes


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """The shape of one kernel call on one device, for pricing (tokens, heads, bytes).

    Attributes:
      local_batch: b, sequences.
      q_len: t, query tokens.
      kv_len: s, key/value tokens.
      q_heads: n, query heads.
      kv_heads: k, kv heads.
      head_dim: h.
      act_bytes: a, bytes per element of q, k, v and the cotangent (2 for bfloat16).
    """

    local_batch: int
    q_len: int
    kv_len: int
    q_heads: int
    kv_heads: int
    head_dim: int
    act_bytes: int = 2


def as_blocks(args: tuple, kwargs: Mapping[str, int | None]) -> BlockSizes:
    """A kernel constructor's block sizes: one :class:`BlockSizes` (``Kernel(blocks)``), or the
    :class:`BlockSizes` fields ``block_q, block_kv, block_q_dkv, block_kv_dkv`` positionally or by
    keyword (defaults for the others).

    Raises:
      TypeError: a BlockSizes mixed with other arguments, or an unknown keyword.
      ValueError: a block below 1 token.
    """
    if len(args) == 1 and isinstance(args[0], BlockSizes) and not kwargs:
        return args[0]
    if any(isinstance(a, BlockSizes) for a in (*args, *kwargs.values())):
        raise TypeError("give a kernel one BlockSizes, or the block sizes as numbers, not both")
    return BlockSizes(*args, **kwargs)


@contextlib.contextmanager
def kernel_scope(kernel: AbstractKernel, what: str) -> Iterator[None]:
    """``jax.named_scope("lcx.<KernelClass>.<what>")`` around a kernel call, so that profiles
    name the kernel and the pass."""
    with jax.named_scope(f"lcx.{type(kernel).__name__}.{what}"):
        yield


def merge_partials(
    out: Float[Array, "*lead H"],
    lse: Float[Array, "*lead"],
    out_b: Float[Array, "*lead H"],
    lse_b: Float[Array, "*lead"],
) -> tuple[Float[Array, "*lead H"], Float[Array, "*lead"]]:
    """Merge two normalised partial attention results over disjoint key sets (float32).

    ``lse = log(exp(lse) + exp(lse_b))``; ``out = out * exp(lse - lse_new) + out_b * exp(lse_b -
    lse_new)`` (the online-softmax merge; Milakov & Gimelshein 2018, Dao et al. 2022). Works on
    any leading shape: ``out`` is ``lse``'s shape plus a trailing head-dim axis.

    Valid partial states have a finite ``lse`` or ``lse = -inf`` (no key; ``out`` then 0). Rows
    where both are empty stay ``out = 0``, ``lse = -inf`` without producing NaN.

    An ``lse`` of ``+inf`` or NaN is not a valid state. Under
    ``jax.experimental.checkify.checkify`` (``errors`` including ``checkify.user_checks``) it
    raises a checkify error naming this function; otherwise the invalid partial is dropped, row
    by row: it counts as empty (weight 0, its ``out`` is not read), so the result is that of the
    other partial alone and never inf or NaN from it (``merge_partials(o_a, 0.5, o_b, inf)`` is
    ``(o_a, 0.5)``).

    Args:
      out: float32 ``[..., H]`` partial output, normalised over its own keys.
      lse: float32 ``[...]`` its logsumexp (natural log; ``-inf``: no key).
      out_b: the other partial output, shaped as ``out``.
      lse_b: its logsumexp, shaped as ``lse``.

    Returns:
      ``(out, lse)`` float32 of the union of the two key sets.
    """
    checkify.debug_check(
        jnp.all(lse < jnp.inf) & jnp.all(lse_b < jnp.inf),
        "merge_partials: a partial logsumexp is +inf or NaN (valid: finite, or -inf for no key); "
        "the kernel or the caller produced an invalid partial state",
    )
    ok, ok_b = lse < jnp.inf, lse_b < jnp.inf  # False for +inf and NaN
    lse, lse_b = jnp.where(ok, lse, -jnp.inf), jnp.where(ok_b, lse_b, -jnp.inf)
    new = jnp.logaddexp(lse, lse_b)
    safe = jnp.where(jnp.isfinite(new), new, 0.0)  # avoid (-inf) - (-inf) = NaN on empty rows
    w, w_b = jnp.exp(lse - safe)[..., None], jnp.exp(lse_b - safe)[..., None]
    # an invalid partial's out is not read at all (0 * inf would be NaN)
    return jnp.where(ok[..., None], out, 0.0) * w + jnp.where(ok_b[..., None], out_b, 0.0) * w_b, new


# Opaque per-kernel state of the accumulating form (pytrees of arrays only the kernel reads).
Prepared = PyTree[Any]
Accumulator = PyTree[Any]
GradAccumulator = tuple[Accumulator, Float[Array, "B S K H"], Float[Array, "B S K H"]]
"""``(dq_acc, dk, dv)`` of :meth:`AbstractKernel.backward_step`: the kernel's dQ accumulator and
float32 dK/dV of one K/V block."""


class AbstractKernel(eqx.Module):
    """Abstract per-device attention kernel (Equinox abstract/final pattern: subclasses are final).

    GQA: query head ``n`` attends with kv head ``n // G``; implementations must never repeat
    K/V. The softmax scale ``1 / sqrt(H)`` is the kernel's business (callers pass unscaled q).

    Attributes:
      blocks: forward and backward blocks in tokens (a static field of the final class, checked
        by :meth:`check_blocks` when the kernel is built).
      mosaic_calls_per_chunk: (class) ``(forward, backward)``: the Pallas calls, each a Mosaic
        ``tpu_custom_call`` when lowered for TPU with interpret mode off
        (:mod:`lcx.attention.kernels.interpret`), that one kv chunk's :meth:`forward` and
        :meth:`backward` make; None for a kernel that is not Pallas (tests/test_tpu_lowering.py
        lowers every kernel that declares it).
    """

    blocks: eqx.AbstractVar[BlockSizes]
    mosaic_calls_per_chunk: ClassVar[tuple[int, int] | None] = None

    def __check_init__(self):
        type(self).check_blocks(self.blocks)

    # ------------------------------------------------------------------ rules and price (class)
    @classmethod
    @abc.abstractmethod
    def check_blocks(cls, blocks: BlockSizes) -> None:
        """The kernel's own tiling rules on ``blocks`` (beyond :class:`BlockSizes`' >= 1).

        Raises:
          ValueError: naming the ``plan.attention`` key, the value and the fix.
        """

    @classmethod
    @abc.abstractmethod
    def forward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """Bytes of device memory one forward call holds besides its inputs."""

    @classmethod
    @abc.abstractmethod
    def backward_bytes(cls, call: KernelCall, blocks: BlockSizes) -> int:
        """Bytes of device memory one backward call holds besides its inputs (q, k, v, out, lse)."""

    @classmethod
    @abc.abstractmethod
    def prologue_bytes(cls, call: KernelCall) -> int:
        """The part of :meth:`backward_bytes` that does not depend on the incoming cotangent, so
        XLA creates it as soon as its inputs exist (during the MLP's backward)."""

    @abc.abstractmethod
    def forward(self, q: QueryBlock, kv: KVBlock, *, mask: Mask) -> OutLse:
        """Attention of the queries ``q`` against this K/V block ``kv`` (``N % K == 0``).

        Returns:
          ``(out, lse)`` (:data:`~lcx.attention.blocks.OutLse`): ``out`` float32
          ``[B, T, N, H]`` normalised within this block, ``lse`` float32 ``[B, T, N]`` the
          logsumexp of the scaled visible logits (natural log). A row with no visible key has
          ``out == 0`` and ``lse == -inf``.
        """

    @abc.abstractmethod
    def backward(self, q: QueryBlock, kv: KVBlock, ct: Cotangent, *, mask: Mask) -> Grads:
        """Gradient contributions of this K/V block, given the GLOBAL output's cotangent ``ct``.

        With ``P = exp(s - lse)`` (the global softmax restricted to this block) and
        ``delta = sum(dout * out, -1)``: ``dV = P^T dout``, ``dS = P * (dout V^T - delta)``,
        ``dQ = dS K * scale``, ``dK = dS^T Q * scale``. Contributions of disjoint K/V blocks add.

        Args:
          q: as in :meth:`forward`.
          kv: as in :meth:`forward`.
          mask: as in :meth:`forward`.
          ct: the final logsumexp and ``delta`` over ALL key blocks and the output's cotangent
            (:meth:`Cotangent.of <lcx.attention.blocks.Cotangent.of>` makes it from ``out``).

        Returns:
          ``(dq, dk, dv)`` float32 with the shapes of ``q.q``, ``kv.k``, ``kv.v``; zero (never
          NaN) for rows without a visible key.
        """

    # ------------------------------------------------------------------ accumulating form
    # AbstractComposedKernel implements these from forward/backward; XlaKernel with a layout of
    # its own (queries and accumulators blocked, in GEMM row order, across all steps).

    @abc.abstractmethod
    def step_tile_bytes(self, batch: int, q_len: int, kv_len: int, group: int) -> int:
        """Bytes of device memory the kernel's largest per-step temporaries take for ONE kv head
        and its ``group`` query heads, on ``batch`` sequences of ``q_len`` queries against
        ``kv_len`` keys (tokens). Callers that choose how many heads to process at once (the
        ring's :func:`~lcx.attention.strategies.ring.heads_per_pass`) add it to the K/V they
        hold; 0 when the kernel keeps its tiles in on-chip memory (splash: VMEM)."""

    @abc.abstractmethod
    def forward_start(self, q: QueryBlock, *, kv_heads: int) -> tuple[Prepared, Accumulator]:
        """Prepare the query side once for many :meth:`forward_step` calls (one per K/V block).

        Args:
          q: the queries with their positions and segment ids.
          kv_heads: K, the kv heads of every K/V block that will follow (``N % K == 0``).

        Returns:
          ``(prepared, acc)``: the prepared queries (read-only afterwards) and the running result
          over no key yet; both opaque pytrees, only this kernel reads them.
        """

    @abc.abstractmethod
    def forward_step(self, prepared: Prepared, acc: Accumulator, kv: KVBlock, *, mask: Mask) -> Accumulator:
        """Fold one K/V block (disjoint from the blocks folded before) into the running result.

        Args:
          prepared: from :meth:`forward_start`.
          acc: from :meth:`forward_start`, or from earlier steps.
          kv: keys and values ``[B, S, K, H]`` with positions and ids (S may vary per step).
          mask: which (query, key) pairs are visible.

        Returns:
          The updated running result (same structure, shapes and dtypes as ``acc``).
        """

    @abc.abstractmethod
    def forward_finish(self, prepared: Prepared, acc: Accumulator) -> OutLse:
        """``(out, lse)`` over every block folded into ``acc``, as :meth:`forward` returns them
        for the union of those blocks (float32; empty rows ``out = 0``, ``lse = -inf``)."""

    @abc.abstractmethod
    def backward_start(self, q: QueryBlock, ct: Cotangent, *, kv_heads: int) -> tuple[Prepared, Accumulator]:
        """Prepare the query side once for many :meth:`backward_step` calls (one per K/V block).

        Args:
          q: as in :meth:`forward_start`.
          ct: the final logsumexp and ``delta`` over ALL key blocks and the output's cotangent.
          kv_heads: K, the kv heads of every K/V block that will follow.

        Returns:
          ``(prepared, dq_acc)``: the prepared query side (read-only afterwards) and the dQ
          accumulator (zero), both opaque pytrees.
        """

    @abc.abstractmethod
    def backward_step(self, prepared: Prepared, acc: GradAccumulator, kv: KVBlock, *, mask: Mask) -> GradAccumulator:
        """Add this K/V block's gradient contributions (see :meth:`backward`) to the running dQ
        and to this block's float32 ``dk``, ``dv`` accumulators (the ring's travelling ones).

        Args:
          prepared: from :meth:`backward_start`.
          acc: ``(dq_acc, dk, dv)``: the dQ accumulator (from :meth:`backward_start` or earlier
            steps) and float32 ``[B, S, K, H]`` dK/dV accumulators of this block.
          kv: as in :meth:`forward_step`.
          mask: as in :meth:`forward_step`.

        Returns:
          ``(dq_acc, dk, dv)`` updated, with the structures, shapes and dtypes passed in.
        """

    @abc.abstractmethod
    def backward_finish(self, prepared: Prepared, dq_acc: Accumulator) -> Float[Array, "B T N H"]:
        """float32 ``dq`` ``[B, T, N, H]``: the sum of every folded block's contribution."""


Kernel = AbstractKernel
"""Alias of :class:`AbstractKernel` (the name users' scripts import)."""
