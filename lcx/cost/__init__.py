"""Analytic cost ledger: FLOPs, memory, communication, hardware presets."""

from lcx.cost.flops import StepFlops as StepFlops, training_flops as training_flops, visible_pairs as visible_pairs
from lcx.cost.hardware import Hardware as Hardware, cpu_peak_flops as cpu_peak_flops, hardware_from_config as hardware_from_config
