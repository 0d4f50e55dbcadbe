"""The Hugging Face model families lcx imports and exports, one registry line each.

A :class:`Family` is one transformers ``model_type``: its ``*ForCausalLM`` class, the
:class:`~lcx.models.config.ModelConfig` family options it fixes (biases, QK-norm, norms,
activation, embedding scale), the ``config.json`` keys it reads beyond the common ones, and the
keys it accepts at one value only. Every family runs on the one decoder of :mod:`lcx.models.llama`;
nothing else in lcx branches on a family's name.

========================  =========================  ==============================================
family (model_type)       architecture               what differs from Llama
========================  =========================  ==============================================
``llama``                 LlamaForCausalLM           (Llama 3.x; 3.2's tied embeddings)
``mistral``               MistralForCausalLM         every layer a sliding window
``qwen2``                 Qwen2ForCausalLM           q/k/v biases (Qwen2.5); windows per layer_types
``qwen3``                 Qwen3ForCausalLM           RMSNorm per head on q and k; windows per layer_types
``gemma3_text``           Gemma3ForCausalLM          5 sliding : 1 global, per-kind RoPE, QK-norm,
                                                     sandwich norms, ``(1 + w)`` gains, GeGLU (tanh),
                                                     ``sqrt(d)`` embeddings, query_pre_attn_scalar
========================  =========================  ==============================================

Gemma 3's multimodal checkpoints (``Gemma3ForConditionalGeneration``, ``model_type: gemma3``)
load their language model: the ``text_config`` as ``gemma3_text`` and the tensors under the
language model's prefix (:data:`MULTIMODAL`); the vision tower is not read.

Sources: transformers 5.25 ``models/{llama,mistral,qwen2,qwen3,gemma3}/configuration_*.py`` and
``modeling_*.py`` (the keys, their defaults and what the forward does with them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

OPTION_FIELDS: tuple[str, ...] = (
    "attention_bias",
    "qk_norm",
    "norm_gain_offset",
    "post_norms",
    "mlp_activation",
    "scale_embeddings",
)
"""The :class:`ModelConfig` family options a :class:`Family` fixes (``query_pre_attn_scalar`` is
read from ``config.json`` where the family has it)."""

LLAMA_OPTIONS: dict[str, Any] = dict(
    attention_bias=False,
    qk_norm=False,
    norm_gain_offset=0.0,
    post_norms=False,
    mlp_activation="silu",
    scale_embeddings=False,
)

COMMON_KEYS: frozenset[str] = frozenset(
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
        "max_position_embeddings",  # read by YaRN when the factor is implied; metadata otherwise
    }
)
"""Keys every family maps into the :class:`ModelConfig`."""

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
        "cache_implementation",  # Gemma's KV-cache class for generate ("hybrid")
    }
)
"""Keys that change nothing lcx computes (token ids, dtype of the stored weights, runtime and
generation defaults, provenance)."""

_SILU = {"hidden_act": "silu"}
_NO_DROPOUT = {"attention_dropout": 0.0}


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face model family (module docstring).

    Attributes:
      model_type: transformers' ``model_type``.
      architecture: its ``*ForCausalLM`` class name in ``architectures``.
      options: the :class:`ModelConfig` family options (:data:`OPTION_FIELDS`) it fixes.
      keys: ``config.json`` keys it maps beyond :data:`COMMON_KEYS`.
      no_op: keys lcx computes at one value only (key -> that value; null is accepted too), with
        the reason another value is refused.
      window_default: its ``sliding_window`` when the key is absent (Mistral: 4,096), else None.
      defaults: transformers' values of keys a config may omit (Gemma 3's checkpoints write only
        what differs from Gemma3TextConfig's defaults); a key absent here and from the config is
        refused as missing.
    """

    model_type: str
    architecture: str
    options: Mapping[str, Any]
    keys: frozenset[str] = frozenset()
    no_op: Mapping[str, tuple[Any, str]] = dataclasses.field(default_factory=dict)
    window_default: int | None = None
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def windowed(self) -> bool:
        """Whether its configs may carry sliding windows (``sliding_window`` is read)."""
        return "sliding_window" in self.keys


