"""Layer kinds: what kind of attention each decoder layer runs, with its own RoPE and sinks.

A :class:`LayerKind` is ``global`` (every earlier key of the document), ``sliding`` (the last
``window`` tokens) or ``chunked`` (the query's aligned chunk of ``chunk`` tokens, Llama 4's local
layers), each with RoPE on or off, its own RoPE base and scaling, and attention sinks on or off.
A model is either uniform (``ModelConfig.layer_pattern: null``: every layer one kind, built from
``sliding_window`` and ``attention_sinks`` as before kinds existed) or a repeating pattern:
Gemma 3 has five sliding layers (window 1,024, RoPE base 10K) per global layer (base 1M),
gpt-oss alternates 128-token windows with global layers, Llama 4 interleaves chunked RoPE layers
with global layers without RoPE (transformers' ``layer_types`` describes the same per layer).

YAML (``model.layer_pattern``): a list of mappings of :class:`LayerKind` fields, each of which may
carry ``repeat: n`` (n consecutive layers of that kind)::

    layer_pattern:
      - {kind: sliding, window: 1024, rope_theta: 10000.0, repeat: 5}
      - {kind: global, rope_theta: 1000000.0}

The pattern repeats over the depth; when ``n_layers`` is not a multiple of its length P, the
remainder layers take the pattern's first kinds (:func:`layer_kinds`, Gemma 3's rule: 26 layers of
``[sliding x5, global]`` make layers 6, 12, 18 and 24 (1-based) global, 25 and 26 sliding).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from lcx.attention.masks import Mask
from lcx.models.rotary import ROPE_SCALING_TYPES, RopeConfig

KINDS: tuple[str, ...] = ("global", "sliding", "chunked")
"""The layer kinds, named as :attr:`lcx.attention.Mask.kind` names them."""

_EXAMPLES = {
    "global": "{kind: global}",
    "sliding": "{kind: sliding, window: 1024}",
    "chunked": "{kind: chunked, chunk: 8192}",
}


@dataclasses.dataclass(frozen=True)
class LayerKind:
    """One kind of decoder layer: its attention mask, RoPE and sinks.

    Attributes:
      kind: ``global``, ``sliding`` or ``chunked`` (:data:`KINDS`).
      window: ``sliding`` only: the window in tokens, a key visible iff ``q_pos - k_pos < window``.
      chunk: ``chunked`` only: the chunk in tokens, a key visible iff
        ``q_pos // chunk == k_pos // chunk`` (aligned chunks; Llama 4).
      rope: False: no rotary embedding at all in this kind's layers (NoPE; Llama 4's global
        layers).
      rope_theta: this kind's RoPE base wavelength; None: the model's ``rope_theta``.
      rope_scaling_type: this kind's RoPE scaling (None, ``linear``, ``llama3``, ``yarn``); None: the
        model's. Set on the kinds that scale when the model itself uses plain RoPE.
      rope_scaling_factor: this kind's stretch factor (>= 1); None: the model's. A factor with
        neither this kind nor the model naming a type means ``llama3``, as for the model.
      sinks: True/False: attention sinks in this kind's layers or not; None: the model's
        ``attention_sinks``. Layers whose kind has sinks off ignore the (stacked) sink
        parameter; the model has one only if some kind has sinks.

    Raises:
      ValueError: an unknown kind; a sliding kind without a positive ``window`` or a chunked
        one without a positive ``chunk``; a window or chunk on a kind that has none (a global
        kind has neither); RoPE overrides with ``rope: false``; a non-positive ``rope_theta``, a
        ``rope_scaling_factor`` below 1, an unknown scaling type; ``rope`` or ``sinks`` not a
        boolean. The message names the field, the value and the fix.
    """

    kind: str = "global"
    window: int | None = None
    chunk: int | None = None
    rope: bool = True
    rope_theta: float | None = None
    rope_scaling_type: str | None = None
    rope_scaling_factor: float | None = None
    sinks: bool | None = None

    def __post_init__(self):
        k = self.kind
        if k not in KINDS:
            raise ValueError(f"layer kind {k!r} is unknown; write kind: one of {', '.join(KINDS)}")
        need = {"sliding": "window", "chunked": "chunk"}.get(k)
        for f in ("window", "chunk"):
            v = getattr(self, f)
            if f == need:
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise ValueError(
                        f"layer kind {k} needs {f}, a positive number of tokens, got {f}={v!r}; write {_EXAMPLES[k]}"
                    )
            elif v is not None:
                raise ValueError(
                    f"layer kind {k} has no {f}, got {f}={v!r}; "
                    + (
                        f"remove {f}, or use {_EXAMPLES['sliding' if f == 'window' else 'chunked']}"
                        if k == "global"
                        else f"a {k} kind takes {need} only ({_EXAMPLES[k]})"
                    )
                )
        _check_types(k, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        overrides = {f: getattr(self, f) for f in ("rope_theta", "rope_scaling_type", "rope_scaling_factor")}
        if not self.rope and any(v is not None for v in overrides.values()):
            set_ = {f: v for f, v in overrides.items() if v is not None}
            raise ValueError(
                f"layer kind {k} has rope: false (no rotary embedding) but sets {set_}; remove them, or set rope: true"
            )
        for f in ("rope_theta", "rope_scaling_factor"):
            if getattr(self, f) is not None:
                object.__setattr__(self, f, float(getattr(self, f)))  # YAML may give 10000 for a float
        if self.rope_theta is not None and self.rope_theta <= 0:
            raise ValueError(f"layer kind {k}: rope_theta={self.rope_theta} must be positive (e.g. 10000.0)")
        if self.rope_scaling_factor is not None and self.rope_scaling_factor < 1:
            raise ValueError(
                f"layer kind {k}: rope_scaling_factor={self.rope_scaling_factor} must be >= 1 (it stretches "
                "wavelengths), or null for the model's"
            )
        if self.rope_scaling_type not in ROPE_SCALING_TYPES:
            raise ValueError(
                f"layer kind {k}: rope_scaling_type={self.rope_scaling_type!r} is unknown; choose one of "
                f"{ROPE_SCALING_TYPES} (null: the model's)"
            )

    def mask(self, document: bool) -> Mask:
        """The causal attention mask of this kind's layers (``document``: packed documents never
        attend to each other, the model's ``document_mask``)."""
        return Mask(causal=True, document=document, window=self.window, chunk=self.chunk)

    def rope_config(self, model_rope: RopeConfig) -> RopeConfig | None:
        """This kind's RoPE table: the model's (``model_rope``) with this kind's overrides, or
        None for ``rope: false``.

        Raises:
          ValueError: the combination is not a valid :class:`RopeConfig` (e.g. a scaling type
            with no factor here or in the model).
        """
        if not self.rope:
            return None
        theta = model_rope.theta if self.rope_theta is None else self.rope_theta
        factor = model_rope.factor if self.rope_scaling_factor is None else self.rope_scaling_factor
        stype = model_rope.scaling_type if self.rope_scaling_type is None else self.rope_scaling_type
        if stype is None and factor is not None:
            stype = "llama3"  # as ModelConfig: a factor alone means Llama 3.1 scaling
        if (theta, factor, stype) == (model_rope.theta, model_rope.factor, model_rope.scaling_type):
            return model_rope
        return dataclasses.replace(model_rope, theta=theta, factor=factor, scaling_type=stype)

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping of this kind: ``kind`` and every field that is not its default."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "kind" and v != f.default:
                out[f.name] = v
        return out


