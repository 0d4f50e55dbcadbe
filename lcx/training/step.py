"""The jitted training and evaluation steps, sharded by the plan.

Parameters, gradients and optimizer state follow the plan's *parameter* rules (through the
logical axes every model parameter carries); the batch follows the *activation* rules
(``batch`` and ``seq``). The loss is the global sum over valid tokens divided by the global
count of valid tokens, computed on global arrays inside one ``jit``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from lcx.data.packing import BATCH_KEYS as BATCH_KEYS  # the five arrays of a batch, defined once
from lcx.sharding import MeshPlan
from lcx.training.config import MemoryOptions
from lcx.training.loss import VocabTiles, loss_sum_and_count, vocab_tiled_loss_sum_and_count

BATCH_AXES = ("batch", "seq")
HOST = "pinned_host"
"""The JAX memory kind of offloaded parameters / optimizer state between steps."""
DEVICE = "device"


def with_memory_kind(shardings: Any, kind: str) -> Any:
    """A pytree of ``jax.sharding.Sharding`` with every leaf moved to memory ``kind``
    (:data:`HOST` or :data:`DEVICE`); the partitioning is unchanged (JAX's "Memories and host
    offloading" guide; MaxText's ``optimizer_memory_host_offload``)."""
    return jax.tree.map(
        lambda s: s.with_memory_kind(kind), shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )


@dataclasses.dataclass(frozen=True)
class Steps:
    """Compiled-on-first-call step functions bound to one plan, optimizer and model structure.

    Attributes:
      train: ``(params, opt_state, batch) -> (params, opt_state, metrics)``; donates params and
        optimizer state. ``metrics`` has ``loss`` (nats/token), ``grad_norm``, ``tokens`` (valid
        tokens in the step).
      evaluate: ``(params, batch) -> (loss_sum, count)``.
      param_shardings, opt_shardings: where parameters and optimizer state live between steps
        (the plan's NamedShardings, in ``pinned_host`` memory when offloaded).
      batch_sharding: the batch's NamedSharding.
      memory: the :class:`~lcx.training.config.MemoryOptions` the steps were built with.
    """

    train: jax.stages.Wrapped  # jitted: lowered and compiled ahead by the loop
    evaluate: jax.stages.Wrapped
    param_shardings: Any
    opt_shardings: Any
    batch_sharding: jax.sharding.NamedSharding
    memory: MemoryOptions = MemoryOptions()


def make_steps(
    model: eqx.Module,
    optimizer: optax.GradientTransformation,
    plan: MeshPlan,
    param_shardings,
    memory: MemoryOptions | None = None,
) -> Steps:
    """Build the train/eval steps for ``model``'s structure under ``plan``.

    With ``memory.offload_params`` / ``memory.offload_optimizer`` the parameters / optimizer
    state arrive in and return to ``pinned_host`` memory (``Steps.param_shardings`` /
    ``Steps.opt_shardings``); inside the step they are copied to the device (``jax.device_put``
    to the same sharding in ``device`` memory): the parameters at the start, the optimizer state
    for the update, after the backward. With ``memory.vocab_tiling > 1`` the loss is
    :func:`~lcx.training.loss.vocab_tiled_loss_sum_and_count` (no ``[B, T, V]`` logits).

    Args:
      model: the Equinox model (only its structure and static fields are captured).
      optimizer: an optax transformation.
      plan: the plan bound to a mesh.
      param_shardings: pytree of NamedSharding matching ``eqx.filter(model, eqx.is_array)``, in
        device memory (:func:`lcx.models.model_shardings`).
      memory: tiling and offload options (None: none of them).

    Raises:
      ValueError: ``memory.vocab_tiling`` does not divide the local sequence (at the first call,
        when the batch shape is known; ``lcx.train`` checks it before compiling).
    """
    mem = memory or MemoryOptions()
    params, static = eqx.partition(model, is_arraylike)
    dev_p = with_memory_kind(param_shardings, DEVICE)
    dev_opt = opt_state_shardings(optimizer, params, dev_p, plan.replicated())
    rest_p = with_memory_kind(dev_p, HOST) if mem.offload_params else dev_p
    rest_opt = with_memory_kind(dev_opt, HOST) if mem.offload_optimizer else dev_opt
    batch_sharding = plan.activation_sharding(BATCH_AXES)
    batch_shardings = {k: batch_sharding for k in BATCH_KEYS}

    loss_fn = loss_function(static, plan, mem)

    def to_device(p):
        return jax.device_put(p, dev_p) if mem.offload_params else p

    def train(p, opt_state, batch):
        p = to_device(p)
        (loss, (_, c)), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, batch)
        if mem.offload_optimizer:
            opt_state = jax.device_put(opt_state, dev_opt)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        p = optax.apply_updates(p, updates)
        if mem.offload_params:
            p = jax.device_put(p, rest_p)
        if mem.offload_optimizer:
            opt_state = jax.device_put(opt_state, rest_opt)
        return p, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), "tokens": c}

    def evaluate(p, batch):
        _, (s, c) = loss_fn(to_device(p), batch)
        return s, c

    rep = plan.replicated()
    train_j = jax.jit(
        train,
        in_shardings=(rest_p, rest_opt, batch_shardings),
        out_shardings=(rest_p, rest_opt, {"loss": rep, "grad_norm": rep, "tokens": rep}),
        donate_argnums=(0, 1),
    )
    eval_j = jax.jit(evaluate, in_shardings=(rest_p, batch_shardings), out_shardings=(rep, rep))
    return Steps(train_j, eval_j, rest_p, rest_opt, batch_sharding, mem)


