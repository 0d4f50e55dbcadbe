"""Parameter shardings from the logical axes that model fields declare.

Each parameter field is declared with :func:`lcx.models.params.param` (its logical axes; a module
field's axes are prepended to everything inside it, the scanned blocks add ``"layers"``).
:func:`~lcx.models.params.logical_axes` reads them into a pytree matching the model, and a plan's
*parameter* rules turn that into ``NamedSharding``s, so one call shards a whole model. Optimizer states built by optax mirror the
parameter tree, so the same axes serve them.
"""

from __future__ import annotations

import equinox as eqx
import jax
from jax.core import Tracer
from jax.sharding import NamedSharding
from jaxtyping import PRNGKeyArray, PyTree

from lcx.models.config import ModelConfig
from lcx.models.llama import Llama, init_model
from lcx.models.params import is_arraylike, logical_axes
from lcx.sharding import MeshPlan


def model_shardings(model: eqx.Module, plan: MeshPlan) -> PyTree[NamedSharding | None]:
    """``NamedSharding`` of every array leaf of ``model`` under ``plan``'s parameter rules.

    Works on abstract models (``eqx.filter_eval_shape``) too. Non-array leaves map to None.
    """
    return jax.tree.map(
        lambda leaf, axes: None if axes is None else plan.param_sharding(axes), model, logical_axes(model)
    )


def shard_model(model: eqx.Module, plan: MeshPlan) -> eqx.Module:
    """``model`` with every parameter placed on ``plan.mesh`` by the plan's parameter rules.

    Inside ``jit``, constrains instead (``with_sharding_constraint``). Rules are checked by
    :meth:`lcx.sharding.Plan.validate` with the config's ``dims()``; a dimension that a mesh
    axis does not divide fails here with JAX's error.
    """
    params, static = eqx.partition(model, eqx.is_array)
    shardings = model_shardings(model, plan)  # None exactly where params has no array

    def place(x, s):
        if isinstance(x, Tracer):
            return jax.lax.with_sharding_constraint(x, s)
        return jax.device_put(x, s)

    params = jax.tree.map(place, params, shardings)
    return eqx.combine(params, static)


def init_sharded(cfg: ModelConfig, plan: MeshPlan, *, key: PRNGKeyArray) -> Llama:
    """:func:`init_model`, compiled so that every parameter is created directly in its shard.

    No device ever holds the whole model, so this initialises models larger than one device's
    memory (the 70B preset on a pod slice).
    """
    abstract = eqx.filter_eval_shape(init_model, cfg, key=key)
    shardings = model_shardings(abstract, plan)
    _, static = eqx.partition(abstract, is_arraylike)
    make = jax.jit(lambda k: eqx.filter(init_model(cfg, key=k), eqx.is_array), out_shardings=shardings)
    return eqx.combine(make(key), static)
