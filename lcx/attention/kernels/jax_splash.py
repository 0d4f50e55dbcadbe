"""The one place lcx touches JAX's private splash-attention functions, behind a version guard.

``kernel=splash`` runs JAX's own Pallas splash kernels per sorted-interval chunk
(:mod:`lcx.attention.kernels.splash`): the forward with ``save_residuals`` and the two backward
kernels (dQ; dK/dV) fed with the GLOBAL logsumexp a ring step needs, which splash's public
``make_splash_mha`` does not take. Those three functions are private
(``splash_attention_kernel._splash_attention_forward``, ``_splash_attention_bwd_dq``,
``_splash_attention_bwd_dkv``) and can change in any JAX release. So this module, and only this
module, imports them, and it checks before anything is traced that

- the installed JAX is in :data:`SUPPORTED_JAX` (lcx's tests pass on :data:`TESTED_JAX`), and
- each function still has the parameters lcx passes, the positional ones in the same order.

Anything else raises :class:`KernelNotAvailableError`, naming the installed version, the tested
versions and the way out (``plan.attention.kernel=xla``, or a tested JAX). The checks are pure
functions of a version tuple and a module, so tests exercise both refusals on any JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax


class KernelNotAvailableError(NotImplementedError):
    """The plan names a kernel that cannot run here (e.g. its library is missing)."""


TESTED_JAX = ("0.10.2", "0.12.0.1")
"""JAX releases the splash tests (tests/test_attention_splash.py) pass on."""

SUPPORTED_JAX = ((0, 10, 2), (0, 13))
"""``[lowest, first unsupported)`` JAX version the guard accepts: the tested releases and those
between them; the next minor release is refused until it is tested."""

# name -> (the parameters lcx passes positionally, in order; those it passes by keyword)
_POSITIONAL_BWD = ("q", "k", "v", "segment_ids", "sinks", "logsumexp", "do", "di")
_COMMON = ("is_mqa", "mask_value", "mask_function", "interpret")
_BWD = (*_COMMON, "bq", "bkv", "mask_info", "attn_logits_soft_cap", "q_layout", "k_layout", "v_layout")
EXPECTED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "_splash_attention_forward": (
        ("fwd_mask_info", "q", "k", "v", "segment_ids", "sinks"),
        (*_COMMON, "block_sizes", "residual_checkpoint_name", "save_residuals"),
    ),
    "_splash_attention_bwd_dq": (_POSITIONAL_BWD, _BWD),
    "_splash_attention_bwd_dkv": (_POSITIONAL_BWD, (*_BWD, "bkv_compute", "use_fused_bwd_kernel")),
}
"""What lcx calls each private splash function with."""


def _refusal(what: str) -> KernelNotAvailableError:
    return KernelNotAvailableError(
        f"plan.attention.kernel='splash' calls JAX-private splash functions, and {what} (jax {jax.__version__}; "
        f"tested on jax {' and '.join(TESTED_JAX)}, accepted from {'.'.join(map(str, SUPPORTED_JAX[0]))} below "
        f"{'.'.join(map(str, SUPPORTED_JAX[1]))}); set plan.attention.kernel='xla' (or 'tokamax'), or install a "
        f"tested JAX, e.g. pip install 'jax=={TESTED_JAX[-1]}'"
    )


def check_jax_version(version: tuple[int, ...]) -> None:
    """Refuse a JAX outside :data:`SUPPORTED_JAX`.

    Args:
      version: ``jax.__version_info__``, e.g. ``(0, 10, 2)`` or ``(0, 12, 0, 1)``.

    Raises:
      KernelNotAvailableError: the version is below or above the supported range.
    """
    lo, hi = SUPPORTED_JAX
    if not lo <= tuple(version) < hi:
        raise _refusal(f"this JAX ({'.'.join(map(str, version))}) is outside the versions they are known for")


def check_signatures(module: Any) -> None:
    """Refuse a splash kernel module whose private functions lcx cannot call as it does.

    Args:
      module: ``jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel``.

    Raises:
      KernelNotAvailableError: a function of :data:`EXPECTED` is missing, its first parameters
        are not the positional ones lcx passes, or a keyword lcx passes is not a parameter.
    """
    for name, (positional, keywords) in EXPECTED.items():
        fn = getattr(module, name, None)
        if fn is None:
            raise _refusal(f"{name} is gone")
        params = list(inspect.signature(fn).parameters)
        if tuple(params[: len(positional)]) != positional:
            raise _refusal(f"{name} takes {params[: len(positional)]} first, not {list(positional)}")
        missing = sorted(set(keywords) - set(params))
        if missing:
            raise _refusal(f"{name} no longer takes {missing}")


@dataclasses.dataclass(frozen=True)
class SplashInternals:
    """JAX's splash functions and types as lcx calls them (:func:`splash_internals`).

    Attributes:
      forward: ``_splash_attention_forward``.
      bwd_dq: ``_splash_attention_bwd_dq``.
      bwd_dkv: ``_splash_attention_bwd_dkv``.
      mask_info: ``splash_attention_mask_info.MaskInfo``, the block-sparsity tables.
      block_sizes: ``BlockSizes``, the forward's block sizes.
      head_dim_minor: ``QKVLayout.HEAD_DIM_MINOR``, the q/k/v layout of the backward kernels.
      mask_value: ``DEFAULT_MASK_VALUE``, splash's logit of a hidden pair.
    """

    forward: Any
    bwd_dq: Any
    bwd_dkv: Any
    mask_info: Any
    block_sizes: Any
    head_dim_minor: Any
    mask_value: float


@functools.cache
def splash_internals() -> SplashInternals:
    """JAX's splash internals, after :func:`check_jax_version` and :func:`check_signatures`.

    Raises:
      KernelNotAvailableError: splash fails to import, or a check refuses this JAX.
    """
    check_jax_version(tuple(jax.__version_info__))
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info as mi
    except ImportError as e:  # pragma: no cover - depends on the installed JAX
        raise _refusal(f"they failed to import ({e})") from e
    check_signatures(sk)
    forward, bwd_dq, bwd_dkv = (getattr(sk, name) for name in EXPECTED)  # the order EXPECTED lists them
    return SplashInternals(
        forward, bwd_dq, bwd_dkv, mi.MaskInfo, sk.BlockSizes, sk.QKVLayout.HEAD_DIM_MINOR, sk.DEFAULT_MASK_VALUE
    )


__all__ = [
    "EXPECTED",
    "SUPPORTED_JAX",
    "TESTED_JAX",
    "KernelNotAvailableError",
    "SplashInternals",
    "check_jax_version",
    "check_signatures",
    "splash_internals",
]
