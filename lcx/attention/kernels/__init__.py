"""Per-device attention kernels behind one interface, selected by ``plan.attention.kernel``.

Adding a kernel is one file with a final :class:`Kernel` subclass (taking the four block
sizes ``block_q``, ``block_kv``, ``block_q_dkv``, ``block_kv_dkv`` as keywords) plus one line in
:data:`KERNELS`.
"""

from __future__ import annotations

from collections.abc import Callable

from lcx.attention.kernels.base import Kernel as Kernel
from lcx.attention.kernels.base import merge_partials as merge_partials
from lcx.attention.kernels.base import output_delta as output_delta
from lcx.attention.kernels.splash import KernelNotAvailableError as KernelNotAvailableError
from lcx.attention.kernels.splash import SplashKernel as SplashKernel
from lcx.attention.kernels.xla import XlaKernel as XlaKernel
from lcx.attention.kernels.xla import block_size as block_size

KERNELS: dict[str, Callable[..., Kernel]] = {"xla": XlaKernel, "splash": SplashKernel}
"""Kernel name (``plan.attention.kernel``) -> factory ``(block_q, block_kv, block_q_dkv,
block_kv_dkv) -> Kernel`` (keyword arguments)."""


def make_kernel(name: str, block_q: int = 512, block_kv: int = 512, block_q_dkv: int | None = None,
                block_kv_dkv: int | None = None) -> Kernel:
    """The kernel ``name`` with these block sizes (tokens); ``block_q_dkv`` / ``block_kv_dkv``
    are the backward pass's (None: ``block_q`` / ``block_kv``).

    Raises:
      ValueError: unknown kernel name.
      KernelNotAvailableError: (a ``NotImplementedError``) the kernel's library is missing here.
      ValueError: block sizes the kernel cannot tile (splash: ``block_q`` a multiple of 8, the
        others multiples of 128, kv blocks up to 16384).
    """
    if name not in KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; choose one of {tuple(KERNELS)}")
    return KERNELS[name](block_q=block_q, block_kv=block_kv, block_q_dkv=block_q_dkv, block_kv_dkv=block_kv_dkv)