def _no_op(*tables: Mapping[str, Any], why: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for t in tables:
        out.update({k: (v, why[k]) for k, v in t.items()})
    return out


_WHY = {
    "hidden_act": "lcx's MLP runs the family's gate activation",
    "hidden_activation": "lcx's Gemma MLP is GeGLU with tanh GELU",
    "attention_bias": "this family has no attention biases",
    "mlp_bias": "lcx's MLP has no biases",
    "pretraining_tp": "tensor-parallel slicing of the projections changes their rounding",
    "attention_dropout": "lcx has no attention dropout",
    "partial_rotary_factor": "lcx rotates every feature pair",
    "final_logit_softcapping": "lcx's logits are not soft-capped (Gemma 2's; Gemma 3 has null)",
    "attn_logit_softcapping": "lcx's attention logits are not soft-capped (Gemma 2's; Gemma 3 has null)",
    "use_bidirectional_attention": "lcx's decoder is causal (true is EmbeddingGemma)",
}

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            "llama",
            "LlamaForCausalLM",
            LLAMA_OPTIONS,
            no_op=_no_op(
                _SILU,
                _NO_DROPOUT,
                {"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "partial_rotary_factor": 1.0},
                why=_WHY,
            ),
        ),
        Family(
            "mistral",
            "MistralForCausalLM",
            LLAMA_OPTIONS,
            keys=frozenset({"sliding_window"}),
            no_op=_no_op(_SILU, _NO_DROPOUT, why=_WHY),
            window_default=4096,
        ),
        Family(
            "qwen2",
            "Qwen2ForCausalLM",
            {**LLAMA_OPTIONS, "attention_bias": True},
            keys=frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}),
            no_op=_no_op(_SILU, _NO_DROPOUT, why=_WHY),
        ),
        Family(
            "qwen3",
            "Qwen3ForCausalLM",
            {**LLAMA_OPTIONS, "qk_norm": True},
            keys=frozenset({"sliding_window", "use_sliding_window", "max_window_layers", "layer_types"}),
            no_op=_no_op(_SILU, _NO_DROPOUT, {"attention_bias": False}, why=_WHY),
        ),
        Family(
            "gemma3_text",
            "Gemma3ForCausalLM",
            dict(
                attention_bias=False,
                qk_norm=True,
                norm_gain_offset=1.0,
                post_norms=True,
                mlp_activation="gelu_tanh",
                scale_embeddings=True,
            ),
            keys=frozenset(
                {
                    "sliding_window",
                    "layer_types",
                    "sliding_window_pattern",
                    "_sliding_window_pattern",
                    "rope_local_base_freq",
                    "query_pre_attn_scalar",
                }
            ),
            no_op=_no_op(
                _NO_DROPOUT,
                {
                    "hidden_activation": "gelu_pytorch_tanh",
                    "hidden_act": "gelu_pytorch_tanh",
                    "attention_bias": False,
                    "final_logit_softcapping": None,
                    "attn_logit_softcapping": None,
                    "use_bidirectional_attention": False,
                },
                why=_WHY,
            ),
            window_default=4096,
            defaults=dict(  # transformers 5.25 Gemma3TextConfig()
                vocab_size=262208,
                hidden_size=2304,
                intermediate_size=9216,
                num_hidden_layers=26,
                num_attention_heads=8,
                num_key_value_heads=4,
                head_dim=256,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                query_pre_attn_scalar=256,
                rope_theta=1_000_000.0,
                rope_local_base_freq=10_000.0,
                sliding_window_pattern=6,
                max_position_embeddings=131072,
            ),
        ),
    )
}
"""Every family lcx imports and exports, by ``model_type`` (one line each)."""

ARCHITECTURES: dict[str, str] = {f.architecture: f.model_type for f in FAMILIES.values()}
"""Supported ``architectures`` entry -> its ``model_type``."""


@dataclasses.dataclass(frozen=True)
class Multimodal:
    """A multimodal checkpoint whose language model lcx loads.

    Attributes:
      model_type: the wrapper's ``model_type``.
      text_model_type: the ``model_type`` of its ``text_config``.
      prefixes: where the language model's tensors live, tried in order: (prefix of the
        ``model.`` tensors, name of the output head); transformers 5 saves
        ``model.language_model.*``, the original Gemma 3 checkpoints ``language_model.model.*``.
      other: prefixes of the tensors that are not the language model (not read).
      keys: wrapper keys that describe the other modalities (not read).
    """

    model_type: str
    text_model_type: str
    prefixes: tuple[tuple[str, str], ...]
    other: tuple[str, ...]
    keys: frozenset[str]


MULTIMODAL: dict[str, Multimodal] = {
    "Gemma3ForConditionalGeneration": Multimodal(
        "gemma3",
        "gemma3_text",
        prefixes=(
            ("model.language_model.", "lm_head.weight"),
            ("language_model.model.", "language_model.lm_head.weight"),
        ),
        other=("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector."),
        keys=frozenset(
            {
                "vision_config",
                "mm_tokens_per_image",
                "boi_token_index",
                "eoi_token_index",
                "image_token_index",
                "image_token_id",
                "boi_token_id",
                "eoi_token_id",
                "tie_word_embeddings",  # repeated from text_config, which is what is read
            }
        ),
    ),
}
"""Multimodal checkpoints lcx imports the language model of, by architecture."""


def family_for_options(options: Mapping[str, Any], *, windowed: bool, uniform: bool) -> Family | None:
    """The family an lcx model exports as: the one fixing exactly ``options`` (the model's
    :data:`OPTION_FIELDS`) that can express its layers (``windowed``: some layer has a window;
    ``uniform``: every layer is one kind). Llama and Mistral share their options: a uniform model
    with a window is Mistral, one without is Llama. None: no family fits."""
    fits = [f for f in FAMILIES.values() if dict(f.options) == dict(options)]
    for f in fits:
        if f.model_type == "llama" and windowed:
            continue
        if f.model_type == "mistral" and (not windowed or not uniform):
            continue
        return f
    return None


__all__ = [
    "ARCHITECTURES",
    "COMMON_KEYS",
    "FAMILIES",
    "LLAMA_OPTIONS",
    "METADATA",
    "MULTIMODAL",
    "OPTION_FIELDS",
    "Family",
    "Multimodal",
    "family_for_options",
]
