"""Per-device memory of a training step (a facade over the modules that compute it).

The ledger's memory is split by concern: :mod:`lcx.cost.policy` (what the backward finds saved,
and where: :class:`ActivationPolicy`), :mod:`lcx.cost.activations` (per-token bytes of one
block's activations and the loss phase), :mod:`lcx.cost.attention_memory` (one attention layer's
strategy and kernel buffers, priced by the registered classes) and :mod:`lcx.cost.breakdown`
(the totals: :class:`MemoryBreakdown`, :func:`memory_breakdown`). This module re-exports their
names, so ``from lcx.cost.memory import ...`` keeps working.
"""

from __future__ import annotations

from lcx.cost.activations import (
    XLA_CPU_FUSED_LOSS_ROWS as XLA_CPU_FUSED_LOSS_ROWS,
)
from lcx.cost.activations import (
    activation_arrays as activation_arrays,
)
from lcx.cost.activations import (
    attention_residual_bytes_per_token as attention_residual_bytes_per_token,
)
from lcx.cost.activations import (
    kv_cache_bytes_per_device as kv_cache_bytes_per_device,
)
from lcx.cost.activations import (
    kv_cache_bytes_per_token as kv_cache_bytes_per_token,
)
from lcx.cost.activations import (
    layer_working_bytes_per_token as layer_working_bytes_per_token,
)
from lcx.cost.activations import (
    logits_phase_bytes as logits_phase_bytes,
)
from lcx.cost.activations import (
    param_arrays as param_arrays,
)
from lcx.cost.activations import (
    saved_bytes_per_token_per_layer as saved_bytes_per_token_per_layer,
)
from lcx.cost.attention_memory import (
    attention_forward_bytes as attention_forward_bytes,
)
from lcx.cost.attention_memory import (
    attention_kernel_residual_bytes as attention_kernel_residual_bytes,
)
from lcx.cost.attention_memory import (
    attention_prologue_bytes as attention_prologue_bytes,
)
from lcx.cost.attention_memory import (
    attention_working_bytes as attention_working_bytes,
)
from lcx.cost.attention_memory import (
    kernel_backward_bytes as kernel_backward_bytes,
)
from lcx.cost.attention_memory import (
    kernel_backward_prologue_bytes as kernel_backward_prologue_bytes,
)
from lcx.cost.attention_memory import (
    kernel_forward_bytes as kernel_forward_bytes,
)
from lcx.cost.breakdown import (
    MemoryBreakdown as MemoryBreakdown,
)
from lcx.cost.breakdown import (
    memory_breakdown as memory_breakdown,
)
from lcx.cost.breakdown import (
    param_bytes_per_device as param_bytes_per_device,
)
from lcx.cost.dtypes import DTYPE_BYTES as DTYPE_BYTES
from lcx.cost.policy import (
    PLACEMENTS as PLACEMENTS,
)
from lcx.cost.policy import (
    REMAT_POLICIES as REMAT_POLICIES,
)
from lcx.cost.policy import (
    ActivationPolicy as ActivationPolicy,
)
