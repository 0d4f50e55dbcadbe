"""Parameter shardings from the logical axes that model fields declare.

Each parameter field carries ``eqx.field(metadata={"axes": (...)})``; a module field's axes are
prepended to everything inside it (the scanned blocks add ``"layers"``). :func:`logical_axes`
reads them into a pytree matching the model, and a plan's *parameter* rules turn that into
``NamedSharding``s, so one call shards a whole model. Optimizer states built by optax mirror the
parameter tree, so the same axes serve them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
from jax.core import Tracer
from jax.sharding import NamedSharding
from jaxtyping import PRNGKeyArray, PyTree

from lcx.models.config import ModelConfig
from lcx.models.llama import Llama, init_model
from lcx.sharding import MeshPlan

Axes = tuple[str, ...]


def _is_arraylike(x: Any) -> bool:
    # abstract models (eval_shape) hold ShapeDtypeStructs, which eqx.is_array rejects
    return isinstance(x, jax.ShapeDtypeStruct) or eqx.is_array(x)


def _field_axes(obj: Any, name: str) -> Axes:
    for f in dataclasses.fields(obj):
        if f.name == name:
            return tuple(f.metadata.get("axes", ()))
    return ()


def logical_axes(model: eqx.Module) -> PyTree[Axes | None]:
    """Logical axis names of every array leaf of ``model``.

    Returns:
      A pytree with the structure of ``model`` whose leaves (at the positions of the model's
      leaves) are tuples of logical axis names, one per array dimension, or None for leaves that
      are not arrays. Map over it with ``is_leaf=lambda x: isinstance(x, tuple)``, or with the
      model as the first tree: ``jax.tree.map(f, model, logical_axes(model))``.

    Raises:
      ValueError: an array leaf whose declared axes do not match its number of dimensions (a
        field without ``metadata={"axes": ...}``, or a stacked module without its ``layers``).
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model)
    out = []
    for path, leaf in leaves:
        # the node the path has reached: a module, or a container (list, dict) of them
        obj: Any = model
        axes: Axes = ()
        for entry in path:
            if isinstance(entry, jax.tree_util.GetAttrKey) and dataclasses.is_dataclass(obj):
                axes = axes + _field_axes(obj, entry.name)
                obj = getattr(obj, entry.name)
            else:  # containers (lists, dicts) declare no axes of their own
                obj = obj[getattr(entry, "idx", getattr(entry, "key", None))]
        if not _is_arraylike(leaf):
            out.append(None)
            continue
        if len(axes) != leaf.ndim:
            raise ValueError(
                f"parameter {jax.tree_util.keystr(path)} has shape {leaf.shape} but declares logical axes "
                f"{axes}; give its field eqx.field(metadata={{'axes': (...)}}) with one name per dimension"
            )
        out.append(axes)
    return jax.tree_util.tree_unflatten(treedef, out)


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
    _, static = eqx.partition(abstract, _is_arraylike)
    make = jax.jit(lambda k: eqx.filter(init_model(cfg, key=k), eqx.is_array), out_shardings=shardings)
    return eqx.combine(make(key), static)
