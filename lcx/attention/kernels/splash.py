"""Placeholder for the Pallas splash-attention kernel (a later issue).

Selecting ``plan.attention.kernel="splash"`` fails loudly when the strategy is built, before
anything compiles, rather than silently running the XLA kernel instead.
"""

from __future__ import annotations


class KernelNotAvailableError(NotImplementedError):
    """The plan names a kernel that this version of lcx does not provide yet."""


def splash_not_available(block_q: int, block_kv: int):
    """Raise :class:`KernelNotAvailableError` for ``plan.attention.kernel="splash"``."""
    raise KernelNotAvailableError(
        "plan.attention.kernel='splash' (Pallas splash attention) is not implemented yet: it is the "
        "follow-up issue 'Pallas splash kernel behind the lcx.attention.kernels.Kernel interface'. "
        "Set plan.attention.kernel='xla' (blockwise flash attention in plain JAX) meanwhile."
    )
