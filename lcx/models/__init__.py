"""Equinox Llama family: configs and presets, modules, parameter shardings."""

from lcx.models.config import (
    DTYPES as DTYPES,
    PRESETS as PRESETS,
    REMAT_POLICIES as REMAT_POLICIES,
    ModelConfig as ModelConfig,
    preset as preset,
)
from lcx.models.llama import (
    MLP as MLP,
    Attention as Attention,
    Block as Block,
    Embedding as Embedding,
    Llama as Llama,
    RMSNorm as RMSNorm,
    init_model as init_model,
    remat_policy as remat_policy,
    rope as rope,
    rope_frequencies as rope_frequencies,
)
from lcx.models.rotary import (
    ROPE_SCALING_TYPES as ROPE_SCALING_TYPES,
    RopeConfig as RopeConfig,
    rope_angles as rope_angles,
)
from lcx.models.sharding import (
    init_sharded as init_sharded,
    logical_axes as logical_axes,
    model_shardings as model_shardings,
    shard_model as shard_model,
)
