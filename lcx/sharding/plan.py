"""The declarative sharding plan.

A :class:`Plan` is a frozen, hashable value: a device mesh (axis names with sizes), rules from
logical axis names to mesh axes kept separately for parameters and for activations, and the
context-parallel attention configuration (:class:`AttentionConfig`, in
:mod:`lcx.sharding.attention_config` with the lookup of registered strategies and kernels).
Plans compose in code by pure functions (:meth:`Plan.with_mesh`, :meth:`Plan.with_rule`,
:meth:`Plan.with_attention`) and round-trip through the Hydra ``plan=`` group
(:func:`plan_from_config`, :meth:`Plan.to_config`).

The sequence is split over the mesh axes that the *activation* rule for ``seq`` names; their
product is the context-parallel degree. :meth:`Plan.validate` refuses a plan that cannot work,
before anything compiles, with a message that names the axis, the numbers and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from lcx.sharding import axes as ax
from lcx.sharding.attention_config import KERNELS as KERNELS
from lcx.sharding.attention_config import STRATEGIES as STRATEGIES
from lcx.sharding.attention_config import AttentionConfig as AttentionConfig
from lcx.sharding.attention_config import kernel_class as kernel_class
from lcx.sharding.attention_config import strategy_class as strategy_class
from lcx.sharding.errors import PlanError as PlanError
from lcx.sharding.layout import check_layout

MeshAxes = str | tuple[str, ...] | None
# what a rule may be written as (a YAML list, a tuple, one name, null) before normalisation
MeshAxesLike = str | Sequence[str] | None
RulesLike = Sequence[tuple[str, MeshAxesLike]] | Mapping[str, MeshAxesLike]
"""What a rule maps a logical axis to: one mesh axis, a tuple of mesh axes (major to minor), or
``None`` (replicated)."""


def _as_axes(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,)
    return tuple(v)


def _norm_rule(v: Any) -> MeshAxes:
    t = _as_axes(v)
    if not t:
        return None
    return t[0] if len(t) == 1 else t


@dataclasses.dataclass(frozen=True, init=False)
class Plan:
    """A sharding plan: mesh, parameter rules, activation rules, attention configuration.

    Attributes:
      mesh: ``((axis_name, size), ...)`` major to minor; at most one size may be ``-1``, which
        fills the remaining devices (resolved by :meth:`mesh_shape`).
      params: ``((logical_axis, mesh_axes), ...)`` rules for parameters (and their gradients and
        optimizer state), sorted by logical axis. Logical axes without a rule are replicated.
      activations: rules for activations (inputs, residual stream, q/k/v, logits).
      attention: the context-parallel attention configuration.
      name: a label for tables and run directories; not part of the semantics.
    """

    # the fields hold the normalised values; __init__ accepts the looser forms (YAML lists,
    # mappings) and normalises them, so equal plans compare and hash equal
    mesh: tuple[tuple[str, int], ...]
    params: tuple[tuple[str, MeshAxes], ...]
    activations: tuple[tuple[str, MeshAxes], ...]
    attention: AttentionConfig
    name: str

    def __init__(
        self,
        mesh: Sequence[tuple[str, int]] | Mapping[str, int] = (("data", -1),),
        params: RulesLike = (),
        activations: RulesLike = (("batch", "data"),),
        attention: AttentionConfig | Mapping[str, Any] | None = None,
        name: str = "custom",
    ):
        """Normalise and check a plan (the arguments as the attributes, in any container).

        Raises:
          PlanError: an unknown or repeated mesh axis, a bad size, an unknown logical axis, a
            rule naming an undeclared mesh axis, or the strategy's own axis rules.
        """
        # None: AttentionConfig() asks the strategy registry, which is not imported yet at import
        if attention is None:
            attention = AttentionConfig()
        elif isinstance(attention, Mapping):
            attention = AttentionConfig(**attention)
        object.__setattr__(self, "mesh", tuple((str(n), int(s)) for n, s in _items(mesh)))
        object.__setattr__(self, "params", tuple(sorted((str(k), _norm_rule(v)) for k, v in _items(params))))
        object.__setattr__(self, "activations", tuple(sorted((str(k), _norm_rule(v)) for k, v in _items(activations))))
        object.__setattr__(self, "attention", attention)
        object.__setattr__(self, "name", name)
        self._check_static()

    # ------------------------------------------------------------------ static structure checks
    def _check_static(self) -> None:
        names = [n for n, _ in self.mesh]
        for n in names:
            if n not in ax.MESH_AXES:
                raise PlanError(f"unknown mesh axis {n!r} in plan.mesh; known mesh axes are {ax.MESH_AXES}")
        if len(set(names)) != len(names):
            raise PlanError(f"mesh axis declared twice in plan.mesh: {names}")
        if sum(1 for _, s in self.mesh if s == -1) > 1:
            raise PlanError(f"at most one mesh axis may have size -1 (fill the rest), got {dict(self.mesh)}")
        for n, s in self.mesh:
            if s == 0 or s < -1:
                raise PlanError(f"mesh axis {n!r} has size {s}; sizes are positive or -1 (fill)")
        for kind, rules in (("params", self.params), ("activations", self.activations)):
            for logical, mesh_axes in rules:
                if logical not in ax.LOGICAL_AXES:
                    raise PlanError(
                        f"unknown logical axis {logical!r} in plan.{kind}; known logical axes are {ax.LOGICAL_AXES}"
                    )
                for m in _as_axes(mesh_axes):
                    if m not in names:
                        raise PlanError(
                            f"plan.{kind}.{logical} maps to mesh axis {m!r}, which plan.mesh does not declare "
                            f"(mesh axes: {names}); add it to plan.mesh or change the rule"
                        )
        # each strategy's own rules on the mesh axes it needs (USP: exactly two named ones); the
        # strategies of a per-kind plan share its mesh, so each must accept it
        for name in self.attention.strategy_names:
            self._strategy_rule(name, lambda cls: cls.check_plan_axes(self))

    def _strategy_rule(self, name: str, rule) -> None:
        """Run ``rule(strategy class)``; under a per-kind plan a refusal names the kinds the
        strategy runs and, when several strategies share the mesh, the fix."""
        try:
            rule(strategy_class(name))
        except PlanError as e:
            strategies = self.attention.strategy
            if isinstance(strategies, str):
                raise
            mine = "/".join(k for k, n in strategies.items() if n == name)
            names = self.attention.strategy_names
            shared = (
                f"; the strategies of plan.attention.strategy {strategies!r} share one mesh {dict(self.mesh)}, so "
                f"each must accept its axes: choose, for the {mine} layers, a strategy that runs on the mesh the "
                f"others need, or a mesh all of {names} accept"
                if len(names) > 1
                else ""
            )
            raise PlanError(f"{e} [{mine} layers' strategy {name!r}{shared}]") from None

    # ------------------------------------------------------------------ derived properties
    @property
    def mesh_axis_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.mesh)

    @property
    def param_rules(self) -> dict[str, tuple[str, ...]]:
        return {k: _as_axes(v) for k, v in self.params}

    @property
    def activation_rules(self) -> dict[str, tuple[str, ...]]:
        return {k: _as_axes(v) for k, v in self.activations}

    @property
    def seq_axes(self) -> tuple[str, ...]:
        """Mesh axes the sequence is split over (context parallelism), major to minor."""
        return self.activation_rules.get(ax.SEQ, ())

    @property
    def batch_axes(self) -> tuple[str, ...]:
        return self.activation_rules.get(ax.BATCH, ())

    def mesh_shape(self, n_devices: int) -> dict[str, int]:
        """Mesh axis sizes with ``-1`` resolved for ``n_devices`` devices.

        Raises:
          PlanError: the product of the sizes differs from ``n_devices`` (or does not divide it
            when one axis is ``-1``).
        """
        fixed = math.prod(s for _, s in self.mesh if s != -1)
        shape = dict(self.mesh)
        fill = [n for n, s in self.mesh if s == -1]
        if fill:
            if n_devices % fixed:
                raise PlanError(
                    f"plan.mesh {dict(self.mesh)}: the fixed axes use {fixed} devices, which does not divide "
                    f"the {n_devices} available; change the fixed sizes"
                )
            shape[fill[0]] = n_devices // fixed
        elif fixed != n_devices:
            raise PlanError(
                f"plan.mesh {dict(self.mesh)} has {fixed} devices but {n_devices} are available; "
                f"make the sizes multiply to {n_devices} or set one of them to -1"
            )
        return shape

    def axis_size(self, mesh_axes: Sequence[str] | str | None, n_devices: int) -> int:
        shape = self.mesh_shape(n_devices)
        return math.prod(shape[m] for m in _as_axes(mesh_axes))

    def context_degree(self, n_devices: int) -> int:
        """Context-parallel degree P: product of the sizes of the mesh axes the sequence is split over."""
        return self.axis_size(self.seq_axes, n_devices)

    # ------------------------------------------------------------------ composition (pure)
    def with_mesh(self, **sizes: int) -> Plan:
        """A new plan whose mesh has these axis sizes; axes not named keep theirs, new ones append."""
        mesh = dict(self.mesh)
        mesh.update(sizes)
        return dataclasses.replace(self, mesh=tuple(mesh.items()))

    def with_rule(self, logical: str, mesh_axes: MeshAxes, *, kind: str = "both") -> Plan:
        """A new plan with ``logical -> mesh_axes`` for ``kind`` in {"params", "activations", "both"}."""
        if kind not in ("params", "activations", "both"):
            raise PlanError(f"kind must be 'params', 'activations' or 'both', got {kind!r}")
        out = self
        for k in ("params", "activations"):
            if kind in (k, "both"):
                rules = dict(getattr(out, k))
                rules[logical] = mesh_axes
                out = dataclasses.replace(out, **{k: tuple(rules.items())})
        return out

    def with_attention(self, **changes: Any) -> Plan:
        """A new plan with these :class:`AttentionConfig` fields changed (e.g. ``strategy="ring"``)."""
        return dataclasses.replace(self, attention=dataclasses.replace(self.attention, **changes))

    def with_name(self, name: str) -> Plan:
        return dataclasses.replace(self, name=name)

    # ------------------------------------------------------------------ resolution
    def param_spec(self, logical_axes: Sequence[str | None]):
        """PartitionSpec for a parameter whose dimensions have these logical axis names."""
        return _spec(self.param_rules, logical_axes, "params")

    def activation_spec(self, logical_axes: Sequence[str | None]):
        """PartitionSpec for an activation whose dimensions have these logical axis names."""
        return _spec(self.activation_rules, logical_axes, "activations")

    # ------------------------------------------------------------------ validation
    def validate(
        self,
        n_devices: int,
        *,
        dims: Mapping[str, int] | None = None,
        seq_len: int | None = None,
        global_batch: int | None = None,
    ) -> None:
        """Refuse a plan that cannot work, before anything compiles.

        Args:
          n_devices: number of devices the mesh will be built over.
          dims: sizes of logical axes of the model, e.g. ``{"heads": 32, "kv_heads": 8,
            "vocab": 128256, "mlp": 14336, "embed": 4096, "head_dim": 128, "layers": 32}``.
          seq_len: sequence length S in tokens.
          global_batch: sequences per step.

        Raises:
          PlanError: mesh size differs from the device count; a mesh axis used twice in one
            spec; a dimension not divisible by the product of its mesh axes; S not divisible by
            the context degree (x2 for zigzag); an A2A/USP Ulysses degree that the (kv) head
            counts cannot serve. Each message names the numbers and the fix.
        """
        shape = self.mesh_shape(n_devices)
        sizes = dict(dims or {})
        if seq_len is not None:
            sizes[ax.SEQ] = seq_len
        if global_batch is not None:
            sizes[ax.BATCH] = global_batch
        for kind, rules in (("params", self.param_rules), ("activations", self.activation_rules)):
            for logical, mesh_axes in rules.items():
                if len(set(mesh_axes)) != len(mesh_axes):
                    raise PlanError(f"plan.{kind}.{logical} uses a mesh axis twice: {mesh_axes}")
                if logical == ax.SEQ and kind == "activations":
                    continue  # checked with the layout below
                if logical in sizes:
                    n = math.prod(shape[m] for m in mesh_axes)
                    if sizes[logical] % n:
                        what = {"batch": "train.global_batch", "seq": "train.seq_len"}.get(logical, f"model {logical}")
                        near = sorted({max(n, sizes[logical] // n * n), (sizes[logical] // n + 1) * n})
                        raise PlanError(
                            f"{what}={sizes[logical]} is not divisible by {n}, the size of mesh axes {mesh_axes} "
                            f"that plan.{kind}.{logical} maps it to; use {what}="
                            + " or ".join(str(x) for x in near)
                            + f", or change that rule or the mesh sizes {shape}"
                        )
        # a mesh axis can appear only once across the dims of any one array; the arrays we shard
        # pair these logical axes, so check each pair of rules used together.
        for kind, rules, groups in (
            ("params", self.param_rules, _PARAM_GROUPS),
            ("activations", self.activation_rules, _ACTIVATION_GROUPS),
        ):
            for group in groups:
                used: dict[str, str] = {}
                for logical in group:
                    for m in rules.get(logical, ()):
                        if m in used:
                            raise PlanError(
                                f"mesh axis {m!r} is used twice in one {kind[:-1]} spec {group}: by "
                                f"{used[m]!r} and {logical!r}; map one of them to another mesh axis"
                            )
                        used[m] = logical
        P = self.context_degree(n_devices)
        if seq_len is not None:
            try:
                check_layout(self.attention.layout, seq_len, P)
            except ValueError as e:
                raise PlanError(str(e)) from None
        if dims is not None:
            # each strategy's own rules on the model's head counts (Ulysses: its degree and the heads)
            for name in self.attention.strategy_names:
                self._strategy_rule(name, lambda cls: cls.check_plan_dims(self, shape, sizes, n_devices))

    # ------------------------------------------------------------------ Hydra round trip
    def to_config(self) -> dict[str, Any]:
        """Plain dict in the schema of :class:`PlanConfig` (the Hydra ``plan`` node)."""
        return {
            "name": self.name,
            "mesh": dict(self.mesh),
            "params": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.params},
            "activations": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.activations},
            "attention": {**dataclasses.asdict(self.attention), "strategy": self.attention.strategy_config()},
        }

    def __repr__(self) -> str:
        def rules(r):
            return ", ".join(f"{k}->{_fmt_axes(v)}" for k, v in r) or "all replicated"

        a = self.attention
        mesh = " x ".join(f"{n}={s}" for n, s in self.mesh)
        return (
            f"Plan({self.name}: mesh[{mesh}]; params[{rules(self.params)}]; "
            f"activations[{rules(self.activations)}]; attention[{a.strategy}, kernel={a.kernel}, "
            f"layout={a.layout}])"
        )


# logical axes that appear together in one array (params, activations)
_PARAM_GROUPS = (
    (ax.LAYERS, ax.EMBED, ax.HEADS, ax.HEAD_DIM),
    (ax.LAYERS, ax.EMBED, ax.KV_HEADS, ax.HEAD_DIM),
    (ax.LAYERS, ax.EMBED, ax.MLP),
    (ax.VOCAB, ax.EMBED),
)
_ACTIVATION_GROUPS = (
    (ax.BATCH, ax.SEQ, ax.EMBED),
    (ax.BATCH, ax.SEQ, ax.HEADS, ax.HEAD_DIM),
    (ax.BATCH, ax.SEQ, ax.KV_HEADS, ax.HEAD_DIM),
    (ax.BATCH, ax.SEQ, ax.MLP),
    (ax.BATCH, ax.SEQ, ax.VOCAB),
)


def _items(x) -> list:
    if isinstance(x, Mapping):
        return list(x.items())
    return list(x)


def _spec(rules: Mapping[str, tuple[str, ...]], logical_axes: Sequence[str | None], kind: str):
    from jax.sharding import PartitionSpec

    out = []
    used: dict[str, str] = {}
    for logical in logical_axes:
        if logical is None:
            out.append(None)
            continue
        if logical not in ax.LOGICAL_AXES:
            raise PlanError(f"unknown logical axis {logical!r}; known logical axes are {ax.LOGICAL_AXES}")
        mesh_axes = rules.get(logical, ())
        for m in mesh_axes:
            if m in used:
                raise PlanError(
                    f"mesh axis {m!r} is used twice in one {kind} spec {tuple(logical_axes)}: by {used[m]!r} "
                    f"and {logical!r}; map one of them to another mesh axis"
                )
            used[m] = logical
        out.append(None if not mesh_axes else (mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes))
    return PartitionSpec(*out)


def _fmt_axes(v: MeshAxes) -> str:
    t = _as_axes(v)
    if not t:
        return "replicated"
    return t[0] if len(t) == 1 else "(" + ",".join(t) + ")"
