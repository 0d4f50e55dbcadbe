"""Equinox decoder for the Llama, Mistral, Qwen2.5, Qwen3 and Gemma 3 families: configs and presets,
layer kinds, family options, modules, parameter metadata (logical axes and weight-decay roles),
parameter shardings, Hugging Face import (:func:`from_pretrained`) and export (:func:`save_pretrained`)."""

from lcx.models.config import DTYPES, REMAT_POLICIES, ModelConfig
from lcx.models.hf import from_pretrained
from lcx.models.hf_config import hf_config
from lcx.models.hf_export import save_pretrained, to_hf_config
from lcx.models.kinds import KINDS, LayerKind
from lcx.models.llama import (
    MLP,
    Attention,
    Block,
    Embedding,
    HeadRMSNorm,
    Llama,
    RMSNorm,
    init_model,
    remat_policy,
    rope,
    rope_frequencies,
)
from lcx.models.params import ROLES, decay_mask, logical_axes, param, parameter_roles, parameters
from lcx.models.presets import PRESETS, preset
from lcx.models.rotary import ROPE_SCALING_TYPES, RopeConfig, rope_angles
from lcx.models.sharding import init_sharded, model_shardings, shard_model

__all__ = [
    "Attention",
    "Block",
    "decay_mask",
    "DTYPES",
    "Embedding",
    "from_pretrained",
    "hf_config",
    "HeadRMSNorm",
    "init_model",
    "init_sharded",
    "KINDS",
    "LayerKind",
    "Llama",
    "logical_axes",
    "MLP",
    "param",
    "parameter_roles",
    "parameters",
    "model_shardings",
    "ModelConfig",
    "preset",
    "PRESETS",
    "REMAT_POLICIES",
    "remat_policy",
    "RMSNorm",
    "ROLES",
    "rope",
    "rope_angles",
    "rope_frequencies",
    "ROPE_SCALING_TYPES",
    "RopeConfig",
    "save_pretrained",
    "shard_model",
    "to_hf_config",
]
