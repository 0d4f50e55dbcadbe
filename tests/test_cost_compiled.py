"""The cost ledger against XLA: per-device memory of the compiled train step (tiny Llama, 8 CPU devices).

Compiles (never runs) lcx.training's real train step for each strategy and compares
``memory_analysis()`` (arguments + outputs - aliased + temporaries) with
``lcx.cost.memory_breakdown(...).total``; experiments/ledger_vs_compiled.py prints the full table.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "experiments"))
import ledger_vs_compiled as lvc  # noqa: E402


@pytest.mark.parametrize("strategy", ["allgather", "a2a", "ring", "usp"])
def test_ledger_within_15_percent_of_compiled(devices, strategy):
    with jax.numpy_dtype_promotion("standard"):  # optax's Adam: float ** int32 step
        row = lvc.compare(strategy, 4096, "full")
    assert abs(row["ratio"] - 1) <= 0.15, row
