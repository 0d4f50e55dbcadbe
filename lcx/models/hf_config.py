"""``config.json`` -> :class:`ModelConfig` for the Hugging Face families of :mod:`lcx.models.hf_families`.

Every key of ``config.json`` is one of three things (:func:`hf_config` checks them all; nothing
is silently ignored):

- **mapped**: the common keys (:data:`~lcx.models.hf_families.COMMON_KEYS`: hidden_size ->
  d_model, num_hidden_layers -> n_layers, num_attention_heads -> n_heads, num_key_value_heads ->
  n_kv_heads, head_dim (default hidden_size / heads), intermediate_size -> mlp_dim, rms_norm_eps
  -> norm_eps, tie_word_embeddings, vocab_size, RoPE) and the family's own (``Family.keys``:
  windows and layer types, Gemma's local RoPE base and ``query_pre_attn_scalar``);
- **checked to be a no-op** (``Family.no_op``): a value lcx's model equals by construction
  (``hidden_act: silu``, ``attention_dropout: 0.0``, Gemma's null soft-caps, ...) — another
  value is refused;
- **metadata** (:data:`~lcx.models.hf_families.METADATA`): keys that do not change the forward
  pass (token ids, dtype, ``use_cache``, generation defaults, provenance);

and any other key is refused, naming it and its value.

RoPE: transformers 4.x ``rope_theta`` + ``rope_scaling`` (Gemma 3 adds ``rope_local_base_freq``
for its sliding layers, the scaling applying to the global ones) or 5.x ``rope_parameters``
(one dict, or one per layer type); types ``default``, ``linear``, ``llama3`` and ``yarn``.

Layers. Each layer is ``full_attention`` or ``sliding_attention``: transformers 5's
``layer_types`` where given, else what the family derives (Mistral: every layer sliding; Qwen:
sliding from layer ``max_window_layers`` on when ``use_sliding_window``; Gemma 3: every
``sliding_window_pattern``-th layer global). One kind for all layers is a uniform model
(``sliding_window`` set or not); mixed types become a ``layer_pattern``: the shortest period
that, repeated with the remainder taking its first kinds, gives every layer's type (refused when
none does). The model-level RoPE is the sliding layers' (else the global ones'); a kind whose
RoPE differs overrides base, type and factor (:class:`~lcx.models.kinds.LayerKind`).

Sliding window. transformers' ``sliding_window_overlay`` (masking_utils.py, 4.53+ and 5.x) keeps
key ``kv_idx`` for query ``q_idx`` iff ``q_idx - kv_idx < sliding_window`` (and causal): exactly
lcx's ``Mask(window=W)``, so the window maps unchanged (tests/test_hf_mistral.py and
tests/test_hf_families.py check logits longer than the window). A Mistral config without the key
has transformers' default window, 4,096; ``sliding_window: null`` is global attention. A
``model_type: llama`` config carrying a ``sliding_window`` is refused: LlamaForCausalLM ignores
it in transformers, so lcx cannot tell which model the author meant.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from lcx.models.config import ModelConfig
from lcx.models.hf_families import (
    ARCHITECTURES,
    COMMON_KEYS,
    FAMILIES,
    METADATA,
    MULTIMODAL,
    Family,
    Multimodal,
)
from lcx.models.kinds import LayerKind
from lcx.models.rotary import yarn_mscale

LAYER_TYPES: tuple[str, ...] = ("full_attention", "sliding_attention")
"""transformers' ``layer_types`` values lcx implements (global and sliding-window layers)."""


class HFImportError(ValueError):
    """A Hugging Face checkpoint that lcx cannot import as it stands (the message says why)."""


class HFExportError(ValueError):
    """An lcx model that no Hugging Face family lcx writes can represent (the message says why)."""


