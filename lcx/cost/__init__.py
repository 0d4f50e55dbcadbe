"""Analytic cost ledger: FLOPs, memory, communication, hardware presets, plan search.

Pure arithmetic on plans and model configs: nothing here compiles or touches a device, except
the one-off CPU matmul probe of :func:`cpu_peak_flops`. It reads :mod:`lcx.sharding`, the model
configs, and the strategy and kernel registries of :mod:`lcx.attention`, whose classes price
themselves (class methods that are plain arithmetic, no JAX call).
"""

from lcx.cost.comm import CommBytes as CommBytes, comm_bytes as comm_bytes, ring_overlap_min_block as ring_overlap_min_block
from lcx.cost.flops import (
    RECOMPUTED_FORWARD_FRACTION as RECOMPUTED_FORWARD_FRACTION,
    StepFlops as StepFlops,
    attention_pairs as attention_pairs,
    crossover_tokens as crossover_tokens,
    forward_flops as forward_flops,
    linear_weights_per_token as linear_weights_per_token,
    prefill_flops_per_layer as prefill_flops_per_layer,
    recompute_flops as recompute_flops,
    training_flops as training_flops,
    visible_pairs as visible_pairs,
)
from lcx.cost.hardware import (
    Hardware as Hardware,
    apply_hardware_flags as apply_hardware_flags,
    cpu_peak_flops as cpu_peak_flops,
    hardware_from_config as hardware_from_config,
    host_memory_available as host_memory_available,
)
from lcx.cost.ledger import (
    Estimate as Estimate,
    causal_half_block_work as causal_half_block_work,
    causal_imbalance as causal_imbalance,
    estimate as estimate,
    host_transfer_bytes as host_transfer_bytes,
    mfu as mfu,
    step_metrics as step_metrics,
)
from lcx.cost.memory import (
    ActivationPolicy as ActivationPolicy,
    MemoryBreakdown as MemoryBreakdown,
    activation_arrays as activation_arrays,
    attention_working_bytes as attention_working_bytes,
    kv_cache_bytes_per_token as kv_cache_bytes_per_token,
    memory_breakdown as memory_breakdown,
    param_arrays as param_arrays,
    saved_bytes_per_token_per_layer as saved_bytes_per_token_per_layer,
)
from lcx.cost.planner import (
    Candidate as Candidate,
    Recommendation as Recommendation,
    candidate_plans as candidate_plans,
    default_policies as default_policies,
    missing_in_lcx as missing_in_lcx,
    search as search,
    table as table,
)
