"""``config.json`` <-> :class:`ModelConfig` for Hugging Face Llama and Mistral, both directions.

Every key of ``config.json`` is one of three things (:func:`hf_config` checks them all; nothing
is silently ignored):

- **mapped** (:data:`MAPPED`): hidden_size -> d_model, num_hidden_layers -> n_layers,
  num_attention_heads -> n_heads, num_key_value_heads -> n_kv_heads, head_dim (default
  hidden_size / heads), intermediate_size -> mlp_dim, rms_norm_eps -> norm_eps,
  tie_word_embeddings -> tie_embeddings, vocab_size, RoPE (transformers 4.x ``rope_theta`` +
  ``rope_scaling`` or 5.x ``rope_parameters``; types ``default``/``llama3``/``yarn``) and, for
  Mistral only, ``sliding_window`` -> a uniform sliding model;
- **checked to be a no-op** (:data:`NO_OP`): a value lcx's model equals by construction
  (``hidden_act: silu``, ``attention_bias: false``, ``mlp_bias: false``, ``pretraining_tp: 1``,
  ``attention_dropout: 0.0``, ``partial_rotary_factor: 1``) — another value is refused;
- **metadata** (:data:`METADATA`): keys that do not change the forward pass (token ids,
  dtype, ``use_cache``, ``max_position_embeddings`` outside YaRN, ``initializer_range``,
  generation defaults, ``transformers_version``, ...);

and any other key is refused, naming it and its value.

Sliding window (Mistral). transformers' ``sliding_window_overlay`` (masking_utils.py, 4.53+ and
5.x) keeps key ``kv_idx`` for query ``q_idx`` iff ``kv_idx > q_idx - sliding_window``, i.e.
``q_idx - kv_idx < sliding_window`` (and causal): exactly lcx's ``Mask(window=W)`` (visible iff
``q_pos - k_pos < W``), so ``sliding_window: W`` maps to ``ModelConfig.sliding_window = W``
unchanged (tests/test_hf_mistral.py checks the logits of a 40-token sequence with window 16).
A Mistral config without the key has transformers' default window, 4,096; ``sliding_window:
null`` is global attention. A ``model_type: llama`` config carrying a ``sliding_window`` is refused: LlamaForCausalLM
ignores it in transformers, so lcx cannot tell which model the author meant.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from lcx.models.config import ModelConfig
from lcx.models.rotary import yarn_mscale

ARCHITECTURES: dict[str, str] = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral"}
"""Supported ``architectures`` entry -> its ``model_type``."""

MISTRAL_DEFAULT_WINDOW = 4096
"""``sliding_window`` of a Mistral ``config.json`` without the key (transformers' default)."""

MAPPED: frozenset[str] = frozenset(
    {
        "architectures",
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "rms_norm_eps",
        "tie_word_embeddings",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "sliding_window",
        "max_position_embeddings",  # read by YaRN when the factor is implied; metadata otherwise
    }
)
"""Keys :func:`hf_config` reads into the :class:`ModelConfig`."""

NO_OP: dict[str, Any] = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "attention_dropout": 0.0,
    "partial_rotary_factor": 1.0,
}
"""Keys whose only accepted value (or null) is the one lcx's Llama computes; others are refused."""

_WHY = {
    "hidden_act": "lcx's MLP is SwiGLU (silu)",
    "attention_bias": "lcx's Llama has no biases",
    "mlp_bias": "lcx's Llama has no biases",
    "pretraining_tp": "tensor-parallel slicing of the projections changes their rounding",
    "attention_dropout": "lcx has no attention dropout",
    "partial_rotary_factor": "lcx rotates every feature pair",
}

METADATA: frozenset[str] = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "initializer_range",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "use_return_dict",
        "id2label",
        "label2id",
        "tokenizer_class",
        "max_length",
        "min_length",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "num_beams",
        "repetition_penalty",
        "auto_map",
        "_attn_implementation_autoset",
        "torchscript",
    }
)
"""Keys that change nothing lcx computes (token ids, dtype of the stored weights, runtime and
generation defaults, provenance)."""


class HFImportError(ValueError):
    """A Hugging Face checkpoint that lcx cannot import as it stands (the message says why)."""


class HFExportError(ValueError):
    """An lcx model that Hugging Face Llama/Mistral cannot represent (the message says why)."""


