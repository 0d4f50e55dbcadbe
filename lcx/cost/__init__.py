"""Analytic cost ledger: FLOPs, memory, communication, time, hardware presets, plan search.

Pure arithmetic on plans and model configs: nothing here compiles or touches a device, except
the one-off CPU probes of :mod:`lcx.cost.probes` (:func:`cpu_peak_flops`). It reads
:mod:`lcx.sharding`, the model configs, and the strategy and kernel registries of
:mod:`lcx.attention`, whose classes price themselves (class methods that are plain arithmetic, no
JAX call). Nothing here renders: the words and tables of these numbers are :mod:`lcx.reports`.
"""

from lcx.cost.balance import causal_half_block_work, causal_imbalance
from lcx.cost.comm import CommBytes, comm_bytes, ring_overlap_min_block
from lcx.cost.flops import (
    RECOMPUTED_FORWARD_FRACTION,
    StepFlops,
    attention_pairs,
    crossover_tokens,
    forward_flops,
    linear_weights_per_token,
    prefill_flops_per_layer,
    recompute_flops,
    training_flops,
    visible_pairs,
)
from lcx.cost.hardware import Hardware, apply_hardware_flags, hardware_from_config, host_memory_available
from lcx.cost.ledger import (
    Estimate,
    estimate,
    host_transfer_bytes,
    mfu,
    step_metrics,
)
from lcx.cost.local import LocalStep, StepArgs, StepSizes
from lcx.cost.memory import (
    ActivationPolicy,
    MemoryBreakdown,
    activation_arrays,
    attention_working_bytes,
    kv_cache_bytes_per_device,
    kv_cache_bytes_per_token,
    memory_breakdown,
    param_arrays,
    saved_bytes_per_token_per_layer,
)
from lcx.cost.planner import Candidate, Recommendation, candidate_plans, default_policies, missing_in_lcx, search
from lcx.cost.probes import cpu_peak_flops
from lcx.cost.timing import ROOFLINE, CalibratedRange, StepTime, StepWork, TimeModel

__all__ = [
    "ROOFLINE",
    "CalibratedRange",
    "StepTime",
    "StepWork",
    "TimeModel",
    "activation_arrays",
    "ActivationPolicy",
    "apply_hardware_flags",
    "attention_pairs",
    "attention_working_bytes",
    "Candidate",
    "candidate_plans",
    "causal_half_block_work",
    "causal_imbalance",
    "comm_bytes",
    "CommBytes",
    "cpu_peak_flops",
    "crossover_tokens",
    "default_policies",
    "Estimate",
    "estimate",
    "forward_flops",
    "Hardware",
    "hardware_from_config",
    "host_memory_available",
    "host_transfer_bytes",
    "kv_cache_bytes_per_device",
    "kv_cache_bytes_per_token",
    "linear_weights_per_token",
    "LocalStep",
    "memory_breakdown",
    "MemoryBreakdown",
    "mfu",
    "missing_in_lcx",
    "param_arrays",
    "prefill_flops_per_layer",
    "Recommendation",
    "recompute_flops",
    "RECOMPUTED_FORWARD_FRACTION",
    "ring_overlap_min_block",
    "saved_bytes_per_token_per_layer",
    "search",
    "step_metrics",
    "StepArgs",
    "StepFlops",
    "StepSizes",
    "training_flops",
    "visible_pairs",
]