def loss_function(static: Any, plan: MeshPlan, memory: MemoryOptions | None = None) -> Callable:
    """The training objective ``(params, batch) -> (loss, (loss_sum, count))`` of a model.

    ``loss = loss_sum / max(count, 1)`` in nats per valid token: the global sum of token NLL over
    the global count of valid tokens. With ``memory.vocab_tiling > 1`` the logits are never formed
    whole (:func:`~lcx.training.loss.vocab_tiled_loss_sum_and_count`); the result is the untiled
    one up to float32 summation order.

    Args:
      static: the model's static part (``eqx.partition(model, is_arraylike)[1]``).
      plan: the plan bound to a mesh.
      memory: tiling options (None: untiled).
    """
    mem = memory or MemoryOptions()

    def loss_fn(p, batch):
        m = eqx.combine(p, static)
        if mem.vocab_tiling == 1:
            logits = m(batch["tokens"], batch["positions"], batch["segment_ids"], plan=plan)
            s, c = loss_sum_and_count(logits, batch["targets"], batch["loss_mask"])
        else:
            h = m.features(batch["tokens"], batch["positions"], batch["segment_ids"], plan=plan)
            s, c = vocab_tiled_loss_sum_and_count(
                h,
                m.output_head(),
                batch["targets"],
                batch["loss_mask"],
                VocabTiles(mem.vocab_tiling, plan.context_degree, plan.constrain),
            )
        return s / jnp.maximum(c, 1.0), (s, c)

    return loss_fn


def is_arraylike(x: Any) -> bool:
    """Arrays and ``jax.ShapeDtypeStruct`` (what ``eqx.filter_eval_shape`` leaves hold)."""
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def opt_state_shardings(
    optimizer: optax.GradientTransformation, params: Any, param_shardings: Any, replicated: jax.sharding.Sharding
) -> Any:
    """Shardings of ``optimizer``'s state: each per-parameter state (Adam's mu and nu) like its
    parameter, everything else (optax's scalar ``count``) replicated. ``params`` may be concrete
    or abstract (``ShapeDtypeStruct``), so a restore target can be built before any parameter
    exists."""
    abstract_opt = jax.eval_shape(optimizer.init, params)
    return optax.tree_map_params(
        optimizer,
        lambda _, s: s,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: replicated,
        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding),
    )
