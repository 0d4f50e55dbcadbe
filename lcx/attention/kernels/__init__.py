"""Per-device attention kernels behind one interface, selected by ``plan.attention.kernel``.

Adding a kernel is one file with a final :class:`AbstractKernel` subclass (built from a
:class:`~lcx.sharding.blocks.BlockSizes`, carrying its block-size rules and its memory price;
:class:`AbstractComposedKernel` supplies the accumulating form from ``forward``/``backward``)
plus one line in :data:`KERNELS`. The plan accepts the names registered here (through the one
plug-in lookup of the bottom layer, :func:`lcx.sharding.attention_config.kernel_class`, a
function-local import of :func:`get_kernel`), the cost ledger prices them through
:func:`get_kernel`; nothing else branches on a kernel's name.
"""

from __future__ import annotations

from lcx.attention.blocks import Cotangent, KVBlock, QueryBlock, output_delta
from lcx.attention.kernels.base import AbstractKernel, Kernel, KernelCall, as_blocks, kernel_scope, merge_partials
from lcx.attention.kernels.composed import AbstractComposedKernel
from lcx.attention.kernels.interpret import interpret, mosaic_calls, pallas_interpret
from lcx.attention.kernels.splash import KernelNotAvailableError, SplashKernel
from lcx.attention.kernels.tokamax import TokamaxKernel
from lcx.attention.kernels.xla import XlaKernel, block_size
from lcx.sharding.attention_config import lookup
from lcx.sharding.blocks import BlockSizes

KERNELS: dict[str, type[AbstractKernel]] = {
    "xla": XlaKernel,
    "splash": SplashKernel,
    "tokamax": TokamaxKernel,
}
"""Kernel name (``plan.attention.kernel``) -> final kernel class, built as ``cls(blocks)``."""


def get_kernel(name: str) -> type[AbstractKernel]:
    """The final kernel class registered as ``name``.

    Raises:
      ValueError: no kernel of that name (the message lists the registered ones).
    """
    return lookup(KERNELS, name, "kernel")


def make_kernel(name: str, *blocks: BlockSizes | int | None, **block_sizes: int | None) -> AbstractKernel:
    """The kernel ``name`` with these block sizes (tokens): one :class:`BlockSizes`, or its fields
    ``block_q, block_kv, block_q_dkv, block_kv_dkv`` positionally or by keyword (the ``*_dkv``
    ones are the backward pass's; None: ``block_q`` / ``block_kv``).

    Raises:
      ValueError: unknown kernel name; a block < 1 token; block sizes the kernel cannot tile
        (splash: ``block_q`` a multiple of 8, the others multiples of 128, kv blocks up to 16384).
      KernelNotAvailableError: (a ``NotImplementedError``) the kernel's library is missing here.
    """
    return get_kernel(name)(as_blocks(blocks, block_sizes))


__all__ = [
    "AbstractComposedKernel",
    "AbstractKernel",
    "block_size",
    "BlockSizes",
    "Cotangent",
    "Kernel",
    "kernel_scope",
    "KernelCall",
    "KernelNotAvailableError",
    "interpret",
    "KVBlock",
    "merge_partials",
    "mosaic_calls",
    "pallas_interpret",
    "output_delta",
    "QueryBlock",
    "SplashKernel",
    "TokamaxKernel",
    "XlaKernel",
]
