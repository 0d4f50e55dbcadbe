"""Per-parameter metadata: the logical axes that shard a parameter and the role that decides
its weight decay.

Every parameter field of an lcx model is declared as ``eqx.field(metadata=param(...))``;
:func:`param` names two things:

- ``axes``: one logical axis name per dimension (``("embed", "heads", "head_dim")``); a module
  field may carry axes of its own (the stacked blocks carry ``("layers",)``), prepended to those
  of everything inside it. :func:`logical_axes` reads them; :mod:`lcx.models.sharding` turns
  them into shardings through a plan.
- ``role``: what the parameter is, one of :data:`ROLES`. :func:`decay_mask` reads it: AdamW's
  decoupled weight decay applies to the roles :data:`ROLES` marks True.

The weight-decay convention (:data:`ROLES`) follows GPT-2/nanoGPT and Levanter: the matrices of
linear maps and the token embedding (the output head too, tied or not) are decayed; norm gains,
biases and attention-sink logits are not, since decay would pull a gain towards 0 instead of its
neutral value 1 and a per-head or per-channel offset towards a value with no meaning (the mistake
Levanter PR #405 fixed). A parameter is decayed because its role says so, never because of its
rank: the blocks are stacked over layers, so a norm gain is ``[L, D]`` and a sink ``[L, N]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, NamedTuple

import equinox as eqx
import jax
from jaxtyping import PyTree

__all__ = ["ROLES", "Parameter", "decay_mask", "is_arraylike", "logical_axes", "param", "parameter_roles", "parameters"]

ROLES: dict[str, bool] = {
    "weight": True,  # the matrix of a linear map: projections, MLP, output head
    "embedding": True,  # the token embedding table (by choice, as GPT-2 and nanoGPT decay it)
    "norm": False,  # a norm's gain (or a scale-per-channel parameter): its neutral value is 1
    "bias": False,  # an additive offset per channel
    "sink": False,  # an attention-sink logit per head (gpt-oss; lcx.attention.sinks)
}
"""Each parameter role and whether AdamW's weight decay applies to it (:func:`decay_mask`). A new
kind of parameter picks one of these roles, or adds its own line here."""

Axes = tuple[str, ...]


def param(*axes: str, role: str) -> dict[str, Any]:
    """The ``eqx.field`` metadata of a parameter: its logical axes (one per dimension) and its
    role. Declare a parameter field as ``w: Array = eqx.field(metadata=param("embed", "mlp",
    role="weight"))`` (a call of ``eqx.field`` itself, so type checkers see a field without a
    default).

    Args:
      axes: the logical axis names of the parameter's dimensions, outermost first.
      role: one of :data:`ROLES`.

    Raises:
      ValueError: ``role`` is not in :data:`ROLES`.
    """
    if role not in ROLES:
        raise ValueError(f"parameter role {role!r} is unknown; use one of {sorted(ROLES)} or add it to ROLES")
    return {"axes": tuple(axes), "role": role}


class Parameter(NamedTuple):
    """One array leaf of a model: where it is, what it is, how it is laid out."""

    path: str
    """``jax.tree_util.keystr`` of the leaf, e.g. ``.blocks.attn_norm.weight``."""
    leaf: Any
    """The array (or ``jax.ShapeDtypeStruct`` of an abstract model)."""
    axes: Axes
    """Logical axis names, one per dimension (module fields' axes first)."""
    role: str | None
    """The role of the field holding the leaf (None: the field declares none)."""


def is_arraylike(x: Any) -> bool:
    """Arrays and ``jax.ShapeDtypeStruct`` (abstract models from ``eqx.filter_eval_shape`` hold
    these, which ``eqx.is_array`` rejects)."""
    return isinstance(x, jax.ShapeDtypeStruct) or eqx.is_array(x)


def _field_metadata(obj: Any, name: str) -> dict[str, Any]:
    for f in dataclasses.fields(obj):
        if f.name == name:
            return dict(f.metadata)
    return {}


def _walk(model: PyTree) -> Iterator[tuple[str, Any, Axes, str | None]]:
    """``(path, leaf, axes, role)`` of every leaf of ``model`` (array or not), in tree order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(model)
    for path, leaf in leaves:
        obj: Any = model  # the node the path has reached: a module, or a container of them
        axes: Axes = ()
        role = None
        for entry in path:
            if isinstance(entry, jax.tree_util.GetAttrKey) and dataclasses.is_dataclass(obj):
                meta = _field_metadata(obj, entry.name)
                axes = axes + tuple(meta.get("axes", ()))
                role = meta.get("role")  # the innermost field's role: the leaf's own field
                obj = getattr(obj, entry.name)
            else:  # containers (lists, dicts) declare no axes or role of their own
                obj = obj[getattr(entry, "idx", getattr(entry, "key", None))]
                role = None
        yield jax.tree_util.keystr(path), leaf, axes, role


def parameters(model: PyTree) -> list[Parameter]:
    """Every array leaf of ``model`` with its path, logical axes and role, in tree order.

    Raises:
      ValueError: an array leaf whose declared axes do not match its number of dimensions (a
        field not declared with :func:`param`, or a stacked module without its ``layers``), or
        that declares no role. The message names the leaf and the fix.
    """
    out = []
    for path, leaf, axes, role in _walk(model):
        if not is_arraylike(leaf):
            continue
        if len(axes) != leaf.ndim:
            raise ValueError(
                f"parameter {path} has shape {leaf.shape} but declares logical axes {axes}; declare its "
                f"field with eqx.field(metadata=lcx.models.params.param(<one axis name per dimension>, role=...))"
            )
        if role not in ROLES:
            raise ValueError(
                f"parameter {path} declares no role (found {role!r}); declare its field with "
                f"eqx.field(metadata=lcx.models.params.param(..., role=<one of {sorted(ROLES)}>))"
            )
        out.append(Parameter(path, leaf, axes, role))
    return out


def _per_leaf(model: PyTree, value) -> PyTree:
    """A pytree shaped like ``model``: ``value(Parameter)`` at array leaves, None elsewhere."""
    _, treedef = jax.tree_util.tree_flatten(model)
    found = iter(parameters(model))
    leaves = [value(next(found)) if is_arraylike(leaf) else None for leaf in jax.tree_util.tree_leaves(model)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def logical_axes(model: PyTree) -> PyTree[Axes | None]:
    """Logical axis names of every array leaf of ``model``.

    Returns:
      A pytree with the structure of ``model`` whose leaves (at the positions of the model's
      leaves) are tuples of logical axis names, one per array dimension, or None for leaves that
      are not arrays. Map over it with ``is_leaf=lambda x: isinstance(x, tuple)``, or with the
      model as the first tree: ``jax.tree.map(f, model, logical_axes(model))``.

    Raises:
      ValueError: as :func:`parameters`.
    """
    return _per_leaf(model, lambda p: p.axes)


def parameter_roles(model: PyTree) -> PyTree[str | None]:
    """The role (:data:`ROLES`) of every array leaf of ``model``; None at non-array leaves.

    Raises:
      ValueError: as :func:`parameters`.
    """
    return _per_leaf(model, lambda p: p.role)


def decay_mask(params: PyTree) -> PyTree[bool | None]:
    """Which leaves AdamW's weight decay applies to: True where the leaf's role is decayed in
    :data:`ROLES` (weights, embeddings), False for norm gains, biases and sinks.

    Args:
      params: the model's arrays (``eqx.filter(model, eqx.is_array)``), or the model itself.

    Returns:
      A pytree of the structure of ``params``: a bool at each array leaf, None elsewhere (the
      ``mask`` that ``optax.adamw`` takes).

    Raises:
      ValueError: as :func:`parameters`: every array must declare its role.
    """
    return _per_leaf(params, lambda p: ROLES[p.role])