_FIELDS = tuple(f.name for f in dataclasses.fields(LayerKind))

_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "kind": ((str,), "a string"),
    "window": ((int, type(None)), "a whole number of tokens"),
    "chunk": ((int, type(None)), "a whole number of tokens"),
    "rope": ((bool,), "true or false"),
    "rope_theta": ((int, float, type(None)), "a number or null"),
    "rope_scaling_type": ((str, type(None)), "a string or null"),
    "rope_scaling_factor": ((int, float, type(None)), "a number or null"),
    "sinks": ((bool, type(None)), "true, false or null"),
}


def _check_types(kind: Any, fields: Mapping[str, Any]) -> None:
    """ValueError naming the field and its value when one has the wrong type (a bool is no number)."""
    for f, v in fields.items():
        types, what = _TYPES[f]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ValueError(f"layer kind {kind}: {f} must be {what}, got {f}={v!r}")


def parse_layer_pattern(value: Any, *, where: str = "model.layer_pattern") -> tuple[LayerKind, ...] | None:
    """The pattern a YAML or Hydra value describes, one :class:`LayerKind` per layer of a period.

    Args:
      value: None (a uniform model), or a list of :class:`LayerKind` or of mappings of its fields,
        each of which may carry ``repeat: n`` (n consecutive layers of that kind).
      where: the config key, for messages.

    Returns:
      The expanded pattern (``repeat`` unrolled), or None.

    Raises:
      ValueError: not a list, an empty list, an item that is not a mapping, an unknown key (names
        the nearest valid one), ``repeat`` not a positive integer, or what :class:`LayerKind`
        refuses; each message names the item's index.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise ValueError(
            f"{where}={value!r}: must be a list of layer kinds, e.g. "
            "[{kind: sliding, window: 1024, repeat: 5}, {kind: global}], or null for a uniform model"
        )
    if not value:
        raise ValueError(f"{where}=[]: a pattern needs at least one layer kind; write null for a uniform model")
    out: list[LayerKind] = []
    for i, item in enumerate(value):
        if isinstance(item, LayerKind):
            out.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"{where}[{i}]={item!r}: must be a mapping such as {{kind: sliding, window: 1024}}")
        d = {str(k): v for k, v in item.items()}
        repeat = d.pop("repeat", 1)
        for key in d:
            if key not in _FIELDS:
                near = difflib.get_close_matches(key, _FIELDS + ("repeat",), n=1, cutoff=0.6)
                hint = f"did you mean {near[0]}? " if near else ""
                raise ValueError(
                    f"{where}[{i}].{key}: unknown key; {hint}a layer kind has {', '.join(_FIELDS)} and repeat"
                )
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ValueError(f"{where}[{i}].repeat={repeat!r}: must be a positive number of layers")
        try:
            _check_types(d.get("kind", "global"), d)  # before the constructor's own annotations
            kind = LayerKind(**d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}[{i}]: {e}") from None
        out.extend([kind] * repeat)
    return tuple(out)


def pattern_to_yaml(pattern: Sequence[LayerKind] | None) -> list[dict[str, Any]] | None:
    """The YAML form of an expanded pattern (inverse of :func:`parse_layer_pattern`): runs of
    equal consecutive kinds as one mapping with ``repeat: n``."""
    if pattern is None:
        return None
    out: list[dict[str, Any]] = []
    prev: LayerKind | None = None
    for kind in pattern:
        if kind == prev:
            out[-1]["repeat"] = out[-1].get("repeat", 1) + 1
        else:
            out.append(kind.to_dict())
        prev = kind
    return out


def layer_kinds(pattern: Sequence[LayerKind], n_layers: int) -> tuple[LayerKind, ...]:
    """One kind per layer: the pattern repeated, the remainder layers taking its first kinds.

    ``layer_kinds([sliding] * 5 + [global], 26)`` makes layers 6, 12, 18, 24 (1-based) global:
    four periods, then two remainder layers that take the pattern's first two (sliding) kinds,
    as Gemma 3 lays out its 26 layers.
    """
    P = len(pattern)
    return tuple(pattern[i % P] for i in range(n_layers))


__all__ = ["KINDS", "LayerKind", "layer_kinds", "parse_layer_pattern", "pattern_to_yaml"]
