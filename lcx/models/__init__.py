"""Equinox Llama family: configs and presets, modules, parameter shardings."""

from lcx.models.config import (
    DTYPES as DTYPES,
)
from lcx.models.config import (
    PRESETS as PRESETS,
)
from lcx.models.config import (
    REMAT_POLICIES as REMAT_POLICIES,
)
from lcx.models.config import (
    ModelConfig as ModelConfig,
)
from lcx.models.config import (
    preset as preset,
)
from lcx.models.llama import (
    MLP as MLP,
)
from lcx.models.llama import (
    Attention as Attention,
)
from lcx.models.llama import (
    Block as Block,
)
from lcx.models.llama import (
    Embedding as Embedding,
)
from lcx.models.llama import (
    Llama as Llama,
)
from lcx.models.llama import (
    RMSNorm as RMSNorm,
)
from lcx.models.llama import (
    init_model as init_model,
)
from lcx.models.llama import (
    remat_policy as remat_policy,
)
from lcx.models.llama import (
    rope as rope,
)
from lcx.models.llama import (
    rope_frequencies as rope_frequencies,
)
from lcx.models.rotary import (
    ROPE_SCALING_TYPES as ROPE_SCALING_TYPES,
)
from lcx.models.rotary import (
    RopeConfig as RopeConfig,
)
from lcx.models.rotary import (
    rope_angles as rope_angles,
)
from lcx.models.sharding import (
    init_sharded as init_sharded,
)
from lcx.models.sharding import (
    logical_axes as logical_axes,
)
from lcx.models.sharding import (
    model_shardings as model_shardings,
)
from lcx.models.sharding import (
    shard_model as shard_model,
)