def _rope_params(hf: Mapping[str, Any]) -> dict[str, Any]:
    """transformers 5 ``rope_parameters`` or 4.x ``rope_theta`` + ``rope_scaling``, as one dict."""
    rp = dict(hf.get("rope_parameters") or {})
    if rp and any(isinstance(v, Mapping) for v in rp.values()):
        raise HFImportError("per-layer-type rope_parameters are not supported (one RoPE for all layers)")
    out = rp if rp else dict(hf.get("rope_scaling") or {})
    out.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    out["rope_type"] = out.get("rope_type", out.get("type")) or "default"
    return out


def _rope_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig RoPE fields of ``config.json``. Raises HFImportError for what lcx lacks."""
    rp = _rope_params(hf)
    if float(rp.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise HFImportError("partial_rotary_factor != 1 is not supported (lcx rotates every feature pair)")
    kind = rp["rope_type"]
    rope: dict[str, Any] = {"rope_theta": float(rp["rope_theta"])}
    if kind == "llama3":
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
        raise HFImportError(f"RoPE type {kind!r} is not supported; lcx has default, llama3 and yarn")
    return rope


def _check_keys(hf: Mapping[str, Any], model_type: str) -> None:
    """Refuse every key that is neither mapped, a no-op at its value, nor metadata."""
    for key, value in hf.items():
        if key in NO_OP:
            if value is not None and value != NO_OP[key]:
                raise HFImportError(
                    f"config.json has {key}={value!r}; lcx's {model_type} supports only {key}={NO_OP[key]!r} "
                    f"({_WHY[key]})"
                )
        elif key == "sliding_window" and model_type != "mistral" and value is not None:
            raise HFImportError(
                f"config.json has model_type={model_type!r} with sliding_window={value!r}: transformers' "
                f"{model_type} ignores the window, so the checkpoint is ambiguous; remove the key (global "
                "attention) or declare model_type 'mistral' / architectures ['MistralForCausalLM'] (windowed)"
            )
        elif key not in MAPPED and key not in METADATA:
            raise HFImportError(
                f"config.json key {key}={value!r} is not supported for {model_type} (lcx neither maps it nor "
                "knows it to be a no-op); remove it if it changes nothing, or use a model lcx implements"
            )


def _model_type(hf: Mapping[str, Any]) -> str:
    archs = list(hf.get("architectures") or [])
    supported = ", ".join(ARCHITECTURES)
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown or len(archs) > 1:
        raise HFImportError(f"config.json has architectures={archs!r}; lcx imports one of {supported}")
    mt = hf.get("model_type", ARCHITECTURES[archs[0]] if archs else "llama")
    if mt not in ARCHITECTURES.values() or (archs and ARCHITECTURES[archs[0]] != mt):
        raise HFImportError(
            f"config.json has model_type={mt!r} (architectures {archs!r}); lcx imports model_type "
            f"'llama' (LlamaForCausalLM) and 'mistral' (MistralForCausalLM) ({supported})"
        )
    return mt


def hf_config(path_or_config: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face Llama or Mistral ``config.json`` (a path to it,
    to its directory, or the parsed dict).

    Args:
      path_or_config: checkpoint directory, ``config.json`` path, or its contents.
      **overrides: ModelConfig fields to set on top (e.g. ``dtype="bfloat16"``, ``remat="full"``,
        ``document_mask=False``). ``param_dtype`` defaults to float32.

    Raises:
      HFImportError: an unknown architecture or model_type (the message lists the supported
        ones); a key lcx neither maps nor knows to be a no-op, or a no-op key at another value
        (biases, another activation, another RoPE type, partial rotary, yarn ``truncate:
        false``, a ``sliding_window`` on a llama config); or overrides asking for
        ``attention_sinks`` (these checkpoints have none). The message names key and value.
    """
    if isinstance(path_or_config, Mapping):
        hf, name = dict(path_or_config), "hf"
    else:
        p = pathlib.Path(path_or_config)
        p = p / "config.json" if p.is_dir() else p
        hf, name = json.loads(p.read_text()), f"hf:{p.parent.name}"
    mt = _model_type(hf)
    _check_keys(hf, mt)
    rope = _rope_fields(hf)
    D, N = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    # transformers' MistralConfig defaults sliding_window to 4096 (every version): an absent key is that
    window = hf.get("sliding_window", MISTRAL_DEFAULT_WINDOW) if mt == "mistral" else None
    fields: dict[str, Any] = dict(
        name=name,
        vocab_size=int(hf["vocab_size"]),
        d_model=D,
        n_layers=int(hf["num_hidden_layers"]),
        n_heads=N,
        n_kv_heads=int(hf.get("num_key_value_heads") or N),
        head_dim=int(hf.get("head_dim") or D // N),
        mlp_dim=int(hf["intermediate_size"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        sliding_window=None if window is None else int(window),
        **rope,
    )
    fields.update(overrides)
    if fields.get("attention_sinks"):
        # zero sinks would change a pretrained model's outputs (every head gains a logit-0 key)
        raise HFImportError(
            "attention_sinks=true: Hugging Face Llama checkpoints have no attention sinks; load without it "
            "(attention_sinks=false)"
        )
    return ModelConfig(**fields)


# ------------------------------------------------------------------------------------------ export
def _export_rope(cfg: ModelConfig) -> dict[str, Any] | None:
    """transformers 4.x ``rope_scaling`` (read by 5.x too) of ``cfg``, or None for plain RoPE."""
    r = cfg.rope
    if r.scaling_type is None and r.factor is None:
        return None
    stype = r.scaling_type or "llama3"
    if stype == "llama3":
        return {
            "rope_type": "llama3",
            "factor": float(r.factor),  # type: ignore[arg-type]
            "original_max_position_embeddings": int(r.original_max_len),
            "low_freq_factor": float(r.low_freq_factor),
            "high_freq_factor": float(r.high_freq_factor),
        }
    out = {
        "rope_type": "yarn",
        "factor": float(r.factor),  # type: ignore[arg-type]
        "original_max_position_embeddings": int(r.original_max_len),
        "beta_fast": float(r.beta_fast),
        "beta_slow": float(r.beta_slow),
    }
    if r.attention_factor is not None:
        out["attention_factor"] = float(r.attention_factor)
    return out


def to_hf_config(
    cfg: ModelConfig,
    *,
    torch_dtype: str,
    max_position_embeddings: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of ``cfg`` as transformers' LlamaForCausalLM (global attention) or
    MistralForCausalLM (every layer sliding with one window): the inverse of :func:`hf_config`.

    Args:
      cfg: the model's configuration.
      torch_dtype: the dtype the weights are stored in (``float32`` / ``bfloat16``).
      max_position_embeddings: written as given; None: ``rope_original_max_len x factor`` for
        scaled RoPE (what transformers derives YaRN's factor from), else ``rope_original_max_len``.
      bos_token_id: the tokenizer's BOS id; None is written as null (not omitted, which would
        give transformers' Llama default 1, wrong for most vocabularies).
      eos_token_id: the tokenizer's EOS id; None is written as null (omitted: the default 2).

    Raises:
      HFExportError: a layer pattern or kind HF Llama/Mistral cannot express (mixed kinds,
        chunked attention, NoPE layers, per-kind RoPE, attention sinks), naming it.
    """
    kinds = cfg.period_kinds
    desc = [k.to_dict() for k in kinds]
    if len(set(kinds)) != 1:
        raise HFExportError(
            f"layer pattern {desc} mixes kinds; Hugging Face Llama/Mistral configs have one kind for all layers"
        )
    k = kinds[0]
    if k.kind == "chunked" or not k.rope or k.sinks or k.rope_config(cfg.rope) != cfg.rope:
        raise HFExportError(
            f"layer kind {k.to_dict()} (pattern {desc}) cannot be written as LlamaForCausalLM or "
            "MistralForCausalLM: they have global or sliding attention with the model's RoPE and no sinks"
        )
    mt = "mistral" if k.kind == "sliding" else "llama"
    rope = _export_rope(cfg)
    if max_position_embeddings is None:
        max_position_embeddings = int(round(cfg.rope_original_max_len * (cfg.rope.factor or 1.0)))
    out: dict[str, Any] = {
        "architectures": ["MistralForCausalLM" if mt == "mistral" else "LlamaForCausalLM"],
        "model_type": mt,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "torch_dtype": torch_dtype,
        "use_cache": True,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
    }
    if mt == "llama":
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        out["sliding_window"] = k.window
    return out


__all__ = [
    "ARCHITECTURES",
    "HFExportError",
    "HFImportError",
    "METADATA",
    "MAPPED",
    "NO_OP",
    "hf_config",
    "to_hf_config",
]