# ------------------------------------------------------------------------------------------ family
def read_config(path_or_config: str | os.PathLike | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``(config.json contents, model name)`` of a checkpoint directory, config path or dict."""
    if isinstance(path_or_config, Mapping):
        return dict(path_or_config), "hf"
    p = pathlib.Path(path_or_config)
    p = p / "config.json" if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"no config.json at {p}: give a Hugging Face checkpoint directory")
    return json.loads(p.read_text()), f"hf:{p.parent.name}"


def text_model(hf: Mapping[str, Any]) -> tuple[dict[str, Any], Family, Multimodal | None]:
    """The language model's config, its :class:`Family` and, for a multimodal checkpoint, its
    :class:`Multimodal` entry.

    Raises:
      HFImportError: an unknown or ambiguous architecture or model_type (the message lists the
        supported ones), or a multimodal wrapper key lcx does not know.
    """
    archs = list(hf.get("architectures") or [])
    supported = ", ".join([*ARCHITECTURES, *MULTIMODAL])
    if len(archs) == 1 and archs[0] in MULTIMODAL:
        mm = MULTIMODAL[archs[0]]
        if hf.get("model_type", mm.model_type) != mm.model_type or not isinstance(hf.get("text_config"), Mapping):
            raise HFImportError(
                f"config.json has architectures {archs!r} but model_type={hf.get('model_type')!r} / no text_config; "
                f"{archs[0]} checkpoints have model_type {mm.model_type!r} and a text_config"
            )
        for key, value in hf.items():
            if key not in {"architectures", "model_type", "text_config"} | mm.keys | METADATA:
                raise HFImportError(f"config.json key {key}={value!r} is not supported for {archs[0]}")
        text = dict(hf["text_config"])
        text.setdefault("model_type", mm.text_model_type)
        text["architectures"] = [FAMILIES[mm.text_model_type].architecture]
        _, fam, _ = text_model(text)
        return text, fam, mm
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown or len(archs) > 1:
        raise HFImportError(f"config.json has architectures={archs!r}; lcx imports one of {supported}")
    mt = hf.get("model_type", ARCHITECTURES[archs[0]] if archs else "llama")
    if mt not in FAMILIES or (archs and ARCHITECTURES[archs[0]] != mt):
        known = ", ".join(f"{f.model_type!r} ({f.architecture})" for f in FAMILIES.values())
        raise HFImportError(f"config.json has model_type={mt!r} (architectures {archs!r}); lcx imports {known}")
    return dict(hf), FAMILIES[mt], None


def _check_keys(hf: Mapping[str, Any], fam: Family) -> None:
    """Refuse every key that is neither mapped, a no-op at its value, nor metadata."""
    mt = fam.model_type
    for key, value in hf.items():
        if key in fam.no_op:
            want, why = fam.no_op[key]
            if value is not None and value != want:
                raise HFImportError(f"config.json has {key}={value!r}; lcx's {mt} supports only {key}={want!r} ({why})")
        elif key == "sliding_window" and not fam.windowed and value is not None:
            raise HFImportError(
                f"config.json has model_type={mt!r} with sliding_window={value!r}: transformers' {mt} ignores "
                "the window, so the checkpoint is ambiguous; remove the key (global attention) or declare "
                "model_type 'mistral' / architectures ['MistralForCausalLM'] (windowed)"
            )
        elif key not in COMMON_KEYS and key not in fam.keys and key not in METADATA:
            raise HFImportError(
                f"config.json key {key}={value!r} is not supported for {mt} (lcx neither maps it nor knows it to "
                "be a no-op); remove it if it changes nothing, or use a model lcx implements"
            )


# ------------------------------------------------------------------------------------------ RoPE
def _rope_by_type(hf: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One RoPE parameter dict per layer type, with ``rope_theta`` and ``rope_type``."""
    rp = hf.get("rope_parameters") or {}
    if rp and all(isinstance(v, Mapping) for v in rp.values()):  # 5.x, per layer type (Gemma 3)
        unknown = sorted(set(rp) - set(LAYER_TYPES))
        if unknown:
            raise HFImportError(f"rope_parameters for layer types {unknown}: lcx has {LAYER_TYPES}")
        out = {t: dict(v) for t, v in rp.items()}
    elif rp and any(isinstance(v, Mapping) for v in rp.values()):
        raise HFImportError(f"rope_parameters={rp!r} mixes per-layer-type dicts and values")
    else:
        one = dict(rp) if rp else dict(hf.get("rope_scaling") or {})
        one.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
        out = {"full_attention": one, "sliding_attention": dict(one)}
        if "rope_local_base_freq" in hf:  # Gemma 3 4.x: the sliding layers' base, never scaled
            out["sliding_attention"] = {"rope_theta": hf["rope_local_base_freq"], "rope_type": "default"}
    for v in out.values():
        v["rope_type"] = v.get("rope_type", v.get("type")) or "default"
    return out


def _rope_fields(rp: Mapping[str, Any], hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig RoPE fields of one RoPE parameter dict. Raises HFImportError for what lcx lacks."""
    if float(rp.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise HFImportError("partial_rotary_factor != 1 is not supported (lcx rotates every feature pair)")
    kind = rp["rope_type"]
    rope: dict[str, Any] = {"rope_theta": float(rp["rope_theta"])}
    if kind == "linear":
        rope.update(rope_scaling_type="linear", rope_scaling_factor=float(rp["factor"]))
    elif kind == "llama3":
        rope.update(
            rope_scaling_type="llama3",
            rope_scaling_factor=float(rp["factor"]),
            rope_original_max_len=int(rp["original_max_position_embeddings"]),
            rope_low_freq_factor=float(rp.get("low_freq_factor", 1.0)),
            rope_high_freq_factor=float(rp.get("high_freq_factor", 4.0)),
        )
    elif kind == "yarn":
        orig = int(rp.get("original_max_position_embeddings") or hf["max_position_embeddings"])
        factor = rp.get("factor")
        factor = float(factor) if factor is not None else hf["max_position_embeddings"] / orig
        if rp.get("truncate", True) is False:
            raise HFImportError("yarn with truncate=false is not supported (lcx truncates the ramp like the paper)")
        att = rp.get("attention_factor")
        if att is None and rp.get("mscale") and rp.get("mscale_all_dim"):
            att = yarn_mscale(factor, rp["mscale"]) / yarn_mscale(factor, rp["mscale_all_dim"])
        rope.update(
            rope_scaling_type="yarn",
            rope_scaling_factor=factor,
            rope_original_max_len=orig,
            rope_beta_fast=float(rp.get("beta_fast") or 32.0),
            rope_beta_slow=float(rp.get("beta_slow") or 1.0),
            rope_attention_factor=None if att is None else float(att),
        )
    elif kind != "default":
        raise HFImportError(f"RoPE type {kind!r} is not supported; lcx has default, linear, llama3 and yarn")
    return rope


# ------------------------------------------------------------------------------------------ layers
def _layer_types(hf: Mapping[str, Any], fam: Family, n_layers: int, window: int | None) -> list[str]:
    """Each layer's type: ``layer_types`` if given, else the family's rule (module docstring)."""
    if hf.get("layer_types") is not None:
        lt = list(hf["layer_types"])
        if len(lt) != n_layers:
            raise HFImportError(f"layer_types has {len(lt)} entries for num_hidden_layers={n_layers}")
        bad = sorted({t for t in lt if t not in LAYER_TYPES})
        if bad:
            raise HFImportError(f"layer_types {bad} are not supported; lcx implements {LAYER_TYPES}")
        return lt
    if window is None:
        return ["full_attention"] * n_layers
    if fam.model_type == "gemma3_text":
        every = int(hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6)))
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layers)]
    if fam.model_type in ("qwen2", "qwen3"):
        first = int(hf.get("max_window_layers") or 0)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
    return ["sliding_attention"] * n_layers


def _period(types: list[str]) -> list[str]:
    """The shortest pattern that :func:`lcx.models.kinds.layer_kinds` repeats into ``types``."""
    for P in range(1, len(types) + 1):
        if all(t == types[i % P] for i, t in enumerate(types)):
            return types[:P]
    raise AssertionError("unreachable: the whole list is a period")  # pragma: no cover


def _layers(hf: Mapping[str, Any], fam: Family, n_layers: int) -> dict[str, Any]:
    """The ModelConfig fields of the layers: RoPE, and ``sliding_window`` or ``layer_pattern``."""
    if fam.windowed:
        window = hf.get("sliding_window", fam.window_default)
        if fam.model_type in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
            window = None  # transformers' Qwen: the window applies only with use_sliding_window
    else:
        window = None
    types = _layer_types(hf, fam, n_layers, window)
    if "sliding_attention" in types and window is None:
        raise HFImportError(
            f"layer_types has sliding_attention layers but no sliding_window (use_sliding_window="
            f"{hf.get('use_sliding_window')!r}, sliding_window={hf.get('sliding_window')!r}): transformers runs "
            "them as global layers; make them full_attention, or set the window"
        )
    ropes = {t: _rope_fields(rp, hf) for t, rp in _rope_by_type(hf).items() if t in types}
    period = _period(types)
    if len(set(period)) == 1:
        only = ropes[period[0]]
        return dict(only, sliding_window=None if period[0] == "full_attention" else int(window))  # type: ignore[arg-type]
    # the model-level RoPE: an unscaled type's (a kind can add scaling, not remove it), sliding first
    order = sorted(ropes, key=lambda t: (ropes[t].get("rope_scaling_type") is not None, t != "sliding_attention"))
    model_rope = dict(ropes[order[0]])
    for t in order[1:]:
        rest = {k: v for k, v in ropes[t].items() if k not in _KIND_ROPE}
        if model_rope.get("rope_scaling_type") and any(model_rope.get(k) != v for k, v in rest.items()):
            raise HFImportError(
                f"the RoPE of {t} layers {ropes[t]} and of {order[0]} layers {model_rope} differ beyond base, type "
                "and factor; lcx's layer kinds override only those"
            )
        model_rope.update(rest)  # a scaled kind's ramp parameters live at model level
    kinds = {}
    for t, rope in ropes.items():
        theta, stype, factor = (rope.get(k) if rope.get(k) != model_rope.get(k) else None for k in _KIND_ROPE)
        w = int(window) if t == "sliding_attention" else None  # type: ignore[arg-type]
        kinds[t] = LayerKind(
            "sliding" if w else "global",
            window=w,
            rope_theta=theta,
            rope_scaling_type=stype,
            rope_scaling_factor=factor,
        )
    return dict(model_rope, sliding_window=None, layer_pattern=tuple(kinds[t] for t in period))


_KIND_ROPE = ("rope_theta", "rope_scaling_type", "rope_scaling_factor")
"""The RoPE fields a :class:`~lcx.models.kinds.LayerKind` overrides."""


# ------------------------------------------------------------------------------------------ entry
def hf_config(path_or_config: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face ``config.json`` of a family lcx implements (a
    path to it, to its directory, or the parsed dict; a multimodal Gemma 3 config gives its
    language model's).

    Args:
      path_or_config: checkpoint directory, ``config.json`` path, or its contents.
      **overrides: ModelConfig fields to set on top (e.g. ``dtype="bfloat16"``, ``remat="full"``,
        ``document_mask=False``). ``param_dtype`` defaults to float32.

    Raises:
      HFImportError: an unknown architecture or model_type (the message lists the supported
        ones); a key lcx neither maps nor knows to be a no-op, or a no-op key at another value
        (another activation, soft-capping, another RoPE type, partial rotary, a
        ``sliding_window`` on a llama config, a layer type lcx lacks, layer types with no
        period); a missing required key; or overrides asking for ``attention_sinks`` (these
        checkpoints have none). The message names key and value.
      FileNotFoundError: no config.json at the path.
    """
    raw, name = read_config(path_or_config)
    hf, fam, _ = text_model(raw)
    _check_keys(hf, fam)
    hf = {**fam.defaults, **hf}
    missing = [
        k
        for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        if k not in hf
    ]
    if missing:
        raise HFImportError(
            f"config.json of {fam.model_type} lacks {missing} (transformers has no default lcx can use)"
        )
    D, N, L = int(hf["hidden_size"]), int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
    fields: dict[str, Any] = dict(
        name=name,
        vocab_size=int(hf["vocab_size"]),
        d_model=D,
        n_layers=L,
        n_heads=N,
        n_kv_heads=int(hf.get("num_key_value_heads") or N),
        head_dim=int(hf.get("head_dim") or D // N),
        mlp_dim=int(hf["intermediate_size"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        **fam.options,
        **_layers(hf, fam, L),
    )
    if "query_pre_attn_scalar" in fam.keys and hf.get("query_pre_attn_scalar") is not None:
        fields["query_pre_attn_scalar"] = float(hf["query_pre_attn_scalar"])
    fields.update(overrides)
    if fields.get("attention_sinks"):
        # zero sinks would change a pretrained model's outputs (every head gains a logit-0 key)
        raise HFImportError(
            f"attention_sinks=true: Hugging Face {fam.architecture} checkpoints have no attention sinks; load "
            "without it (attention_sinks=false)"
        )
    return ModelConfig(**fields)


__all__ = ["LAYER_TYPES", "HFExportError", "HFImportError", "hf_config", "read_config", "text_model"]
