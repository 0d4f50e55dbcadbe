"""Where lcx's Pallas kernels (``splash``, ``tokamax``) take interpret mode from: this module only.

A Pallas kernel either lowers to a Mosaic program (a ``tpu_custom_call`` in the lowered module,
what a TPU runs) or runs in *interpret mode*, where Pallas evaluates the kernel body as ordinary
JAX operations (what a CPU can execute). By default lcx interprets everywhere but on TPUs
(:func:`interpret` follows ``jax.default_backend()``). :func:`pallas_interpret` overrides that
rule for the kernels *traced* inside it, which is how a CPU machine lowers the real Mosaic
programs for TPU without one::

    with pallas_interpret(False):
        text = jax.jit(step).trace(*args).lower(lowering_platforms=("tpu",)).as_text()

The mode is read when a kernel is traced, not when the program runs: a function already traced
(and cached by ``jax.jit``) outside the context keeps the mode it was traced with. Trace a fresh
function (a new ``jax.jit`` of it, or ``.trace`` of one not called before) inside the context.
A program lowered with interpret mode off cannot run on a CPU or GPU; lower it, do not call it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_FORCED: contextvars.ContextVar[bool | None] = contextvars.ContextVar("lcx_pallas_interpret", default=None)


def interpret() -> bool:
    """Whether the Pallas kernels traced now run in interpret mode.

    Returns:
      The innermost :func:`pallas_interpret` setting; without one, ``True`` everywhere but on
      TPUs (``jax.default_backend() != "tpu"``).
    """
    forced = _FORCED.get()
    return jax.default_backend() != "tpu" if forced is None else forced


@contextlib.contextmanager
def pallas_interpret(mode: bool | None) -> Iterator[None]:
    """Trace lcx's Pallas kernels with interpret mode ``mode`` inside the ``with`` block.

    Args:
      mode: ``True``: interpret (runs on any backend); ``False``: lower the Mosaic programs
        (runs on TPU only; lowers anywhere with ``lowering_platforms=("tpu",)``); ``None``: the
        default rule of :func:`interpret`. Nested blocks restore the outer setting on exit.

    Raises:
      TypeError: ``mode`` is not a bool or None.
    """
    if mode is not None and not isinstance(mode, bool):
        raise TypeError(f"pallas_interpret(mode) takes True, False or None, got {mode!r}")
    token = _FORCED.set(mode)
    try:
        yield
    finally:
        _FORCED.reset(token)


MOSAIC_CALL = "@tpu_custom_call"
"""How a lowered (StableHLO) module names a Mosaic kernel call."""


def mosaic_calls(lowered_text: str) -> int:
    """Mosaic kernel calls in a lowered module's text (``jax.stages.Lowered.as_text()``): one per
    Pallas call site lowered with interpret mode off (a scan body's calls count once); 0 for a
    module whose kernels were interpreted (inlined as ordinary operations)."""
    return lowered_text.count(MOSAIC_CALL)


def pallas_equations(jaxpr) -> int:
    """``pallas_call`` equations of a jaxpr and of every jaxpr nested in its equations' parameters
    (scan, cond, shard_map, custom_vjp, remat, pjit bodies).

    Args:
      jaxpr: a ``jax.extend.core.Jaxpr`` or ``ClosedJaxpr`` (``jax.jit(f).trace(...).jaxpr``).
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "pallas_call"
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    n += pallas_equations(sub)
    return n


__all__ = ["MOSAIC_CALL", "interpret", "mosaic_calls", "pallas_equations", "pallas_interpret"]
