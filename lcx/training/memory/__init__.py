"""Fitting a training step in memory, in one place: the ``memory:`` options, the cost ledger's
estimate of a step against the hardware's memory, the advice when it does not fit, and the
dry run's anatomy of that estimate.

The training loop's entry is :func:`fit_step`, called once per run before anything compiles
(:func:`lcx.training.preflight.resolve`); ``train.dry_run=true`` renders the same estimate with
:func:`memory_anatomy`. Inside: :mod:`~lcx.training.memory.estimate` prices a step
(:class:`MemoryCheck`), :mod:`~lcx.training.memory.fixes` prices the changes it may suggest,
:mod:`~lcx.training.memory.fit` refuses a step with them, :mod:`~lcx.training.memory.anatomy`
renders it. Offloaded arrays are placed by :mod:`lcx.training.step`.
"""

from lcx.training.config import PLAN_ONLY_KEYS, MemoryOptions
from lcx.training.memory.anatomy import memory_anatomy
from lcx.training.memory.estimate import MemoryCheck, format_count, memory_check, memory_policy
from lcx.training.memory.fit import check_tiling, fit_step

__all__ = [
    "PLAN_ONLY_KEYS",
    "MemoryCheck",
    "MemoryOptions",
    "check_tiling",
    "fit_step",
    "format_count",
    "memory_anatomy",
    "memory_check",
    "memory_policy",
]
