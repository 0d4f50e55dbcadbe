"""The training state: one :class:`TrainState` module holds everything a run needs to continue.

Parameters, optimizer state, the count of completed steps, the training RNG key and the data
stream's position (:meth:`lcx.data.BatchStream.state`). A checkpoint
(:mod:`lcx.training.checkpoint`) is exactly one ``TrainState``: its arrays (:meth:`TrainState.arrays`,
orbax's ``state`` item) and its host part as JSON (:meth:`TrainState.meta`, in orbax's ``meta``
item). Building one (fresh, or the abstract restore target whose shardings are the *new*
run's) is :mod:`lcx.training.resume`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


class TrainState(eqx.Module):
    """Everything that evolves during training.

    Attributes:
      params: the model's arrays (``eqx.filter(model, is_arraylike)``; ``eqx.combine`` with the
        static part gives the model), placed by the run's parameter shardings.
      opt_state: the optax state of ``params`` (shardings ``Steps.opt_shardings``).
      step: completed optimizer steps (0 before the first); host int, not traced.
      rng: the training PRNG key (typed), or None where a caller carries none (a test's save).
      data: the data stream position to resume at (:meth:`lcx.data.BatchStream.state`: JSON, e.g.
        grain's iterator state), or None.
    """

    params: Any
    opt_state: Any
    step: int = eqx.field(static=True, default=0)
    rng: jax.Array | None = None
    data: dict[str, Any] | None = eqx.field(static=True, default=None)

    def arrays(self) -> dict[str, Any]:
        """The arrays a checkpoint writes: ``{"params", "opt_state"}`` (orbax ``state`` item)."""
        return {"params": self.params, "opt_state": self.opt_state}

    def meta(self) -> dict[str, Any]:
        """The host part as JSON: ``step``, ``data`` (position) and ``rng`` (:func:`key_to_json`)."""
        return {"step": int(self.step), "data": self.data, "rng": None if self.rng is None else key_to_json(self.rng)}

    def replace(self, **changes: Any) -> TrainState:
        """A copy with ``changes`` (the fields are frozen)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_checkpoint(cls, arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> TrainState:
        """Inverse of :meth:`arrays` and :meth:`meta` (the RNG key bit-exact)."""
        rng = meta.get("rng")
        return cls(
            params=arrays["params"],
            opt_state=arrays["opt_state"],
            step=int(meta["step"]),
            rng=None if rng is None else key_from_json(rng),
            data=meta.get("data"),
        )


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`lcx.training.loop.train` returns.

    Attributes:
      losses: the loss of each step this call trained, nats/token.
      final_loss: the last step's loss; None when this call trained no step (the checkpoint
        already reached ``train.steps``).
      val_loss: the last validation loss (the checkpoint's when no step was trained), or None.
      state: the final :class:`TrainState`.
      static: the model's static part (``eqx.combine(state.params, static)`` is the model).
      run_dir: the run directory, as a string.
      compile_s: seconds the train step took to compile (None: nothing compiled).
      start_step: steps already done when this call began (0, or the restored step).
    """

    losses: list[float]
    final_loss: float | None
    val_loss: float | None
    state: TrainState
    static: Any
    run_dir: str
    compile_s: float | None
    start_step: int

    @property
    def params(self) -> Any:
        """The final parameters (``state.params``)."""
        return self.state.params


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths (``jax.tree_util.keystr``) of the floating-point leaves of ``tree`` that hold a NaN
    or an infinity; empty if all are finite. One small reduction per leaf, run on the devices."""
    leaves = [
        (jax.tree_util.keystr(p), x)
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)
    ]
    if not leaves:
        return []
    flags = jax.device_get(_all_finite([x for _, x in leaves]))
    return [name for (name, _), ok in zip(leaves, flags) if not bool(ok)]


@jax.jit
def _all_finite(xs):
    return [jnp.all(jnp.isfinite(x)) for x in xs]


def nonfinite_report(
    state: TrainState, loss: float, grad_norm: float, *, checkpoint_dir: Any = None, saved_step: int | None = None
) -> str:
    """The diagnostic of a non-finite step: which scalars (``loss``, nats/token, and the global
    gradient norm), which tensors of ``state`` (:func:`nonfinite_leaves`), what was kept.

    Args:
      state: the state after the step (``state.step`` is the step).
      loss: the step's loss, nats/token.
      grad_norm: the step's global gradient norm (one of the two is non-finite).
      checkpoint_dir: the run's ``checkpoint.dir`` (None: checkpointing off).
      saved_step: the newest checkpoint on disk there (None: none).
    """
    step = state.step
    bad = nonfinite_leaves(state.arrays())
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    msg = f"non-finite {what} at step {step} (loss={loss}, grad_norm={grad_norm}); "
    if bad:
        msg += f"non-finite tensors after the update: {', '.join(bad[:8])}"
        msg += f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    else:
        msg += "parameters and optimizer state are still finite (the forward pass overflowed)"
    if checkpoint_dir is not None:
        msg += (
            f". Step {step} was not checkpointed; the last checkpoint is step {saved_step} in {checkpoint_dir}"
            if saved_step is not None
            else f". Nothing was checkpointed in {checkpoint_dir}"
        )
    return msg + ". Lower train.lr, lengthen train.warmup_steps or check the data"


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A typed PRNG key as JSON: its implementation name and raw ``uint32`` key data."""
    data = np.asarray(jax.random.key_data(key))
    return {"impl": str(jax.random.key_impl(key)), "data": data.astype(np.uint32).tolist()}


def key_from_json(d: Mapping[str, Any]) -> jax.Array:
    """Inverse of :func:`key_to_json` (bit-exact)."""
    return jax.random.wrap_key_data(jnp.asarray(np.asarray(d["data"], dtype=np.uint32)), impl=d["impl"])


def finite_or_none(x: float | None) -> float | None:
    """JSON cannot hold NaN/inf portably: store None instead."""
    return None if x is None or not math.isfinite(x) else float(x)


__all__ = [
    "TrainResult",
    "TrainState",
    "finite_or_none",
    "key_from_json",
    "key_to_json",
    "nonfinite_leaves",
    "nonfinite_report",
]
