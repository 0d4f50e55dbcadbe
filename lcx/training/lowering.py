"""A run's train step lowered for a platform this machine may not have (TPU, on a CPU machine).

:func:`lower_train_step` builds what :func:`lcx.training.preflight.setup` builds for the step
(the plan bound to ``devices``, the model's abstract structure, the optimizer, the sharded step;
no data, no parameters), traces the step on abstract arguments with the Pallas kernels out of
interpret mode (:func:`lcx.attention.kernels.pallas_interpret`), and lowers it with
``lowering_platforms=(platform,)``. JAX lowers each Pallas kernel to a Mosaic
``tpu_custom_call`` and each host-offload copy to an ``annotate_device_placement`` custom call
(``_xla_buffer_placement = "pinned_host"``) then, so a TPU-only failure of a kernel's block
shapes, layouts or dtypes, or a lost offload, is caught without a TPU. Nothing is compiled
(Mosaic's own compiler runs only on a TPU host) and nothing runs.

The devices must exist as JAX devices of this process (simulated CPU devices:
``jax_num_cpu_devices`` set before the backend starts), as many as the plan's mesh has.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from lcx.attention.kernels.interpret import mosaic_calls, pallas_equations, pallas_interpret
from lcx.sharding import bind
from lcx.training.config import RunConfig
from lcx.training.preflight import build_steps, resolve
from lcx.training.step import BATCH_KEYS

HOST_PLACEMENT = '_xla_buffer_placement = "pinned_host"'
"""How a lowered module marks a copy to host memory (``jax.device_put`` to ``pinned_host``)."""
HOST_ARGUMENT = 'mhlo.memory_kind = "pinned_host"'
"""How a lowered module marks an argument or result that lives in host memory."""


@dataclasses.dataclass(frozen=True)
class LoweredStep:
    """What lowering a train step found.

    Attributes:
      platform: the platform lowered for (``"tpu"``).
      n_devices: devices of the mesh.
      mosaic_calls: Mosaic kernel calls (``tpu_custom_call``) in the lowered module: one per
        Pallas call site of the traced program (a scan body's calls once).
      pallas_calls: ``pallas_call`` equations in the traced program (every nested jaxpr).
      host_copies: copies to host memory (:data:`HOST_PLACEMENT`) in the lowered module.
      host_arguments: arguments and results of the step in host memory (:data:`HOST_ARGUMENT` in
        the signature of ``main``): with ``memory.offload_params`` / ``offload_optimizer`` each
        parameter / optimizer-state leaf once as an argument and once as a result.
      param_leaves, opt_leaves: array leaves of the parameters and of the optimizer state.
      trace_s, lower_s: seconds spent tracing, and lowering the traced step.
    """

    platform: str
    n_devices: int
    mosaic_calls: int
    pallas_calls: int
    host_copies: int
    host_arguments: int
    param_leaves: int
    opt_leaves: int
    trace_s: float
    lower_s: float


def lower_train_step(config: RunConfig, devices=None, *, platform: str = "tpu") -> LoweredStep:
    """Lower ``config``'s train step for ``platform`` with interpret mode off.

    Args:
      config: the run (its plan, model, ``train.seq_len`` / ``global_batch``, ``memory:``).
      devices: the JAX devices of the mesh (default: all of this process's); simulated CPU
        devices lower for TPU as real ones would.
      platform: the lowering platform, ``"tpu"`` (the only one Mosaic kernels lower for).

    Returns:
      The :class:`LoweredStep` counts and times.

    Raises:
      PlanError / ValueError: what :func:`lcx.training.preflight.resolve` refuses (memory not
        checked: the ledger's limits are the hardware preset's, not this machine's), and what a
        Pallas kernel's TPU lowering refuses (e.g. a block shape Mosaic cannot tile).
    """
    devices = list(jax.devices() if devices is None else devices)
    resolve(config, len(devices), check_memory=False)
    mp = bind(config.plan, devices)
    built = build_steps(config, mp, jax.random.key(config.train.seed))
    opt = jax.eval_shape(built.optimizer.init, built.abstract_params)
    shape = (config.train.global_batch, config.train.seq_len)
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.float32 if k == "loss_mask" else jnp.int32) for k in BATCH_KEYS}
    with pallas_interpret(False):
        t0 = time.perf_counter()
        traced = built.steps.train.trace(built.abstract_params, opt, batch)
        t1 = time.perf_counter()
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        t2 = time.perf_counter()
    return LoweredStep(
        platform=platform,
        n_devices=len(devices),
        mosaic_calls=mosaic_calls(text),
        pallas_calls=pallas_equations(traced.jaxpr),
        host_copies=text.count(HOST_PLACEMENT),
        host_arguments=sum(
            line.count(HOST_ARGUMENT) for line in text.splitlines() if "func.func public @main(" in line
        ),
        param_leaves=len(jax.tree.leaves(built.abstract_params)),
        opt_leaves=len(jax.tree.leaves(opt)),
        trace_s=t1 - t0,
        lower_s=t2 - t1,
    )


__all__ = ["HOST_ARGUMENT", "HOST_PLACEMENT", "LoweredStep", "lower_train_step"]
