"""Analytic cost ledger: FLOPs, memory, communication, hardware presets, plan search.

Pure arithmetic on plans and model configs: nothing here compiles or touches a device, except
the one-off CPU matmul probe of :func:`cpu_peak_flops`. It reads :mod:`lcx.sharding`, the model
configs, and the strategy and kernel registries of :mod:`lcx.attention`, whose classes price
themselves (class methods that are plain arithmetic, no JAX call).
"""

from lcx.cost.comm import CommBytes as CommBytes
from lcx.cost.comm import comm_bytes as comm_bytes
from lcx.cost.comm import ring_overlap_min_block as ring_overlap_min_block
from lcx.cost.flops import (
    RECOMPUTED_FORWARD_FRACTION as RECOMPUTED_FORWARD_FRACTION,
)
from lcx.cost.flops import (
    StepFlops as StepFlops,
)
from lcx.cost.flops import (
    attention_pairs as attention_pairs,
)
from lcx.cost.flops import (
    crossover_tokens as crossover_tokens,
)
from lcx.cost.flops import (
    forward_flops as forward_flops,
)
from lcx.cost.flops import (
    linear_weights_per_token as linear_weights_per_token,
)
from lcx.cost.flops import (
    prefill_flops_per_layer as prefill_flops_per_layer,
)
from lcx.cost.flops import (
    recompute_flops as recompute_flops,
)
from lcx.cost.flops import (
    training_flops as training_flops,
)
from lcx.cost.flops import (
    visible_pairs as visible_pairs,
)
from lcx.cost.hardware import (
    Hardware as Hardware,
)
from lcx.cost.hardware import (
    apply_hardware_flags as apply_hardware_flags,
)
from lcx.cost.hardware import (
    cpu_peak_flops as cpu_peak_flops,
)
from lcx.cost.hardware import (
    hardware_from_config as hardware_from_config,
)
from lcx.cost.hardware import (
    host_memory_available as host_memory_available,
)
from lcx.cost.ledger import (
    Estimate as Estimate,
)
from lcx.cost.ledger import (
    causal_half_block_work as causal_half_block_work,
)
from lcx.cost.ledger import (
    causal_imbalance as causal_imbalance,
)
from lcx.cost.ledger import (
    estimate as estimate,
)
from lcx.cost.ledger import (
    host_transfer_bytes as host_transfer_bytes,
)
from lcx.cost.ledger import (
    mfu as mfu,
)
from lcx.cost.ledger import (
    step_metrics as step_metrics,
)
from lcx.cost.local import LocalStep as LocalStep
from lcx.cost.local import StepArgs as StepArgs
from lcx.cost.local import StepSizes as StepSizes
from lcx.cost.memory import (
    ActivationPolicy as ActivationPolicy,
)
from lcx.cost.memory import (
    MemoryBreakdown as MemoryBreakdown,
)
from lcx.cost.memory import (
    activation_arrays as activation_arrays,
)
from lcx.cost.memory import (
    attention_working_bytes as attention_working_bytes,
)
from lcx.cost.memory import (
    kv_cache_bytes_per_token as kv_cache_bytes_per_token,
)
from lcx.cost.memory import (
    memory_breakdown as memory_breakdown,
)
from lcx.cost.memory import (
    param_arrays as param_arrays,
)
from lcx.cost.memory import (
    saved_bytes_per_token_per_layer as saved_bytes_per_token_per_layer,
)
from lcx.cost.planner import (
    Candidate as Candidate,
)
from lcx.cost.planner import (
    Recommendation as Recommendation,
)
from lcx.cost.planner import (
    candidate_plans as candidate_plans,
)
from lcx.cost.planner import (
    default_policies as default_policies,
)
from lcx.cost.planner import (
    missing_in_lcx as missing_in_lcx,
)
from lcx.cost.planner import (
    search as search,
)
from lcx.cost.planner import (
    table as table,
)
